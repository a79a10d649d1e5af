// The yardstick of the executor's overhead: the same model, batch and optimizer as a
// single-rank `tessera-train` step, written as the plain LibTorch loop a user would write
// (forward each micro-batch through encoder, projector and LLM, one backward, clip, AdamW) —
// no Program, no process groups. scripts/bench.sh exec compares the two.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/runtime.hpp"

namespace tessera::exec {

struct PlainStep {
  double loss = 0;
  double seconds = 0;  // batch drawing included, as in tessera-train's wall time
};

// REQUIRES: scenario validated with a single-rank plan; executor_support(model) empty; the
// model is a chain image encoder -> projector -> LLM (or an LLM alone).
std::vector<PlainStep> run_plain_loop(const Scenario& scenario, const TrainOptions& options,
                                      int64_t steps);

}  // namespace tessera::exec

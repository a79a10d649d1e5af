// Periodic folding of a pipeline's micro-batches. When every micro-batch holds samples of the
// same shapes (fixed-length data), a 1F1B pipeline's steady phase repeats the same ops every
// few micro-batches (a multiple of 1 for 1F1B, of the stage count for interleaved 1F1B, whose
// chunks take turns in groups of that many), each repetition one period of time after the last.
// simulate() then runs a shortened batch (warm-up, a few periods, cool-down), checks that the
// middle of its steady phase repeats, op by op, and extends its timeline to the full batch's: the
// full run is the short run with whole periods inserted at a cut time in that middle, so each op of
// the full Program takes its counterpart's times in the short run, moved by the periods inserted
// before it. Exact where the check passes (the simulator test compares every op against the full
// simulation); where it fails, simulate() runs the full Program.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shared/cost/evaluator.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/model/batch.hpp"

namespace tessera::sim {

// The shortened run that stands for a full one.
struct PeriodicShortening {
  ParallelPlan plan;              // the plan with fewer micro-batches
  WorkloadSpec workload;          // its global batch
  Batch batch;                    // the full batch's first samples
  int32_t microbatches = 0;       // per pipeline, in the short run
  int32_t full_microbatches = 0;  // per pipeline, in the full run
  // Micro-batches per period: a multiple of `period` (1 for 1F1B, the stage count for
  // interleaved 1F1B), up to `multiples` times it; the full run has a whole number of any of them
  // more than the short run.
  int32_t period = 1, multiples = 1;
};

// The short run for `full` (lowered from plan and batch), or nullopt where it cannot stand for
// it or would not save much: a placement other than homogeneous, a schedule other than 1F1B and
// interleaved 1F1B, samples of different shapes, or too few micro-batches.
std::optional<PeriodicShortening> periodic_shortening(const Scenario& scenario,
                                                      const ParallelPlan& plan, const Batch& batch,
                                                      const Program& full);

struct PeriodicExtension {
  Timeline timeline;                // the full Program's, when `failure` is empty
  double period_s = 0;              // the steady phase's period
  int32_t period_microbatches = 0;  // its micro-batches
  std::string failure;              // why the short run cannot stand for the full one
};

// The full Program's timeline from the short run's (`shortened` lowered from `how`). Fails, and
// says why, when the short run's ops do not match the full run's outside the inserted periods or
// its steady phase does not repeat around the cut.
PeriodicExtension extend_periodic(const Program& full, const Program& shortened,
                                  const Timeline& short_timeline, const PeriodicShortening& how);

}  // namespace tessera::sim

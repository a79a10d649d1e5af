// estimate(): draw a batch, lower the plan, evaluate it, and report what a user asks first —
// step time, throughput, TFLOP/s per device, MFU, bubble, peak memory, or why it does not fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/cost_model.hpp"
#include "shared/lower.hpp"
#include "shared/scenario.hpp"

namespace tessera {

struct Estimate {
  bool feasible = false;
  std::string reason;  // why not feasible ("rank 3 needs 91.2 GiB > 79.6 GiB: ...") or a lowering error
  std::vector<std::string> notes;
  double step_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;          // LLM sequence tokens
  double tflops_per_device = 0;     // model FLOPs (F+B+W, no recompute) per second per device
  double mfu = 0;                   // tflops_per_device / peak
  double bubble = 0;                // mean over ranks of idle / busy compute time (bubble + imbalance)
  int64_t peak_rank = 0;
  RankMemory peak_memory;
  double capacity_bytes = 0;
  int64_t ops = 0;
  double lower_s = 0, evaluate_s = 0;  // wall time of the two steps
};

// REQUIRES: scenario validated, with a plan.
Estimate estimate(const Scenario& scenario, const ParallelPlan& plan, int64_t iteration, const CostParams& params);
std::string format_estimate(const Estimate& e, const Scenario& scenario);

}  // namespace tessera

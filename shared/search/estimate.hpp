// estimate(): draw a batch, lower the plan, evaluate it, and report what a user asks first —
// step time, throughput, TFLOP/s per device, MFU, bubble, peak memory, or why it does not fit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/cost/metrics.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/dip_search.hpp"

namespace tessera {

// Why a prediction failed or was refused, for commands to choose their exit code.
enum class PlanFailure {
  kNone,
  kRefused,      // the lowering cannot express the plan (bad input)
  kOutOfMemory,  // a rank does not fit in memory: a prediction, not an error
  kFailed,       // it ran and failed: a deadlock, a crashed or timed-out simulation
};

struct Estimate {
  bool feasible = false;
  PlanFailure failure = PlanFailure::kNone;
  std::string
      reason;  // why not feasible ("rank 3 needs 91.2 GiB > 79.6 GiB: ...") or a lowering error
  std::vector<std::string> notes;
  IterationMetrics metrics;  // step_s == 0 when the iteration was not executed
  RankMemory peak_memory;    // metrics.memory[metrics.peak_rank]
  double capacity_bytes = 0;
  int64_t ops = 0;            // ops lowered
  int64_t ranks_lowered = 0;  // ranks whose ops were lowered: all, or a folded Program's classes
  double lower_s = 0, evaluate_s = 0;  // wall time of the two steps
};

// One iteration of a plan, lowered and evaluated: its stage split resolved with these costs,
// the iteration's batch drawn, DIP's schedule searched for it, the Program lowered with
// identical ranks folded, then executed by the evaluator (unless the lowering failed).
struct EvaluatedStep {
  Batch batch;
  std::optional<DipSearchResult> dip;
  Lowered lowered;
  Timeline timeline;
  double lower_s = 0, evaluate_s = 0;  // wall time of the two steps
};
// REQUIRES: as estimate(), which it serves; `progress` likewise.
EvaluatedStep evaluate_step(const Scenario& scenario, const ParallelPlan& plan, int64_t iteration,
                            const CostParams& params,
                            const std::function<void(const std::string&)>& progress = {});

// REQUIRES: scenario validated, with a plan. `progress`, when given, hears of a lowering that
// took a second or more before the evaluation starts (long work shows it is under way).
Estimate estimate(const Scenario& scenario, const ParallelPlan& plan, int64_t iteration,
                  const CostParams& params,
                  const std::function<void(const std::string&)>& progress = {});
std::string format_estimate(const Estimate& e, const Scenario& scenario);
// "lowered 12.5 M ops on 3072 ranks in 3.3 s" (or, folded, "lowered 0.26 M ops on 64 ranks
// standing for 3072 in 0.1 s"): a progress line of estimate and simulate.
std::string lowering_note(const Program& program, double seconds);
// The metrics block shared by `tessera estimate` and `tessera simulate`.
std::string format_metrics(const IterationMetrics& m, const ClusterSpec& cluster, DType dtype,
                           double capacity_bytes);
// Memory one rank may use: the device's, or this machine's share for cpu-local ranks.
double memory_capacity_bytes(const ClusterSpec& cluster, int64_t world);

}  // namespace tessera

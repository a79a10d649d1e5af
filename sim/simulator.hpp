// simulate(): the library entry of `tessera simulate`. Draws each iteration's batch, lowers the
// plan, rejects plans that do not fit in memory (reported, not simulated), and executes each
// iteration as a SimGrid simulation in its own forked child (one engine per process).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/cost/metrics.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/dip_search.hpp"
#include "shared/search/estimate.hpp"
#include "sim/simgrid/adapter.hpp"

namespace tessera::sim {

// How nested TP/CP/EP collectives run (RunOptions::nested_flows). kAuto: as timed activities,
// and an iteration where one of them may have shared links with another transfer
// (Timeline::nested_shared_links) again with ring flows — the flows' times either way.
enum class NestedMode : uint8_t { kAuto, kFlows, kTimed };

struct SimulateOptions {
  int64_t first_iteration = 0;
  int64_t iterations = 3;
  bool contention = true;
  NestedMode nested = NestedMode::kAuto;
  double timeout_s = 600;          // per simulated iteration
  std::string trace_dir;           // non-empty: write one Chrome trace per rank there
  std::optional<CostParams> cost;  // a calibration profile's; default_cost_params() when absent
  std::vector<Batch> batches;      // non-empty: simulate these (a recorded run's), not drawn ones
  // schedule dip, with `batches`: the schedule each ran (no search); empty: search per batch
  std::vector<DipSchedule> dip_schedules;
  bool keep_timelines = false;  // return every iteration's Program and Timeline
  // Fixed-shape micro-batches in a 1F1B pipeline: simulate a shortened batch and extend its
  // repeating steady phase to the full batch (periodic.hpp), where that is exact.
  bool periodic = true;
  // Hears, for a plan whose lowering takes a second or more, when each iteration is lowered and
  // when it has been simulated (long work shows it is under way).
  std::function<void(const std::string&)> progress;
};

struct SimulatedIteration {
  int64_t iteration = 0;
  IterationMetrics metrics;
  int64_t ops = 0;
  int64_t activities = 0;    // SimGrid activities (flows, sleeps, executions)
  int64_t folded_flows = 0;  // flows not simulated: copies of simulated ones stood for them
  int64_t actors = 0;        // actors that ran (one per twin class and stream)
  // Whether its nested collectives ran as ring flows (kFlows, or kAuto after a timed run found
  // them sharing links), and what a timed run found (Timeline::nested_shared_links): kNone
  // when none ran timed with contention on, or the program has no nested collectives.
  bool nested_flows = false;
  enum class NestedCheck : uint8_t { kNone, kAlone, kShared } nested_check = NestedCheck::kNone;
  // Periodic folding: the micro-batches per pipeline simulated, of how many, and the steady
  // phase's period; simulated_microbatches 0: the full batch ran. periodic_failure: why a short
  // run could not stand for the full one (the full batch ran instead).
  int32_t simulated_microbatches = 0, microbatches = 0, period_microbatches = 0;
  double period_s = 0;
  std::string periodic_failure;
  double wall_s = 0;  // wall time of the simulation (child process included)
  // The analytic estimate of the same Program (evaluate(): every transfer its α–β time, no
  // link shared), for the line that says how far contention moved the simulation from it.
  double estimate_step_s = 0;
  // schedule dip: this iteration's schedule search, started from the previous iteration's.
  std::optional<DipSearchResult> dip;
};

struct SimulationResult {
  bool feasible = false;
  PlanFailure failure = PlanFailure::kNone;
  std::string reason;  // infeasible (memory), or why a simulation failed
  std::vector<std::string> notes;
  std::vector<SimulatedIteration> iterations;
  double capacity_bytes = 0;
  double step_mean_s = 0, step_p50_s = 0, step_p95_s = 0;
  std::string trace_error;
  std::vector<Program> programs;  // SimulateOptions::keep_timelines
  std::vector<Timeline> timelines;
};

// REQUIRES: scenario validated, plan validated against it.
SimulationResult simulate(const Scenario& scenario, const ParallelPlan& plan,
                          const SimulateOptions& options);

}  // namespace tessera::sim

// tessera sweep: enumerate plans for each GPU count, rank them with the analytic estimate,
// simulate the best K on SimGrid in parallel child processes, and stream every result to
// DIR/results.jsonl as it finishes (so --resume loses nothing), then write results.csv and
// summary.json.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shared/layout/scenario.hpp"
#include "shared/layout/scenario_set.hpp"
#include "shared/layout/sweep_rows.hpp"
#include "shared/search/plan_search.hpp"
#include "shared/search/step_picture.hpp"
#include "sim/simulator.hpp"

namespace tessera::sim {

// The grid of --set values: every combination, as {path: value} objects (one empty point when
// there are no axes).
std::vector<Json> grid_points(const std::vector<SetAxis>& axes);

struct SweepOptions {
  std::vector<SetAxis> sets;
  std::vector<int64_t> gpus;          // Default: the search space's, else the cluster's devices
  std::vector<Placement> placements;  // Default: the search space's
  // Sequence parallelism for plans with TP > 1. Default: the search space's.
  std::vector<bool> sequence_parallel;
  int64_t top_k = -1;  // Default: the search space's top_k
  // Plans the second stage refines (SearchSpace::refine.top); -1: the search space's. A sharded
  // run has no second stage: it needs the whole first ranking.
  int64_t refine_top = -1;
  int jobs = 2;
  std::string out_dir;
  bool resume = false;
  int64_t iterations = 1;  // simulated iterations per plan
  // Batches the analytic ranking averages over; > 1 also adds the encoders' mean work share
  // of the devices to the non-colocated candidates (Entrain's static layout).
  int64_t profile_batches = 1;
  NestedMode nested = NestedMode::kAuto;  // of the simulated plans
  double timeout_s = 600;                 // per simulated plan
  // --shard i/n: this run estimates and simulates only the valid candidates whose key hashes to
  // i-1 modulo n (shard 1 also counts the considered and rejected plans).
  int64_t shard_index = 1, shard_count = 1;
  std::string scenario_file;       // recorded in summary.json for `tessera merge`
  std::optional<CostParams> cost;  // a calibration profile's (default: the analytic defaults)
};

// One estimated candidate, for the report's heat map.
struct EstimatedPlan {
  Json point;
  int64_t gpus = 0;
  Placement placement = Placement::kHomogeneous;
  int64_t llm_tp = 1, llm_pp = 1;
  double tokens_per_s = 0;
};

// A pipelined plan with its frozen-aware stage split against the same plan split uniformly
// (Cornstarch, docs/ALGORITHMS.md §1), by the analytic estimate.
struct SplitGain {
  int64_t gpus = 0;
  ParallelPlan frozen_aware;  // its stage_layers filled
  double frozen_aware_s = 0, uniform_s = 0;
};

// The search's second stage: a costlier technique tried on a plan of the first ranking
// (SearchSpace::refine), by the analytic estimate.
struct TechniqueGain {
  Json point;
  int64_t gpus = 0;
  ParallelPlan base;
  double base_s = 0;
  std::string technique;  // "entrain", "dip+sorted", "cp zigzag", ...
  double variant_s = 0;
};

struct SweepResult {
  std::vector<SweepRow> rows;  // every simulated plan, grouped by grid point, best first
  std::map<std::string, int64_t> rejected;
  int64_t considered = 0, valid = 0, ranked = 0;
  std::vector<EstimatedPlan> estimated;  // every plan that was estimated
  std::vector<SplitGain> split_gains;    // the best pipelined plans, per GPU count and point
  // The second stage: plans refined, variants estimated (and how many did not fit or were
  // refused), what each technique did to its base plan.
  int64_t refined_bases = 0, refined = 0, refined_rejected = 0;
  std::vector<TechniqueGain> technique_gains;
  // --profile-batches > 1: the encoders' mean share of the work, per grid point
  std::vector<std::pair<Json, double>> encoder_shares;
  int64_t top_k = 0;
  // Per grid point and GPU count where the space alone found nothing: what the sweep offered
  // beyond it (encoder context parallelism), and what the leanest plan would need.
  std::vector<std::string> notes;
  // Each family's best simulated plan, one step op by op (the report's timelines), by row key;
  // empty in merged sweeps.
  std::map<std::string, StepPicture> pictures;
  std::string out_dir;
  double enumerate_s = 0, estimate_s = 0, refine_s = 0, simulate_s = 0;  // wall time per phase
  int64_t simulated = 0;  // simulations run by this invocation
};

// Writes results.jsonl (whole), results.csv, summary.json and report.html for `result`.
void write_sweep_outputs(const SweepResult& result, const Scenario& scenario,
                         const std::string& scenario_file);

// Combines the summary.json of shard runs into the ranking an unsharded run gives, written to
// `out_dir`. Returns an error message naming the file, or "".
std::string merge_sweeps(const std::vector<std::string>& dirs, const std::string& out_dir,
                         SweepResult& merged, std::optional<Scenario>& scenario);

// A sweep's progress, phase by phase: `done` of `total` items of `phase` ("enumerated",
// "estimated", "simulated") for `what` (the grid point and GPU count, or ""), the last item
// finished described by `last` (may be empty), `failed` when it failed. Called from one thread
// at a time.
using SweepProgress =
    std::function<void(const std::string& phase, const std::string& what, std::size_t done,
                       std::size_t total, const std::string& last, bool failed)>;

// REQUIRES: scenario validated; every grid point valid (check with scenario_at first).
SweepResult run_sweep(const Scenario& scenario, const SweepOptions& options,
                      const SweepProgress& progress);

// "llm t4 p2 d8 | vision t1 d64" — the layout of a plan, module by module.
std::string describe_layout(const ParallelPlan& plan, const ModelSpec& model);
std::string format_sweep(const SweepResult& result, const Scenario& scenario, std::size_t rows);

}  // namespace tessera::sim

// Calibration (docs/ALGORITHMS.md §9): fits the cost model's parameters to
// recorded runs. Every traced op is measured as the cost model sees it — compute on a core or
// device of its own (on a cpu-local machine the share of the cores it got while other ranks
// computed is taken out), a collective from its last member's arrival, a message from its send —
// and each class is fitted with weighted least squares (Eigen) to fixed cost + size · rate.
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/profile.hpp"
#include "shared/records/run_record.hpp"

namespace tessera {

// The class of an op in the cost model: what one fit covers.
struct OpClass {
  enum class Type : uint8_t { kCompute, kCollective, kP2p, kOptimizer };
  Type type = Type::kCompute;
  ModuleRole role = ModuleRole::kLlm;  // compute
  Phase phase = Phase::kF;             // compute; B stands for a B and the W fused into it
  SizeClass size = SizeClass::kSmall;  // compute
  CollectiveKind kind = CollectiveKind::kAllReduce;  // collective
  int64_t group_size = 0;                            // collective
  bool local = true;                                 // collective, p2p
  auto operator<=>(const OpClass&) const = default;
};
std::string class_name(const OpClass& c);  // "llm B small", "allreduce x2 intra_node", ...

struct OpMeasure {
  OpClass cls;
  std::string op;           // op name (with the rank), for medians over iterations
  double x = 0;             // FLOPs (compute) or bytes
  double token_layers = 0;  // compute: tokens · layers
  double logits = 0;        // compute: vocabulary logits
  double calls = 0;         // compute: collective calls inside it
  double layers = 0;        // compute: transformer layers
  double seconds = 0;       // as the cost model would charge it (dedicated core, no waiting)
  double wall_s = 0;        // as the trace shows it (the enclosing op's slice for compute)
  double overlap = 0;       // compute: fraction of its time its rank ran a collective alongside
};

// The ops of one iteration measured on `timeline` (a trace's or a simulation's).
std::vector<OpMeasure> measure_ops(const Program& program, const Timeline& timeline,
                                   const ModelSpec& model, const ClusterSpec& cluster);

struct CalibrationRun {
  RunRecord run;
  std::vector<TracedIteration> traced;
};

// The run folder `dir` (tessera-train --out) with its traces, which a run without them lacks
// unless `traces_required`; nullopt after recording its problems in `diag`.
std::optional<CalibrationRun> load_calibration_run(const std::string& dir, bool traces_required,
                                                   Diagnostics& diag);

struct CalibrateOptions {
  int64_t warmup_iterations = 1;        // the first traced iterations of every run are left out
  const ClusterSpec* target = nullptr;  // warn where fits would be extrapolated onto it
};

// REQUIRES: runs non-empty, all recorded on one kind of machine (the caller checks).
Profile calibrate(const std::vector<CalibrationRun>& runs, const CalibrateOptions& options);

// Where predicting `program` with `params` leaves the measured ground: classes no fit covers
// (analytic defaults), sizes beyond twice the measured range, other group sizes. One line per
// class; empty when every op is covered or `params` has no fits.
std::vector<std::string> profile_coverage(const CostParams& params, const Program& program,
                                          const ModelSpec& model, const ClusterSpec& cluster);

// One line per fitted parameter set with its samples, residual and range, then the warnings.
std::string format_profile(const Profile& profile);

}  // namespace tessera

// Calibration (docs/ALGORITHMS.md §9): fits the cost model's parameters to recorded runs. Every
// traced op is measured as the cost model sees it (op_measure.hpp), and each class is fitted by
// least squares with non-negative coefficients (Eigen) to fixed cost + size · rate, compute with
// its further terms and its host floor.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/cost/profile.hpp"
#include "shared/records/op_measure.hpp"
#include "shared/records/run_record.hpp"

namespace tessera {

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

}  // namespace tessera

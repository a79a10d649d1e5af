// replay(): calibrated trace replay (`tessera replay`). Lowers a recorded run's plan with the
// samples each iteration really trained on, simulates every iteration on the recorded machine
// with a cost model (a calibration profile's, usually) and compares with what was measured: per
// iteration step time, and per op class the time the traced iterations spent in it.
#pragma once

#include <string>
#include <vector>

#include "shared/base/json_reader.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/records/run_record.hpp"

namespace tessera::sim {

struct ReplayOptions {
  int64_t warmup_iterations = 1;  // the run's first iterations: shown, left out of the errors
  std::string trace_dir;          // non-empty: the simulated traces of the traced iterations
  // Non-empty: an HTML page here with a traced warm iteration's measured and predicted steps op
  // by op, on the same lanes and time axis.
  std::string html_file;
  double timeout_s = 600;  // per simulated iteration
};

struct ReplayIteration {
  int64_t iteration = 0;
  double measured_s = 0, predicted_s = 0;
  bool warmup = false;
  double error_pct() const { return 100 * (predicted_s - measured_s) / measured_s; }
};

// Seconds per iteration an op class took (summed over ranks), mean over the traced warm
// iterations.
struct ReplayClass {
  std::string name;
  double measured_s = 0, predicted_s = 0;
};

struct ReplayResult {
  std::string error;  // the simulation failed
  std::vector<std::string> notes;
  std::vector<ReplayIteration> iterations;
  double mean_abs_error_pct = 0, max_abs_error_pct = 0, mean_error_pct = 0;  // warm iterations
  // Where every warm iteration trained on the same samples: the least mean |error| any one step
  // time reaches against the measured steps (the run's own noise, which no prediction of a
  // steady run beats); negative otherwise.
  double noise_floor_pct = -1;
  std::vector<ReplayClass> classes;  // empty when the run has no traced warm iteration
  std::string trace_error;
  std::string html_error;  // the page could not be written (or the run has no traced iteration)
};

// REQUIRES: `traced` loaded from `run` (may be empty: no per-class comparison).
ReplayResult replay(const RunRecord& run, const std::vector<TracedIteration>& traced,
                    const CostParams& cost, const ReplayOptions& options);

std::string format_replay(const ReplayResult& r);
Json replay_to_json(const ReplayResult& r);

}  // namespace tessera::sim

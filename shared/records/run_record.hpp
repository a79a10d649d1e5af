// A recorded run, as tessera-train writes it (run.json, trace/rank<r>.json): the scenario and
// plan it ran, the machine, every iteration's samples and measured step time, and for the
// traced iterations every op's measured start and finish, joined to the Program lowered again
// from the recorded samples by op id. Calibration fits to these; replay simulates them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/cost/evaluator.hpp"
#include "shared/layout/dip_schedule.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/model/batch.hpp"
#include "shared/program/program.hpp"

namespace tessera {

struct RecordedIteration {
  Batch batch;                     // the samples the iteration trained on
  double step_s = 0;               // measured: the slowest rank's ops
  std::optional<DipSchedule> dip;  // schedule dip: the schedule it ran
};

struct RunRecord {
  std::string dir;
  Scenario scenario;  // plan set; a cpu-local cluster gets the recorded machine's cores
  int64_t cores = 0;  // the machine's
  std::string cpu;
  std::vector<RecordedIteration> iterations;
};

// A traced iteration: the Program lowered from the recorded samples and what was measured.
struct TracedIteration {
  Program program;
  Timeline timeline;  // op times relative to the iteration's start, nested collectives included
};

// Reads DIR/run.json. Problems (missing file, bad JSON, a scenario that no longer validates)
// go to `diag` naming the file and JSON path.
std::optional<RunRecord> load_run(const std::string& dir, Diagnostics& diag);

// Reads DIR/trace/rank<r>.json for every rank and joins each slice to its op by op id. A trace
// whose ids or names do not match the recorded plan, or that misses ops, is refused.
std::optional<std::vector<TracedIteration>> load_traces(const RunRecord& run, Diagnostics& diag);

// The Program of a recorded iteration. REQUIRES: the record loaded by load_run.
Program lower_recorded(const RunRecord& run, const RecordedIteration& iteration);

}  // namespace tessera

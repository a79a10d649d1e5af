// The rows of a sweep's results.jsonl: one simulated (or failed) plan each. Written by `tessera
// sweep`, read back by --resume, `tessera merge`, and --plan results.jsonl#R in every command
// (the executor's too), so the reader lives with the IR.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/base/json_reader.hpp"
#include "shared/layout/parallel_plan.hpp"

namespace tessera {

struct SweepRow {
  std::string key;
  Json point = Json::object();  // the --set values of this row
  int64_t gpus = 0;
  int64_t global_batch = 0;
  ParallelPlan plan;
  double estimate_step_s = 0;
  bool ok = false;
  std::string failure;  // why the simulation failed
  double step_s = 0, tokens_per_s = 0, tflops_per_device = 0, mfu = 0, peak_memory_bytes = 0;
  // The share of the step a rank computes nothing (waiting in the pipeline, on a dependency or
  // on exposed communication), mean over ranks: 0 to 1.
  double idle_share = 0;
  double compute_s = 0;           // mean over ranks of compute-stream busy time per step
  double compute_max_s = 0;       // the busiest rank's compute-stream busy time per step
  double exposed_comm_s = 0;      // mean over ranks of compute time lost waiting on communication
  double exposed_boundary_s = 0;  // the part of exposed_comm_s spent on module-boundary transfers
  // The LLM's stage-time variability between micro-batches (MicrobatchVariability), mean over
  // the simulated iterations
  double llm_microbatch_cv = 0, llm_microbatch_max_over_mean = 0;
};

Json row_to_json(const SweepRow& row);
// False when `j` is not a row (fields missing or of the wrong type).
bool row_from_json(const Json& j, SweepRow& row);
// Grouped by grid point; within one, successful rows by simulated step time, then failures;
// ties by key.
void sort_rows(std::vector<SweepRow>& rows);

// The rows of a results.jsonl, best first (as a finished sweep orders them). Unreadable lines
// (an interrupted write) are skipped.
std::vector<SweepRow> load_sweep_rows(const std::string& jsonl);

}  // namespace tessera

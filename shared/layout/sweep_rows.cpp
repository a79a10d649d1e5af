#include "shared/layout/sweep_rows.hpp"

#include <algorithm>
#include <fstream>
#include <set>

namespace tessera {

Json row_to_json(const SweepRow& r) {
  return Json{{"key", r.key},
              {"point", r.point},
              {"gpus", r.gpus},
              {"global_batch", r.global_batch},
              {"plan", to_json(r.plan)},
              {"estimate_step_s", r.estimate_step_s},
              {"ok", r.ok},
              {"failure", r.failure},
              {"step_s", r.step_s},
              {"tokens_per_s", r.tokens_per_s},
              {"tflops_per_device", r.tflops_per_device},
              {"mfu", r.mfu},
              {"idle_share", r.idle_share},
              {"peak_memory_bytes", r.peak_memory_bytes},
              {"compute_s", r.compute_s},
              {"compute_max_s", r.compute_max_s},
              {"exposed_comm_s", r.exposed_comm_s},
              {"exposed_boundary_s", r.exposed_boundary_s},
              {"llm_microbatch_cv", r.llm_microbatch_cv},
              {"llm_microbatch_max_over_mean", r.llm_microbatch_max_over_mean}};
}

bool row_from_json(const Json& j, SweepRow& r) {
  try {
    r.key = j.at("key").get<std::string>();
    r.point = j.value("point", Json::object());
    r.gpus = j.at("gpus").get<int64_t>();
    r.global_batch = j.at("global_batch").get<int64_t>();
    Diagnostics diag;
    r.plan = read_plan(j.at("plan"), "", "", diag);
    if (!diag.ok()) return false;
    r.estimate_step_s = j.at("estimate_step_s").get<double>();
    r.ok = j.at("ok").get<bool>();
    r.failure = j.at("failure").get<std::string>();
    for (const auto& [field, name] :
         {std::pair{&r.step_s, "step_s"}, std::pair{&r.tokens_per_s, "tokens_per_s"},
          std::pair{&r.tflops_per_device, "tflops_per_device"}, std::pair{&r.mfu, "mfu"},
          std::pair{&r.idle_share, "idle_share"},
          std::pair{&r.peak_memory_bytes, "peak_memory_bytes"},
          std::pair{&r.compute_s, "compute_s"}, std::pair{&r.compute_max_s, "compute_max_s"},
          std::pair{&r.exposed_comm_s, "exposed_comm_s"},
          std::pair{&r.exposed_boundary_s, "exposed_boundary_s"},
          std::pair{&r.llm_microbatch_cv, "llm_microbatch_cv"},
          std::pair{&r.llm_microbatch_max_over_mean, "llm_microbatch_max_over_mean"}})
      *field = j.value(name, 0.0);  // fields added later read as 0 in older files
    // Older files kept idle over busy time, b ("bubble"): the idle share is b / (1 + b).
    if (!j.contains("idle_share") && j.contains("bubble")) {
      const double b = j.at("bubble").get<double>();
      r.idle_share = b / (1 + b);
    }
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

// Grouped by grid point; within one, successful rows by simulated step time, then failures;
// ties by key.
void sort_rows(std::vector<SweepRow>& rows) {
  std::sort(rows.begin(), rows.end(), [](const SweepRow& a, const SweepRow& b) {
    const std::string pa = a.point.dump(), pb = b.point.dump();
    if (pa != pb) return pa < pb;
    if (a.ok != b.ok) return a.ok;
    if (a.ok && a.step_s != b.step_s) return a.step_s < b.step_s;
    return a.key < b.key;
  });
}

std::vector<SweepRow> load_sweep_rows(const std::string& jsonl) {
  std::vector<SweepRow> rows;
  std::set<std::string> seen;
  std::ifstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) {
    Json j;
    try {
      j = Json::parse(line);
    } catch (const Json::exception&) {
      continue;  // a line cut short by an interruption
    }
    SweepRow row;
    if (row_from_json(j, row) && seen.insert(row.key).second) rows.push_back(row);
  }
  sort_rows(rows);
  return rows;
}

}  // namespace tessera

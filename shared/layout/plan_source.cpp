#include "shared/layout/plan_source.hpp"

#include <filesystem>

#include "shared/layout/sweep_rows.hpp"

namespace tessera {

std::optional<Scenario> load_scenario_with_plan(const std::string& file,
                                                const std::string& plan_spec, Diagnostics& diag) {
  auto scenario = load_scenario(file, diag);
  if (!scenario) return std::nullopt;
  return with_plan(std::move(*scenario), plan_spec, diag);
}

std::optional<Scenario> with_plan(Scenario loaded, const std::string& plan_spec, Diagnostics& diag,
                                  bool validate) {
  std::optional<Scenario> scenario = std::move(loaded);
  const std::string& file = scenario->file;
  if (!plan_spec.empty()) {
    std::string plan_file = plan_spec;
    const std::size_t before = diag.errors().size();
    const std::size_t hash = plan_file.rfind('#');
    if (hash != std::string::npos) {
      // results.jsonl#R: the plan ranked R by a sweep.
      const std::string rank_text = plan_file.substr(hash + 1);
      plan_file = plan_file.substr(0, hash);
      int64_t rank = 0;
      try {
        rank = std::stoll(rank_text);
      } catch (const std::exception&) {
      }
      if (!std::filesystem::is_regular_file(plan_file)) {
        diag.error(plan_file, "", "file not found");
        return std::nullopt;
      }
      const std::vector<SweepRow> rows = load_sweep_rows(plan_file);
      if (rank < 1 || rank > static_cast<int64_t>(rows.size()) ||
          !rows[static_cast<std::size_t>(rank - 1)].ok) {
        diag.error(plan_file, "#" + rank_text,
                   "no successful row ranked " + rank_text + " (the file has " +
                       std::to_string(rows.size()) + " rows)");
        return std::nullopt;
      }
      scenario->plan = rows[static_cast<std::size_t>(rank - 1)].plan;
    } else {
      const auto json = read_json_file(plan_file, diag);
      if (!json) return std::nullopt;
      scenario->plan = read_plan(*json, plan_file, "", diag);
    }
    scenario->plan_ref = plan_file;
    if (diag.errors().size() == before && validate)
      validate_plan(*scenario->plan, scenario->model, scenario->workload, scenario->cluster,
                    plan_file, "", diag);
    if (diag.errors().size() != before) return std::nullopt;
  }
  if (!scenario->plan) {
    diag.error(file, "plan", "no plan: give one in the scenario or with --plan");
    return std::nullopt;
  }
  return scenario;
}

}  // namespace tessera

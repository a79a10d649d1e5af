// `tessera stages`: per-module stage counts under a device budget, frozen-aware against
// freeze-unaware (Cornstarch), estimated and optionally simulated on the real model.
#include <iomanip>
#include <ostream>
#include <sstream>

#include "shared/base/json_reader.hpp"
#include "shared/search/plan_search.hpp"
#include "shared/search/stage_allocation.hpp"
#include "shared/search/stage_split.hpp"
#include "sim/command_line.hpp"
#include "sim/simulator.hpp"

namespace tessera::sim {

namespace {

std::string seconds(double s) {
  std::ostringstream o;
  o << std::setprecision(4) << s << " s";
  return o.str();
}

std::string ratio(double slow, double fast) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3) << slow / fast << "x";
  return o.str();
}

}  // namespace

int run_stages(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera stages",
      "Shares a device budget's pipeline stages among the encoders and the LLM (non-colocated, "
      "every stage tp x dp devices) the way Cornstarch's frozen-aware planner does — every split "
      "that fits in memory, ranked by estimated step with frozen-aware stage boundaries — and "
      "the way a freeze-unaware planner does (ranked as if nothing were frozen, equal layers per "
      "stage), then prices both choices on the real model.");
  add_profile_option(options);
  add_set_option(options, "change a scenario field first: json.path=value (repeatable)");
  options.add_options()("gpus", "devices in the budget (default: the scenario cluster's)",
                        cxxopts::value<int64_t>())("tp", "tensor parallel size of every stage",
                                                   cxxopts::value<int64_t>()->default_value("1"))(
      "dp", "data-parallel replicas of every module",
      cxxopts::value<int64_t>()->default_value("1"))("micro-batch-size", "samples per micro-batch",
                                                     cxxopts::value<int64_t>()->default_value("1"))(
      "top", "frozen-aware allocations listed", cxxopts::value<int64_t>()->default_value("5"))(
      "simulate", "also simulate both chosen plans on SimGrid")(
      "iterations", "iterations to simulate", cxxopts::value<int64_t>()->default_value("1"))(
      "o,out", "write the frozen-aware plan here (plan JSON)", cxxopts::value<std::string>())(
      "baseline-out", "write the freeze-unaware plan here (plan JSON)",
      cxxopts::value<std::string>());
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  StageBudget budget;
  budget.tp = (*result)["tp"].as<int64_t>();
  budget.dp = (*result)["dp"].as<int64_t>();
  budget.micro_batch_size = (*result)["micro-batch-size"].as<int64_t>();
  const int64_t top = (*result)["top"].as<int64_t>();
  const int64_t iterations = (*result)["iterations"].as<int64_t>();
  if (top < 0 || iterations < 1) {
    err << options.program() << ": --top >= 0, --iterations >= 1\n";
    return kBadInput;
  }
  Diagnostics diag;
  const std::optional<Json> point = set_point(*result, diag);
  if (!point) return report_problems(diag, err);
  const auto loaded = load_scenario(file, diag);
  if (!loaded) return report_problems(diag, err);
  const auto scenario = scenario_at(*loaded, *point, diag);
  if (!scenario) return report_problems(diag, err);
  budget.gpus = result->count("gpus")
                    ? (*result)["gpus"].as<int64_t>()
                    : scenario->cluster.nodes * scenario->cluster.devices_per_node;
  const std::optional<CostParams> profile = profile_option(*result, scenario->cluster, diag);
  if (!diag.ok()) return report_problems(diag, err);
  const CostParams cost = profile ? *profile : default_cost_params(scenario->cluster);
  const StageAllocation a = allocate_stages(*scenario, budget, cost, diag);
  if (!diag.ok()) return report_problems(diag, err);

  out << "scenario " << scenario->name << ": " << budget.gpus << " devices = " << a.stages
      << " stages of tp " << budget.tp << " x dp " << budget.dp
      << " (non-colocated with graph 1F1B; homogeneous with 1F1B where the encoders share the "
         "LLM's first stage)\n";
  for (const auto& [reason, count] : a.rejected)
    out << "rejected " << count << " (" << reason << ")\n";
  if (a.frozen_aware.empty() || a.freeze_unaware.empty()) {
    out << "no stage split of this budget fits in memory\n";
    return 1;
  }
  out << "frozen-aware allocations, best first (estimate):\n";
  for (int64_t i = 0; i < std::min<int64_t>(top, static_cast<int64_t>(a.frozen_aware.size()));
       ++i) {
    const StageCountPlan& p = a.frozen_aware[static_cast<std::size_t>(i)];
    out << "  " << std::left << std::setw(34) << stage_counts_text(p.stages) << std::right
        << std::setw(10) << seconds(p.estimate.metrics.step_s) << "   layers "
        << stage_layers_text(p.plan, scenario->model) << "\n";
  }
  const StageCountPlan& aware = a.frozen_aware.front();
  const StageCountPlan& unaware = a.freeze_unaware.front();
  // The frozen-aware boundaries on the freeze-unaware counts: how much of the gain is the split.
  const StageCountPlan* split_only = nullptr;
  for (const StageCountPlan& p : a.frozen_aware)
    if (p.stages == unaware.stages) split_only = &p;

  out << "frozen-aware choice     " << std::left << std::setw(34) << stage_counts_text(aware.stages)
      << std::right << " estimate " << seconds(aware.estimate.metrics.step_s) << "\n";
  out << "freeze-unaware choice   " << std::left << std::setw(34)
      << stage_counts_text(unaware.stages) << std::right << " estimate "
      << seconds(unaware.estimate.metrics.step_s) << " (it believes " << seconds(unaware.believed_s)
      << ")\n";
  if (split_only != nullptr)
    out << "frozen-aware boundaries on the freeze-unaware counts: estimate "
        << seconds(split_only->estimate.metrics.step_s) << "\n";
  out << "estimated gain: " << ratio(unaware.estimate.metrics.step_s, aware.estimate.metrics.step_s)
      << " throughput (freeze-unaware " << seconds(unaware.estimate.metrics.step_s)
      << ", frozen-aware " << seconds(aware.estimate.metrics.step_s) << ")\n";

  if (a.llm_centric)
    out << "LLM-centric (homogeneous tp " << budget.tp << " x pp " << a.stages
        << ", encoders in the first stage, equal layers): estimate "
        << seconds(a.llm_centric->estimate.metrics.step_s) << ", frozen-aware gain over it "
        << ratio(a.llm_centric->estimate.metrics.step_s, aware.estimate.metrics.step_s) << "\n";
  else
    out << "LLM-centric (homogeneous tp " << budget.tp << " x pp " << a.stages
        << "): not possible here: " << a.llm_centric_reason << "\n";

  int exit_code = kOk;
  if (result->count("simulate")) {
    SimulateOptions sim;
    sim.iterations = iterations;
    sim.cost = profile;
    Scenario sized = *scenario;
    sized.cluster = cluster_with_devices(scenario->cluster, budget.gpus);
    const SimulationResult ua = simulate(sized, unaware.plan, sim);
    const SimulationResult fa = simulate(sized, aware.plan, sim);
    if (!ua.feasible || !fa.feasible) {
      err << options.program() << ": simulation failed: " << (ua.feasible ? fa.reason : ua.reason)
          << "\n";
      exit_code = 1;
    } else {
      out << "simulated gain: " << ratio(ua.step_mean_s, fa.step_mean_s)
          << " throughput (freeze-unaware " << seconds(ua.step_mean_s) << ", frozen-aware "
          << seconds(fa.step_mean_s) << ")\n";
      if (a.llm_centric) {
        const SimulationResult lc = simulate(sized, a.llm_centric->plan, sim);
        if (lc.feasible)
          out << "simulated LLM-centric: " << seconds(lc.step_mean_s)
              << ", frozen-aware gain over it " << ratio(lc.step_mean_s, fa.step_mean_s) << "\n";
      }
    }
  }
  for (const auto& [flag, plan] : {std::pair<const char*, const ParallelPlan*>{"out", &aware.plan},
                                   {"baseline-out", &unaware.plan}}) {
    if (!result->count(flag)) continue;
    const std::string path = (*result)[flag].as<std::string>();
    const std::string problem = write_file_atomically(path, to_json(*plan).dump(2) + "\n");
    if (!problem.empty()) {
      err << options.program() << ": " << problem << "\n";
      return 1;
    }
    out << (plan == &aware.plan ? "frozen-aware" : "freeze-unaware") << " plan: " << path << "\n";
  }
  return exit_code;
}

}  // namespace tessera::sim

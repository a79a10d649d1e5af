#include "sim/commands.hpp"

#include <unistd.h>
#include <chrono>
#include <filesystem>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>

#include <cxxopts.hpp>

#include "shared/layout/plan_source.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/model/model_math.hpp"
#include "shared/search/estimate.hpp"
#include "shared/search/scenario_report.hpp"
#include "shared/search/stage_split.hpp"
#include "shared/spec/hf_import.hpp"
#include "sim/command_line.hpp"
#include "sim/progress.hpp"
#include "sim/simulation_report.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep.hpp"

namespace tessera::sim {

namespace {

// "stage layers     llm 3,5 (frozen_aware)" for a pipelined plan, else "". Runs of stages
// with the same count are compressed ("llm 1,2×62,1").
std::string stage_layers_line(const ParallelPlan& plan, const ModelSpec& model, bool profile) {
  bool pipelined = plan.layout.pp * plan.layout.vpp > 1;
  for (const auto& [name, l] : plan.modules) pipelined = pipelined || l.pp * l.vpp > 1;
  if (!pipelined) return "";
  // With nothing frozen the frozen-aware split is a plain cost-balanced one.
  const bool frozen = std::any_of(model.modules.begin(), model.modules.end(),
                                  [](const ModuleSpec& m) { return m.frozen; });
  const std::string split = plan.stage_split == StageSplit::kFrozenAware && !frozen
                                ? "cost-balanced; nothing is frozen"
                                : enum_name(plan.stage_split, kStageSplits);
  return "stage layers     " + stage_layers_text(plan, model) + " (" + split +
         (profile && plan.stage_split == StageSplit::kFrozenAware ? ", priced with the profile"
                                                                  : "") +
         (plan.schedule == Schedule::kDip ? "; DIP's search moves layers per batch from there"
                                          : "") +
         ")\n";
}

}  // namespace

int run_validate(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera validate",
      "Checks a scenario file (and the model, workload, cluster and plan files "
      "it names) and reports every problem with its file and JSON path.");
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  Diagnostics diag;
  const auto scenario = load_scenario(file, diag);
  if (!scenario) return report_problems(diag, err);
  out << "ok: " << scenario->name << ": model " << scenario->model.name << " ("
      << human_count(static_cast<double>(model_parameters(scenario->model)))
      << " parameters), cluster " << scenario->cluster.name;
  if (scenario->plan)
    out << ", plan " << enum_name(scenario->plan->placement, kPlacements) << " on "
        << world_size(*scenario->plan, scenario->model) << " ranks";
  out << "\n";
  return kOk;
}

int run_show(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options("tessera show",
                           "Summarises a scenario: modules with parameters and FLOPs per token, "
                           "token statistics over drawn batches, the cluster, the plan and its "
                           "rank groups.");
  options.add_options()("batches", "batches drawn for token statistics",
                        cxxopts::value<int64_t>()->default_value("4"))(
      "groups", "rank groups listed per kind", cxxopts::value<int64_t>()->default_value("4"));
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  ReportOptions report;
  report.batches = (*result)["batches"].as<int64_t>();
  report.max_groups = (*result)["groups"].as<int64_t>();
  if (report.batches < 1 || report.max_groups < 1) {
    err << options.program() << ": --batches and --groups must be >= 1\n";
    return kBadInput;
  }
  Diagnostics diag;
  const auto scenario = load_scenario(file, diag);
  if (!scenario) return report_problems(diag, err);
  out << scenario_report(*scenario, report);
  return kOk;
}

static void print_import_notes(const HfImportNotes& notes, std::ostream& out) {
  for (const std::string& part : notes.left_out) out << "left out: " << part << "\n";
  for (const std::string& keys : notes.unused) out << "not used: " << keys << "\n";
}

int run_import_hf(const Args& args, std::ostream& out, std::ostream& err) {
  std::string supported;
  for (const std::string& t : supported_hf_model_types())
    supported += (supported.empty() ? "" : ", ") + t;
  cxxopts::Options options("tessera import-hf",
                           "Converts a HuggingFace config.json into a Tessera model file. "
                           "Supported model_type: " +
                               supported + ".");
  options.add_options()("freeze", "modules to mark frozen, comma separated (vision,llm,...)",
                        cxxopts::value<std::vector<std::string>>())(
      "name",
      "model name (default: _name_or_path, else the file name, or its folder for a config.json)",
      cxxopts::value<std::string>())("o,output",
                                     "write the model here (atomically) instead of standard output",
                                     cxxopts::value<std::string>());
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "config.json", "<config.json>", args, out, err, file, code);
  if (!result) return code;
  HfImportOptions import;
  if (result->count("freeze")) import.freeze = (*result)["freeze"].as<std::vector<std::string>>();
  Diagnostics diag;
  const auto json = read_json_file(file, diag);
  if (!json) return report_problems(diag, err);
  HfImportNotes notes;
  auto model = import_hf_config(*json, file, import, diag, &notes);
  if (!model) return report_problems(diag, err);
  if (result->count("name")) model->name = (*result)["name"].as<std::string>();
  const std::string text = to_json(*model).dump(2) + "\n";
  if (!result->count("output")) {
    print_import_notes(notes, err);
    out << text;
    return kOk;
  }
  const std::string target = (*result)["output"].as<std::string>();
  const std::string problem = write_file_atomically(target, text);
  if (!problem.empty()) {
    err << options.program() << ": " << problem << "\n";
    return 1;
  }
  out << "wrote " << target << "\n" << model_report(*model);
  print_import_notes(notes, out);
  return kOk;
}

int run_lower(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera lower",
      "Prints the per-rank op lists (the Program) of one training iteration: what the "
      "simulator predicts and the executor runs. A dry run.");
  add_plan_option(options);
  add_set_option(options, "change a scenario field first: json.path=value (repeatable)");
  add_iteration_option(options);
  options.add_options()("rank", "only this rank (default: all)",
                        cxxopts::value<int>()->default_value("-1"))("json",
                                                                    "machine-readable output");
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  const int rank = (*result)["rank"].as<int>();
  const std::optional<int64_t> iteration = iteration_option(options, *result, err);
  if (!iteration) return kBadInput;
  Diagnostics diag;
  const auto scenario = scenario_with_plan(*result, file, diag);
  if (!scenario) return report_problems(diag, err);
  const int64_t world = world_size(*scenario->plan, scenario->model);
  if (rank >= world) {
    err << options.program() << ": --rank " << rank << " out of range: the plan has " << world
        << " ranks\n";
    return kBadInput;
  }
  const ParallelPlan plan =
      resolve_stage_split(*scenario->plan, scenario->model, scenario->workload, scenario->cluster);
  const Lowered lowered = lower(scenario->model, scenario->cluster, plan, scenario->workload,
                                draw_batch(scenario->workload, *iteration));
  if (!lowered.error.empty()) {
    err << options.program() << ": " << lowered.error << "\n";
    return kBadInput;
  }
  const Program& p = lowered.program;
  const auto problems = check_program(p);
  for (const std::string& problem : problems) err << "program check: " << problem << "\n";
  if ((*result).count("json")) {
    out << program_to_json(p, rank).dump(1) << "\n";
  } else {
    for (const std::string& note : lowered.notes) out << "note: " << note << "\n";
    for (int32_t r = 0; r < p.world; ++r) {
      if (rank >= 0 && r != rank) continue;
      const auto& ops = p.ranks[static_cast<std::size_t>(r)];
      out << "rank " << r << ": " << ops.size() << " ops\n";
      for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
        const Op& op = ops[static_cast<std::size_t>(i)];
        char line[256];
        std::snprintf(line, sizeof line, "  %5d  %-44s", i, op_name(p, op).c_str());
        out << line;
        if (op.kind == OpKind::kCompute)
          out << " tokens " << op.tokens << "  " << human_si(op.flops) << "FLOP";
        else
          out << " "
              << human_bytes(op.kind == OpKind::kOptimizerStep ? op.memory_bytes
                                                               : op.message_bytes);
        if (op.kind == OpKind::kCollective)
          out << " over " << p.groups[static_cast<std::size_t>(op.group)].size() << " ranks";
        out << "\n";
      }
    }
  }
  return problems.empty() ? kOk : 1;
}

int run_estimate(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera estimate",
      "Predicts one iteration of a plan with the analytic cost model and the exact "
      "in-order evaluator (no network contention): step time, throughput, TFLOP/s per "
      "device, MFU, pipeline bubble and peak memory, or why the plan does not fit.");
  add_plan_option(options);
  add_set_option(options, "change a scenario field first: json.path=value (repeatable)");
  add_profile_option(options);
  add_iteration_option(options);
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  const std::optional<int64_t> iteration = iteration_option(options, *result, err);
  if (!iteration) return kBadInput;
  Diagnostics diag;
  const auto scenario = scenario_with_plan(*result, file, diag);
  if (!scenario) return report_problems(diag, err);
  const std::optional<CostParams> cost = profile_option(*result, scenario->cluster, diag);
  if (!diag.ok()) return report_problems(diag, err);
  // With a profile, frozen-aware stage boundaries follow its measured costs too.
  const ParallelPlan plan =
      resolve_stage_split(*scenario->plan, scenario->model, scenario->workload, scenario->cluster,
                          cost ? &*cost : nullptr);
  const Estimate e =
      estimate(*scenario, plan, *iteration, cost ? *cost : default_cost_params(scenario->cluster),
               [&](const std::string& line) { err << line << "\n"
                                                  << std::flush; });
  out << "scenario " << scenario->name << ": " << enum_name(scenario->plan->placement, kPlacements)
      << " plan on " << world_size(*scenario->plan, scenario->model) << " ranks, iteration "
      << *iteration << "\n";
  out << stage_layers_line(plan, scenario->model, cost.has_value());
  out << format_estimate(e, *scenario);
  if (e.metrics.step_s > 0) return kOk;  // an infeasible plan is a prediction too
  return e.failure == PlanFailure::kRefused ? kBadInput : 1;
}

int run_simulate(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera simulate",
      "Predicts a plan by executing its per-rank Programs as a SimGrid discrete-event "
      "simulation with network contention, over several iterations with different "
      "drawn batches. Plans that do not fit in memory are reported, not simulated.");
  add_plan_option(options);
  add_set_option(options, "change a scenario field first: json.path=value (repeatable)");
  add_profile_option(options);
  options.add_options()("iterations", "iterations to simulate",
                        cxxopts::value<int64_t>()->default_value("3"))(
      "first-iteration", "first iteration's batch", cxxopts::value<int64_t>()->default_value("0"))(
      "contention", "on: flows share links; off: timed transfers (equals estimate)",
      cxxopts::value<std::string>()->default_value("on"))(
      "nested",
      "nested TP/CP/EP collectives as ring flows over their links (flows), as synchronized timed "
      "activities (timed: faster, no link sharing), or timed where nothing else used their links "
      "meanwhile and flows where something did (auto: the flows' times, mostly at timed speed)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "periodic",
      "on: where every micro-batch is alike and the schedule is 1F1B, simulate a shortened batch "
      "and repeat its steady phase, when a check op by op shows it repeats (exact); off: "
      "simulate every micro-batch",
      cxxopts::value<std::string>()->default_value("on"))(
      "trace", "write one Chrome-trace JSON per rank into this folder",
      cxxopts::value<std::string>())("timeout", "seconds allowed per simulated iteration",
                                     cxxopts::value<double>()->default_value("600"))(
      "json", "machine-readable output");
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  SimulateOptions sim;
  sim.iterations = (*result)["iterations"].as<int64_t>();
  sim.first_iteration = (*result)["first-iteration"].as<int64_t>();
  sim.timeout_s = (*result)["timeout"].as<double>();
  const std::string contention = (*result)["contention"].as<std::string>();
  const std::string nested = (*result)["nested"].as<std::string>();
  const std::string periodic = (*result)["periodic"].as<std::string>();
  if (sim.iterations < 1 || sim.first_iteration < 0 || sim.timeout_s <= 0 ||
      (contention != "on" && contention != "off") ||
      (nested != "auto" && nested != "flows" && nested != "timed") ||
      (periodic != "on" && periodic != "off")) {
    err << options.program()
        << ": --iterations >= 1, --first-iteration >= 0, --timeout > 0, --contention on|off, "
        << "--nested auto|flows|timed, --periodic on|off\n";
    return kBadInput;
  }
  sim.periodic = periodic == "on";
  sim.contention = contention == "on";
  sim.nested = nested == "flows"   ? NestedMode::kFlows
               : nested == "timed" ? NestedMode::kTimed
                                   : NestedMode::kAuto;
  if (result->count("trace")) sim.trace_dir = (*result)["trace"].as<std::string>();
  Diagnostics diag;
  const auto scenario = scenario_with_plan(*result, file, diag);
  if (!scenario) return report_problems(diag, err);
  sim.cost = profile_option(*result, scenario->cluster, diag);
  if (!diag.ok()) return report_problems(diag, err);
  const ParallelPlan plan =
      resolve_stage_split(*scenario->plan, scenario->model, scenario->workload, scenario->cluster,
                          sim.cost ? &*sim.cost : nullptr);
  sim.progress = [&](const std::string& line) { err << line << "\n" << std::flush; };
  const SimulationResult r = simulate(*scenario, plan, sim);
  if ((*result).count("json")) {
    out << simulation_to_json(r).dump(1) << "\n";
  } else {
    out << "scenario " << scenario->name << ": "
        << enum_name(scenario->plan->placement, kPlacements) << " plan on "
        << world_size(*scenario->plan, scenario->model) << " ranks, SimGrid, contention "
        << contention << (sim.contention ? ", nested collectives " + nested : "") << "\n";
    out << stage_layers_line(plan, scenario->model, sim.cost.has_value());
    out << format_simulation(r, *scenario);
  }
  if (!r.feasible)
    return r.failure == PlanFailure::kOutOfMemory ? kOk
           : r.failure == PlanFailure::kRefused   ? kBadInput
                                                  : 1;
  if (!r.trace_error.empty()) return 1;
  return kOk;
}

int run_sweep(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera sweep",
      "What-if search: enumerates homogeneous, colocated and non-colocated plans for each "
      "GPU count, rejects the invalid ones (counted by reason), ranks the rest with the "
      "analytic estimate, simulates the best K on SimGrid in parallel and streams every "
      "result to DIR/results.jsonl; --resume continues an interrupted sweep.");
  options.add_options()(
      "gpus", "GPU counts to search (default: the scenario's search space, else its cluster)",
      cxxopts::value<std::vector<int64_t>>())(
      "placements", "homogeneous,colocated,non_colocated (default: the search space's)",
      cxxopts::value<std::vector<std::string>>())(
      "top", "plans simulated per GPU count (default: the search space's top_k)",
      cxxopts::value<int64_t>())(
      "refine",
      "plans of the first ranking the second stage estimates again with Entrain, sorting, DIP "
      "and the CP splits (0: none; default: the search space's refine.top; none in a shard)",
      cxxopts::value<int64_t>())("j,jobs", "simulations in parallel",
                                 cxxopts::value<int>()->default_value(std::to_string(
                                     std::max(1u, std::thread::hardware_concurrency()))))(
      "out", "output folder (default: out/sweep-<scenario>)", cxxopts::value<std::string>())(
      "resume",
      "keep the results already in the output folder and simulate only the missing plans")(
      "iterations", "simulated iterations per plan", cxxopts::value<int64_t>()->default_value("1"))(
      "profile-batches",
      "rank plans by the mean estimate over N drawn batches, and give non-colocated encoders "
      "the device share of their mean work over them too (Entrain's static layout)",
      cxxopts::value<int64_t>()->default_value("1"))(
      "nested",
      "nested collectives as ring flows, timed activities, or timed where nothing else used "
      "their links meanwhile (auto; see simulate)",
      cxxopts::value<std::string>()->default_value("auto"))(
      "rows", "rows of the table", cxxopts::value<int64_t>()->default_value("10"))(
      "set", "sweep a scenario field: json.path=v1,v2,... (repeat for a grid)",
      cxxopts::value<std::vector<std::string>>())(
      "emit-plan",
      "print the plan ranked R as JSON on standard output (the table goes to standard error)",
      cxxopts::value<int64_t>())(
      "shard",
      "i/n: evaluate the i-th of n deterministic shares of the candidates "
      "(combine the shards' folders with tessera merge)",
      cxxopts::value<std::string>());
  add_profile_option(options);
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  SweepOptions sweep;
  if (result->count("gpus")) sweep.gpus = (*result)["gpus"].as<std::vector<int64_t>>();
  for (int64_t g : sweep.gpus)
    if (g < 1) {
      err << options.program() << ": --gpus must be >= 1\n";
      return kBadInput;
    }
  if (result->count("placements"))
    for (const std::string& name : (*result)["placements"].as<std::vector<std::string>>()) {
      Placement p{};
      Diagnostics diag;
      if (!read_enum(Json(name), "--placements", "", p, kPlacements, diag))
        return report_problems(diag, err);
      sweep.placements.push_back(p);
    }
  if (result->count("top")) sweep.top_k = (*result)["top"].as<int64_t>();
  if (result->count("refine")) sweep.refine_top = (*result)["refine"].as<int64_t>();
  sweep.jobs = (*result)["jobs"].as<int>();
  sweep.resume = result->count("resume") > 0;
  sweep.iterations = (*result)["iterations"].as<int64_t>();
  sweep.profile_batches = (*result)["profile-batches"].as<int64_t>();
  const std::string nested = (*result)["nested"].as<std::string>();
  const int64_t rows = (*result)["rows"].as<int64_t>();
  if ((result->count("top") && sweep.top_k < 1) || sweep.jobs < 1 || sweep.iterations < 1 ||
      rows < 1 || sweep.profile_batches < 1 || (result->count("refine") && sweep.refine_top < 0) ||
      (nested != "auto" && nested != "flows" && nested != "timed")) {
    err << options.program()
        << ": --top, --jobs, --iterations, --profile-batches, --rows >= 1, --refine >= 0 and "
           "--nested auto|flows|timed\n";
    return kBadInput;
  }
  sweep.nested = nested == "flows"   ? NestedMode::kFlows
                 : nested == "timed" ? NestedMode::kTimed
                                     : NestedMode::kAuto;
  Diagnostics diag;
  const auto scenario = load_scenario(file, diag);
  if (!scenario) return report_problems(diag, err);
  sweep.cost = profile_option(*result, scenario->cluster, diag);
  if (!diag.ok()) return report_problems(diag, err);
  const std::optional<std::vector<SetAxis>> sets = set_option(*result, diag);
  if (!sets) return report_problems(diag, err);
  sweep.sets = *sets;
  for (const Json& point : grid_points(sweep.sets)) scenario_at(*scenario, point, diag);
  if (!diag.ok()) return report_problems(diag, err);
  sweep.out_dir =
      result->count("out") ? (*result)["out"].as<std::string>() : "out/sweep-" + scenario->name;
  sweep.scenario_file = std::filesystem::absolute(file).string();
  if (result->count("shard")) {
    const std::string shard = (*result)["shard"].as<std::string>();
    const std::size_t slash = shard.find('/');
    try {
      if (slash == std::string::npos) throw std::invalid_argument("no slash");
      sweep.shard_index = std::stoll(shard.substr(0, slash));
      sweep.shard_count = std::stoll(shard.substr(slash + 1));
    } catch (const std::exception&) {
      sweep.shard_count = 0;
    }
    if (sweep.shard_count < 1 || sweep.shard_index < 1 || sweep.shard_index > sweep.shard_count) {
      err << options.program() << ": --shard needs i/n with 1 <= i <= n, got '" << shard << "'\n";
      return kBadInput;
    }
  }
  const bool emit = result->count("emit-plan") > 0;
  const int64_t emit_rank = emit ? (*result)["emit-plan"].as<int64_t>() : 0;
  Progress progress(err, ::isatty(2) != 0);
  const SweepResult r =
      run_sweep(*scenario, sweep,
                [&](const std::string& phase, const std::string& what, std::size_t done,
                    std::size_t total, const std::string& last,
                    bool failed) { progress.update(phase, what, done, total, last, failed); });
  (emit ? err : out) << format_sweep(r, *scenario, static_cast<std::size_t>(rows));
  if (emit) {
    if (emit_rank < 1 || emit_rank > static_cast<int64_t>(r.rows.size()) ||
        !r.rows[static_cast<std::size_t>(emit_rank - 1)].ok) {
      err << options.program() << ": --emit-plan " << emit_rank
          << ": no successful plan with that rank\n";
      return kBadInput;
    }
    out << to_json(r.rows[static_cast<std::size_t>(emit_rank - 1)].plan).dump(2) << "\n";
  }
  return kOk;
}

int run_merge(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera merge",
      "Combines the output folders of `tessera sweep --shard i/n` runs into one ranking, "
      "identical to an unsharded sweep, and writes its results and report.");
  options.add_options()("dirs", "shard output folders", cxxopts::value<std::vector<std::string>>())(
      "out", "output folder", cxxopts::value<std::string>()->default_value("out/sweep-merged"))(
      "rows", "rows of the table", cxxopts::value<int64_t>()->default_value("10"));
  options.parse_positional({"dirs"});
  options.positional_help("<shard dir>...");
  int code = kOk;
  const auto result = parse(options, args, out, err, code);
  if (!result) return code;
  if (!result->count("dirs")) {
    err << options.program() << ": give the shard folders\n";
    return kBadInput;
  }
  SweepResult merged;
  std::optional<Scenario> scenario;
  const std::string problem = merge_sweeps((*result)["dirs"].as<std::vector<std::string>>(),
                                           (*result)["out"].as<std::string>(), merged, scenario);
  if (!problem.empty()) {
    err << options.program() << ": " << problem << "\n";
    return kBadInput;
  }
  out << format_sweep(merged, *scenario, static_cast<std::size_t>((*result)["rows"].as<int64_t>()));
  return kOk;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"validate", "check a scenario and report every problem", run_validate},
      {"show", "summarise a scenario: modules, tokens, cluster, plan and rank groups", run_show},
      {"import-hf", "convert a HuggingFace config.json into a model file", run_import_hf},
      {"lower", "print the per-rank op lists of one iteration (dry run)", run_lower},
      {"estimate", "predict step time, throughput, MFU and memory of a plan (analytic)",
       run_estimate},
      {"simulate", "simulate a plan on SimGrid with network contention", run_simulate},
      {"stages", "share a device budget's pipeline stages among modules, frozen-aware vs not",
       run_stages},
      {"sweep", "search plans: enumerate, prune, estimate, simulate the best, rank", run_sweep},
      {"merge", "combine sharded sweeps into one ranking and report", run_merge},
      {"calibrate", "fit the cost model to recorded runs (traces) into a profile", run_calibrate},
      {"replay", "simulate a recorded run and compare predicted with measured", run_replay},
      {"fidelity", "compare predictions with published runs; fit the global kernel parameters",
       run_fidelity},
      {"gemms", "set measured matrix-product rates beside the kernel model's GEMM pricing",
       run_gemms},
      {"export", "write a plan as Megatron-LM's training arguments and megatron-core's config",
       run_export},
      {"tune", "sweep, train the best plans, calibrate on them and re-rank the sweep", run_tune},
  };
  return table;
}

}  // namespace tessera::sim

// `tessera export`: a plan as the training software people run takes it — Megatron-LM's
// training arguments and megatron-core's configuration values (megatron_export.hpp).
#include <ostream>

#include "shared/base/json_reader.hpp"
#include "shared/search/megatron_export.hpp"
#include "shared/search/stage_split.hpp"
#include "sim/command_line.hpp"

namespace tessera::sim {

int run_export(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera export",
      "Writes a scenario's plan (or --plan's) for Megatron-LM: its training arguments for "
      "pretrain_gpt.py — model shape, TP/PP/virtual stages/CP/EP, sequence parallelism, micro "
      "and global batch, recomputation, distributed optimizer and overlap, precision — with "
      "what Megatron-LM cannot express said in '#' lines above them. --json: the same values "
      "as megatron-core's configuration keyword arguments (TransformerConfig, GPTModel, "
      "DistributedDataParallelConfig), the arguments and the notes. Frozen-aware stage "
      "boundaries are resolved first and written as a pipeline layout.");
  add_plan_option(options);
  add_set_option(options, "change a scenario field first: json.path=value (repeatable)");
  options.add_options()("to", "target: megatron",
                        cxxopts::value<std::string>()->default_value("megatron"))(
      "json", "megatron-core's configuration values, the arguments and the notes as JSON")(
      "o,out", "write to this file instead of standard output", cxxopts::value<std::string>());
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  if ((*result)["to"].as<std::string>() != "megatron") {
    err << options.program() << ": --to " << (*result)["to"].as<std::string>()
        << ": the one target is megatron\n";
    return kBadInput;
  }
  Diagnostics diag;
  const auto scenario = scenario_with_plan(*result, file, diag);
  if (!scenario) return report_problems(diag, err);
  const ParallelPlan plan =
      resolve_stage_split(*scenario->plan, scenario->model, scenario->workload, scenario->cluster);
  const MegatronExport e = megatron_export(*scenario, plan);
  if (!e.refusal.empty()) {
    err << options.program() << ": " << file << ": " << e.refusal << "\n";
    return kBadInput;
  }
  std::string text;
  if (result->count("json")) {
    // Each argument as [flag] or [flag, value].
    const auto listed = [](const std::vector<std::pair<std::string, std::string>>& arguments) {
      Json list = Json::array();
      for (const auto& [flag, value] : arguments)
        list.push_back(value.empty() ? Json::array({flag}) : Json::array({flag, value}));
      return list;
    };
    Json j = e.config;
    j["arguments"] = listed(e.arguments);
    if (!e.mimo_arguments.empty()) j["mimo_arguments"] = listed(e.mimo_arguments);
    j["notes"] = e.notes;
    text = j.dump(2) + "\n";
  } else {
    text = megatron_command_line(e);
  }
  if (!result->count("out")) {
    out << text;
    return kOk;
  }
  if (const std::string problem = write_file_atomically((*result)["out"].as<std::string>(), text);
      !problem.empty()) {
    err << options.program() << ": " << problem << "\n";
    return 1;
  }
  return kOk;
}

}  // namespace tessera::sim

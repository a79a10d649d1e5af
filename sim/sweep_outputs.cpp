// The outputs of tessera sweep: results.jsonl, results.csv, summary.json and report.html, the
// merge of shard runs, the terminal table and the one-line layout of a plan.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "shared/base/check.hpp"
#include "shared/search/scenario_report.hpp"
#include "sim/progress.hpp"
#include "sim/sweep.hpp"
#include "sim/sweep_families.hpp"
#include "sim/sweep_report.hpp"

namespace tessera::sim {

namespace {

Json estimated_to_json(const EstimatedPlan& e) {
  return Json{{"point", e.point},
              {"gpus", e.gpus},
              {"placement", enum_name(e.placement, kPlacements)},
              {"llm_tp", e.llm_tp},
              {"llm_pp", e.llm_pp},
              {"tokens_per_s", e.tokens_per_s}};
}

}  // namespace

std::string describe_layout(const ParallelPlan& plan, const ModelSpec& model) {
  auto one = [](const std::string& name, const ModuleLayout& l) {
    std::string s = name + " t" + std::to_string(l.tp);
    if (l.cp > 1) s += " c" + std::to_string(l.cp);
    if (l.pp > 1) s += " p" + std::to_string(l.pp);
    if (!l.stage_layers.empty()) {  // explicit stage boundaries (frozen-aware): layers per stage
      std::string layers;
      for (int64_t n : l.stage_layers) layers += (layers.empty() ? "" : "/") + std::to_string(n);
      s += "[" + layers + "]";
    }
    if (l.vpp > 1) s += " v" + std::to_string(l.vpp);
    if (l.ep > 1) s += " e" + std::to_string(l.ep);
    if (l.expert_tp() != l.tp) s += " et" + std::to_string(l.expert_tp());
    return s + " d" + std::to_string(l.dp);
  };
  // The data-variability options (Entrain, sorting, DIP) where they differ from the default.
  std::string options;
  if (plan.schedule == Schedule::kDip) options += " dip";
  if (plan.microbatching != MicrobatchPolicy::kArrival)
    options += " " + enum_name(plan.microbatching, kMicrobatching);
  // Memory options: recomputation, sequence parallelism, distributed optimizer.
  if (plan.recompute != Recompute::kNone)
    options += " rc:" + enum_name(plan.recompute, kRecomputes);
  if (plan.sequence_parallel) options += " sp";
  if (plan.distributed_optimizer) options += " dopt";
  if (plan.fully_sharded) options += " fsdp";
  if (plan.fp8 != Fp8Recipe::kNone) options += " fp8:" + enum_name(plan.fp8, kFp8Recipes);
  // The expert dispatch where it is not Megatron-LM's default.
  if (plan.moe_dispatcher != MoeDispatcher::kAllToAll)
    options += " " + enum_name(plan.moe_dispatcher, kMoeDispatchers);
  if (plan.moe_a2a_overlap) options += " a2a:overlap";
  // Heads TP does not divide: padded, or the encoders whole on every TP rank.
  if (plan.indivisible_heads == IndivisibleHeads::kPad) options += " heads:pad";
  if (plan.indivisible_heads == IndivisibleHeads::kReplicate) options += " heads:replicate";
  // How context parallelism splits a sequence, where it is used and not the default.
  bool context_parallel = plan.layout.cp > 1;
  for (const auto& [name, l] : plan.modules) context_parallel = context_parallel || l.cp > 1;
  if (context_parallel && plan.cp_split != CpSplit::kUniform)
    options += " cp:" + enum_name(plan.cp_split, kCpSplits);
  // Encoders dealt media items rather than whole samples.
  if (plan.encoder_data_parallel == EncoderDataParallel::kMedia) options += " enc:media";
  if (plan.placement == Placement::kHomogeneous) {
    const ModuleSpec* llm = find_llm(model);
    return one(llm != nullptr ? llm->name : "all", plan.layout) + options;
  }
  std::string out;
  for (auto it = plan.modules.rbegin(); it != plan.modules.rend(); ++it)
    out += (out.empty() ? "" : " | ") + one(it->first, it->second);
  return out + options;
}

void write_sweep_outputs(const SweepResult& result, const Scenario& scenario,
                         const std::string& scenario_file) {
  namespace fs = std::filesystem;
  const std::string& dir = result.out_dir;
  fs::create_directories(dir);
  // Each file replaced whole (temp file, rename): a full disk leaves the previous one intact.
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string error = write_file_atomically((fs::path(dir) / name).string(), text);
    if (!error.empty()) throw std::runtime_error(error);
  };
  {
    std::ostringstream out;
    for (const SweepRow& r : result.rows) out << row_to_json(r).dump() << "\n";
    write("results.jsonl", out.str());
  }
  // CSV and summary.
  std::ostringstream csv;
  csv << "rank,point,gpus,placement,layout,micro_batch_size,global_batch,schedule,step_s,tokens_"
         "per_s,tflops_per_device,mfu,"
         "idle_share_of_step,peak_memory_gib,estimate_step_s,llm_microbatch_cv,llm_microbatch_max_"
         "over_mean,"
         "status\n";
  for (std::size_t i = 0; i < result.rows.size(); ++i) {
    const SweepRow& r = result.rows[i];
    std::string point = r.point.empty() ? "" : r.point.dump();
    for (std::size_t q = point.find('"'); q != std::string::npos; q = point.find('"', q + 2))
      point.insert(q, "\"");
    csv << i + 1 << ",\"" << point << "\"," << r.gpus << ","
        << enum_name(r.plan.placement, kPlacements) << ",\""
        << describe_layout(r.plan, scenario.model) << "\"," << r.plan.micro_batch_size << ","
        << r.global_batch << "," << enum_name(r.plan.schedule, kSchedules) << "," << r.step_s << ","
        << r.tokens_per_s << "," << r.tflops_per_device << "," << r.mfu << "," << r.idle_share
        << "," << r.peak_memory_bytes / (1024.0 * 1024 * 1024) << "," << r.estimate_step_s << ","
        << r.llm_microbatch_cv << "," << r.llm_microbatch_max_over_mean << ","
        << (r.ok ? "ok" : "\"failed: " + r.failure + "\"") << "\n";
  }
  Json summary;
  summary["scenario"] = scenario.name;
  summary["considered"] = result.considered;
  summary["valid"] = result.valid;
  summary["ranked"] = result.ranked;
  summary["rejected"] = result.rejected;
  summary["top_k"] = result.top_k;
  summary["notes"] = result.notes;
  summary["scenario_file"] = scenario_file;
  Json estimated = Json::array();
  for (const EstimatedPlan& e : result.estimated) estimated.push_back(estimated_to_json(e));
  summary["estimated"] = estimated;
  Json rows = Json::array();
  for (const SweepRow& r : result.rows) rows.push_back(row_to_json(r));
  summary["results"] = rows;
  write("results.csv", csv.str());
  write("summary.json", summary.dump(1) + "\n");
  write("report.html", sweep_report_html(result, scenario));
}

std::string merge_sweeps(const std::vector<std::string>& dirs, const std::string& out_dir,
                         SweepResult& merged, std::optional<Scenario>& scenario) {
  namespace fs = std::filesystem;
  merged = SweepResult{};
  merged.out_dir = out_dir;
  std::vector<SweepRow> rows;
  std::set<std::string> seen;
  std::string scenario_file;
  for (const std::string& dir : dirs) {
    const std::string file = (fs::path(dir) / "summary.json").string();
    Diagnostics diag;
    const auto summary = read_json_file(file, diag);
    if (!summary) return diag.format();
    try {
      merged.considered += summary->at("considered").get<int64_t>();
      merged.valid += summary->at("valid").get<int64_t>();
      merged.ranked += summary->at("ranked").get<int64_t>();
      for (const auto& item : summary->at("rejected").items())
        merged.rejected[item.key()] += item.value().get<int64_t>();
      merged.top_k = summary->at("top_k").get<int64_t>();
      scenario_file = summary->at("scenario_file").get<std::string>();
      for (const Json& e : summary->at("estimated")) {
        EstimatedPlan p;
        p.point = e.at("point");
        p.gpus = e.at("gpus").get<int64_t>();
        Diagnostics ignored;
        read_enum(e.at("placement"), "", "", p.placement, kPlacements, ignored);
        p.llm_tp = e.at("llm_tp").get<int64_t>();
        p.llm_pp = e.at("llm_pp").get<int64_t>();
        p.tokens_per_s = e.at("tokens_per_s").get<double>();
        merged.estimated.push_back(p);
      }
    } catch (const Json::exception& e) {
      return file + ": not a sweep summary (" + e.what() + ")";
    }
    for (SweepRow& row : load_sweep_rows((fs::path(dir) / "results.jsonl").string()))
      if (seen.insert(row.key).second) rows.push_back(std::move(row));
  }
  // Each shard simulated its own best K by estimate and its best plan of each placement family,
  // so the best K overall and each family's best are among them: keep, per (grid point, GPU
  // count), those — exactly what one run simulates.
  std::map<std::pair<std::string, int64_t>, std::vector<SweepRow>> groups;
  for (SweepRow& row : rows) groups[{row.point.dump(), row.gpus}].push_back(std::move(row));
  for (auto& [key, group] : groups) {
    std::sort(group.begin(), group.end(), [](const SweepRow& a, const SweepRow& b) {
      return a.estimate_step_s != b.estimate_step_s ? a.estimate_step_s < b.estimate_step_s
                                                    : a.key < b.key;
    });
    for (std::size_t i : best_k_and_each_family(
             group, merged.top_k, [](const SweepRow& row) { return row.plan.placement; }))
      merged.rows.push_back(std::move(group[i]));
  }
  sort_rows(merged.rows);
  Diagnostics diag;
  scenario = load_scenario(scenario_file, diag);
  if (!scenario) return "the sweep's scenario cannot be loaded: " + diag.format();
  write_sweep_outputs(merged, *scenario, scenario_file);
  return "";
}

std::string format_sweep(const SweepResult& r, const Scenario& s, std::size_t shown) {
  std::ostringstream out;
  out << r.considered << " plans considered, " << r.valid << " valid, " << r.ranked
      << " fit in memory and were estimated";
  int64_t rejected = 0;
  for (const auto& [reason, count] : r.rejected) rejected += count;
  out << "; " << rejected << " rejected:";
  for (const auto& [reason, count] : r.rejected) out << " " << count << " " << reason << ",";
  out.seekp(-1, std::ios_base::end);
  out << "\n";
  if (r.refined_bases > 0)
    out << "second stage: the best " << r.refined_bases
        << " plans (each placement family's best among them) tried with Entrain, sorted "
           "micro-batches, DIP and CP splits: "
        << r.refined << " variants, " << r.refined - r.refined_rejected << " estimated, "
        << r.refined_rejected << " did not fit or were refused\n";
  for (const std::string& note : r.notes) out << note << "\n";
  out << "\n";
  char line[512];
  // The families side by side first: the best simulated plan of each, and why the fastest wins.
  for (const auto& group : family_bests(r.rows)) {
    const SweepRow& first = *group.front();
    const std::string where = point_text(first.point);
    out << "best of each placement family on " << first.gpus << " GPUs"
        << (where.empty() ? "" : " at " + where)
        << " (simulated; per rank and step, s: compute + imbalance + bubble and waits + exposed "
           "communication + boundary):\n";
    for (const SweepRow* row : group) {
      const StepParts parts = step_parts(*row);
      char step[32];
      std::snprintf(step, sizeof step, "%.4g s", row->step_s);
      std::snprintf(
          line, sizeof line,
          "  %-14s %-56s  %-10s  %-10.4g tokens/s  %-6.1f TFLOP/s/GPU  %.3g + %.3g + %.3g + "
          "%.3g + %.3g\n",
          enum_name(row->plan.placement, kPlacements).c_str(),
          describe_layout(row->plan, s.model).c_str(), step, row->tokens_per_s,
          row->tflops_per_device, parts.compute_s, parts.imbalance_s, parts.bubble_s, parts.comm_s,
          parts.boundary_s);
      out << line;
    }
    for (std::size_t i = 1; i < group.size(); ++i)
      out << "  " << why_faster(*group.front(), *group[i]) << "\n";
    out << "\n";
  }
  const bool points = std::any_of(r.rows.begin(), r.rows.end(),
                                  [](const SweepRow& row) { return !row.point.empty(); });
  std::snprintf(line, sizeof line,
                "%-4s %-5s %-14s %-56s %-4s %-5s %-9s %-11s %-9s %-6s %-9s %-7s %-6s\n", "#",
                "GPUs", "placement", "layout", "MBS", "GBS", "step (s)", "tokens/s", "TFLOP/s",
                "MFU", "memory", "idle %", "mb CV");
  out << line;
  for (std::size_t i = 0; i < r.rows.size() && i < shown; ++i) {
    const SweepRow& row = r.rows[i];
    if (points && (i == 0 || row.point != r.rows[i - 1].point))
      out << "at " << point_text(row.point) << ":\n";
    if (!row.ok) {
      std::snprintf(line, sizeof line, "%-4zu %-5lld %-14s %-56s failed: %s\n", i + 1,
                    static_cast<long long>(row.gpus),
                    enum_name(row.plan.placement, kPlacements).c_str(),
                    describe_layout(row.plan, s.model).c_str(), row.failure.c_str());
    } else {
      std::snprintf(line, sizeof line,
                    "%-4zu %-5lld %-14s %-56s %-4lld %-5lld %-9.4g %-11.4g %-9.4g %-6.1f %-9s "
                    "%-7.1f %-6.3f\n",
                    i + 1, static_cast<long long>(row.gpus),
                    enum_name(row.plan.placement, kPlacements).c_str(),
                    describe_layout(row.plan, s.model).c_str(),
                    static_cast<long long>(row.plan.micro_batch_size),
                    static_cast<long long>(row.global_batch), row.step_s, row.tokens_per_s,
                    row.tflops_per_device, 100 * row.mfu,
                    human_bytes(row.peak_memory_bytes).c_str(), 100 * row.idle_share,
                    row.llm_microbatch_cv);
    }
    out << line;
  }
  out << "(idle %: the share of the step a rank computes nothing, mean over ranks; mb CV: the "
         "variation of the LLM's micro-batch times)\n";
  if (!r.split_gains.empty()) {
    out << "\nfrozen-aware vs uniform stage split, the best pipelined plans (analytic estimate):\n";
    for (const SplitGain& g : r.split_gains) {
      std::snprintf(line, sizeof line, "  %lld GPUs %-14s %-44s %.4g s vs %.4g s uniform: %.3fx\n",
                    static_cast<long long>(g.gpus),
                    enum_name(g.frozen_aware.placement, kPlacements).c_str(),
                    describe_layout(g.frozen_aware, s.model).c_str(), g.frozen_aware_s, g.uniform_s,
                    g.uniform_s / g.frozen_aware_s);
      out << line;
    }
  }
  for (const auto& [point, share] : r.encoder_shares) {
    std::snprintf(
        line, sizeof line,
        "\nencoders' mean share of the training work over the profiled batches: %.1f%%%s%s "
        "(non-colocated plans also tried with that share of the devices)\n",
        100 * share, point.empty() ? "" : " at ", point.empty() ? "" : point.dump().c_str());
    out << line;
  }
  if (const std::vector<std::string> lines = technique_lines(r, s.model); !lines.empty()) {
    out << "\nwhat the second stage's techniques did to each family's best first-stage plan "
           "(analytic estimate, speed-up):\n";
    for (const std::string& l : lines) out << l << "\n";
  }
  if (r.enumerate_s + r.estimate_s + r.simulate_s > 0) {
    auto rate = [](double n, double seconds) { return per_second(seconds > 0 ? n / seconds : 0); };
    std::snprintf(line, sizeof line,
                  "\ntiming: enumerated and validated %lld in %.2f s (%s/s), estimated %lld in "
                  "%.2f s (%s/s), refined %lld in %.2f s, simulated %lld in %.2f s (%s/s)\n",
                  static_cast<long long>(r.considered), r.enumerate_s,
                  rate(static_cast<double>(r.considered), r.enumerate_s).c_str(),
                  static_cast<long long>(r.valid), r.estimate_s,
                  rate(static_cast<double>(r.valid), r.estimate_s).c_str(),
                  static_cast<long long>(r.refined), r.refine_s,
                  static_cast<long long>(r.simulated), r.simulate_s,
                  rate(static_cast<double>(r.simulated), r.simulate_s).c_str());
    out << line;
  }
  out << "\nreport: " << r.out_dir
      << "/report.html (also results.jsonl, results.csv, summary.json)\n";
  return out.str();
}

}  // namespace tessera::sim

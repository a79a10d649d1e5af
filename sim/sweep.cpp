#include "sim/sweep.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

#include "shared/check.hpp"
#include "shared/entrain.hpp"
#include "shared/failpoint.hpp"
#include "shared/scenario_report.hpp"
#include "sim/child_process.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep_report.hpp"

namespace tessera::sim {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

Json estimated_to_json(const EstimatedPlan& e) {
  return Json{{"point", e.point},
              {"gpus", e.gpus},
              {"placement", enum_name(e.placement, kPlacements)},
              {"llm_tp", e.llm_tp},
              {"llm_pp", e.llm_pp},
              {"tokens_per_s", e.tokens_per_s}};
}

}  // namespace

std::vector<Json> grid_points(const std::vector<SetAxis>& axes) {
  std::vector<Json> points{Json::object()};
  for (const SetAxis& axis : axes) {
    std::vector<Json> next;
    for (const Json& point : points)
      for (const Json& value : axis.values) {
        Json p = point;
        p[axis.path] = value;
        next.push_back(p);
      }
    points = std::move(next);
  }
  return points;
}

std::optional<Scenario> scenario_at(const Scenario& s, const Json& point, Diagnostics& diag) {
  if (point.empty()) return s;
  Json j = inline_scenario_json(s);
  for (const auto& item : point.items()) {
    const std::string problem = set_json_path(j, item.key(), item.value());
    if (!problem.empty()) {
      diag.error("--set", item.key(), problem);
      return std::nullopt;
    }
  }
  Diagnostics local;
  auto at = read_scenario(j, s.file, local);
  if (!at) {
    for (const Diagnostic& d : local.errors())
      diag.error("--set " + point.dump(), d.path, d.message);
    return std::nullopt;
  }
  return at;
}

namespace {

// The plan with its stage split left out: frozen-aware and uniform twins share it.
std::string split_free_key(const ParallelPlan& plan) {
  ParallelPlan p = plan;
  p.stage_split = StageSplit::kUniform;
  p.layout.stage_layers.clear();
  for (auto& [name, l] : p.modules) l.stage_layers.clear();
  return to_json(p).dump();
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
  if (plan.placement == Placement::kHomogeneous) {
    const ModuleSpec* llm = find_llm(model);
    return one(llm != nullptr ? llm->name : "all", plan.layout) + options;
  }
  std::string out;
  for (auto it = plan.modules.rbegin(); it != plan.modules.rend(); ++it)
    out += (out.empty() ? "" : " | ") + one(it->first, it->second);
  return out + options;
}

SweepResult run_sweep(
    const Scenario& base, const SweepOptions& options,
    const std::function<void(std::size_t, std::size_t, const std::string&)>& progress) {
  SweepResult result;
  result.out_dir = options.out_dir;
  // Enumerate and rank per grid point and GPU count; the best K of each get simulated.
  struct Chosen {
    RankedCandidate ranked;
    Json point;
    std::shared_ptr<const Scenario> scenario;
  };
  std::vector<Chosen> chosen;
  for (const Json& point : grid_points(options.sets)) {
    Diagnostics diag;
    const auto at = scenario_at(base, point, diag);
    TESSERA_CHECK(at.has_value(), "run_sweep needs valid grid points: " + diag.format());
    auto s = std::make_shared<const Scenario>(*at);
    SearchSpace space = s->search.value_or(SearchSpace{});
    if (!options.placements.empty()) space.placements = options.placements;
    std::vector<int64_t> gpus = options.gpus;
    if (gpus.empty()) gpus = space.gpus;
    if (gpus.empty()) gpus = {std::max<int64_t>(1, device_count(s->cluster))};
    const int64_t top_k = options.top_k > 0 ? options.top_k : space.top_k;
    result.top_k = top_k;
    const double encoder_share =
        options.profile_batches > 1
            ? encoder_work_share(s->model, s->workload, options.profile_batches)
            : 0;
    if (options.profile_batches > 1) result.encoder_shares.push_back({point, encoder_share});
    for (int64_t g : gpus) {
      auto phase = std::chrono::steady_clock::now();
      Enumeration e =
          enumerate_plans(*s, space, g, options.cost ? &*options.cost : nullptr, encoder_share);
      if (options.shard_count > 1) {
        const std::string prefix = point.empty() ? "" : point.dump();
        std::erase_if(e.valid, [&](const Candidate& c) {
          return static_cast<int64_t>(fnv1a(prefix + c.key) %
                                      static_cast<uint64_t>(options.shard_count)) !=
                 options.shard_index - 1;
        });
      }
      if (options.shard_index == 1) {
        result.considered += e.considered;
        for (const auto& [reason, count] : e.rejected) result.rejected[reason] += count;
      }
      result.valid += static_cast<int64_t>(e.valid.size());
      result.enumerate_s += seconds_since(phase);
      phase = std::chrono::steady_clock::now();
      std::map<std::string, int64_t> rejected_here;
      std::vector<RankedCandidate> ranked =
          rank_candidates(*s, std::move(e.valid), 0, rejected_here, options.jobs,
                          options.cost ? &*options.cost : nullptr, options.profile_batches);
      result.estimate_s += seconds_since(phase);
      for (const auto& [reason, count] : rejected_here) result.rejected[reason] += count;
      result.ranked += static_cast<int64_t>(ranked.size());
      const ModuleSpec* llm = find_llm(s->model);
      for (const RankedCandidate& rc : ranked) {
        const ParallelPlan& p = rc.candidate.plan;
        ModuleLayout l = p.layout;
        for (const auto& [name, layout] : p.modules)
          if (llm != nullptr && name == llm->name) l = layout;
        result.estimated.push_back(
            {point, g, p.placement, l.tp, l.pp, rc.estimate.metrics.tokens_per_s});
      }
      // Stage-split twins: the same plan split frozen-aware and uniformly. The three best
      // frozen-aware plans are compared with their twins by estimate; those among the chosen
      // get their twin simulated beside them.
      std::map<std::string, std::size_t> uniform_twin;  // split-free key -> index in ranked
      for (std::size_t i = 0; i < ranked.size(); ++i)
        if (ranked[i].candidate.plan.stage_split == StageSplit::kUniform)
          uniform_twin.emplace(split_free_key(ranked[i].candidate.plan), i);
      std::set<std::size_t> picked;
      for (std::size_t i = 0; i < ranked.size() && static_cast<int64_t>(i) < top_k; ++i)
        picked.insert(i);
      std::size_t compared = 0;
      for (std::size_t i = 0; i < ranked.size() && compared < 3; ++i) {
        const ParallelPlan& p = ranked[i].candidate.plan;
        if (p.stage_split != StageSplit::kFrozenAware) continue;
        const auto twin = uniform_twin.find(split_free_key(p));
        if (twin == uniform_twin.end()) continue;
        result.split_gains.push_back({g, p, ranked[i].estimate.metrics.step_s,
                                      ranked[twin->second].estimate.metrics.step_s});
        ++compared;
        if (picked.count(i) > 0) picked.insert(twin->second);
      }
      for (std::size_t i : picked) {
        if (!point.empty())
          ranked[i].candidate.key =
              Json{{"point", point}, {"candidate", Json::parse(ranked[i].candidate.key)}}.dump();
        chosen.push_back({std::move(ranked[i]), point, s});
      }
    }
  }
  const Scenario& s = base;
  namespace fs = std::filesystem;
  fs::create_directories(options.out_dir);
  const fs::path jsonl = fs::path(options.out_dir) / "results.jsonl";
  // Resume: rows already written stay; only the missing plans are simulated.
  std::set<std::string> done;
  if (options.resume && fs::exists(jsonl)) {
    result.rows = load_sweep_rows(jsonl.string());
    for (const SweepRow& r : result.rows) done.insert(r.key);
  } else if (fs::exists(jsonl)) {
    fs::remove(jsonl);
  }
  // Rewrite the kept rows whole, dropping any partial line, before appending (atomically: a
  // full disk must not cost the rows already there).
  {
    std::ostringstream kept;
    for (const SweepRow& r : result.rows) kept << row_to_json(r).dump() << "\n";
    const std::string error = write_file_atomically(jsonl.string(), kept.str());
    if (!error.empty()) throw std::runtime_error(error);
  }
  std::vector<const Chosen*> todo;
  for (const Chosen& c : chosen)
    if (!done.contains(c.ranked.candidate.key)) todo.push_back(&c);

  std::vector<std::function<std::string()>> tasks;
  for (const Chosen* chosen_one : todo)
    tasks.push_back([chosen_one, &options, index = static_cast<int64_t>(tasks.size())] {
      // (Runs in a child process.) A test's injected crash of this simulation.
      if (failpoint("sweep-simulation-crash", index)) std::raise(SIGSEGV);
      const Candidate* c = &chosen_one->ranked.candidate;
      Scenario sized = *chosen_one->scenario;
      sized.cluster = cluster_with_devices(sized.cluster, c->gpus);
      SimulateOptions sim;
      sim.iterations = options.iterations;
      sim.nested_flows = options.nested_flows;
      sim.timeout_s = options.timeout_s;
      sim.cost = options.cost;
      // Already inside a child: run each iteration's engine in a grandchild as usual.
      const SimulationResult r = simulate(sized, c->plan, sim);
      Json j = {{"feasible", r.feasible}, {"reason", r.reason}};
      if (r.feasible) {
        double tokens = 0, tflops = 0, mfu = 0, bubble = 0, memory = 0, compute = 0, exposed = 0,
               boundary = 0, cv = 0, max_over_mean = 0;
        const std::string llm_name = find_llm(sized.model)->name;
        for (const SimulatedIteration& it : r.iterations) {
          for (const MicrobatchVariability& v : it.metrics.microbatch_variability)
            if (v.module == llm_name) {
              cv += v.cv;
              max_over_mean += v.max_over_mean;
            }
          const auto& b = it.metrics.bubble;
          for (double x : b) compute += it.metrics.step_s / (1 + x) / static_cast<double>(b.size());
          exposed += it.metrics.exposed_comm_mean_s;
          boundary += it.metrics.exposed_boundary_mean_s;
          tokens += it.metrics.tokens_per_s;
          tflops += it.metrics.tflops_per_device;
          mfu += it.metrics.mfu;
          bubble += it.metrics.bubble_mean;
          memory = std::max(
              memory, it.metrics.memory[static_cast<std::size_t>(it.metrics.peak_rank)].total());
        }
        const double n = static_cast<double>(r.iterations.size());
        j.update({{"step_s", r.step_mean_s},
                  {"tokens_per_s", tokens / n},
                  {"tflops_per_device", tflops / n},
                  {"mfu", mfu / n},
                  {"bubble", bubble / n},
                  {"peak_memory_bytes", memory},
                  {"compute_s", compute / n},
                  {"exposed_comm_s", exposed / n},
                  {"exposed_boundary_s", boundary / n},
                  {"llm_microbatch_cv", cv / n},
                  {"llm_microbatch_max_over_mean", max_over_mean / n}});
      }
      return j.dump();
    });
  std::ofstream out(jsonl, std::ios::app);
  std::string write_error;  // the first failed append (reported once the children are done)
  std::size_t finished = 0;
  const auto simulation_start = std::chrono::steady_clock::now();
  result.simulated = static_cast<int64_t>(tasks.size());
  run_children(
      tasks, options.jobs, options.timeout_s * static_cast<double>(options.iterations) + 60,
      [&](std::size_t i, const ChildResult& child) {
        const RankedCandidate& c = todo[i]->ranked;
        SweepRow row;
        row.key = c.candidate.key;
        row.point = todo[i]->point;
        row.gpus = c.candidate.gpus;
        row.global_batch = todo[i]->scenario->workload.global_batch;
        row.plan = c.candidate.plan;
        row.estimate_step_s = c.estimate.metrics.step_s;
        if (!child.ok) {
          row.failure = child.error;
        } else {
          const Json j = Json::parse(child.output);
          if (!j.at("feasible").get<bool>()) {
            row.failure = j.at("reason").get<std::string>();
          } else {
            row.ok = true;
            row.step_s = j.at("step_s").get<double>();
            row.tokens_per_s = j.at("tokens_per_s").get<double>();
            row.tflops_per_device = j.at("tflops_per_device").get<double>();
            row.mfu = j.at("mfu").get<double>();
            row.bubble = j.at("bubble").get<double>();
            row.peak_memory_bytes = j.at("peak_memory_bytes").get<double>();
            row.compute_s = j.at("compute_s").get<double>();
            row.exposed_comm_s = j.at("exposed_comm_s").get<double>();
            row.exposed_boundary_s = j.at("exposed_boundary_s").get<double>();
            row.llm_microbatch_cv = j.at("llm_microbatch_cv").get<double>();
            row.llm_microbatch_max_over_mean = j.at("llm_microbatch_max_over_mean").get<double>();
          }
        }
        out << row_to_json(row).dump() << "\n";
        out.flush();  // streamed: an interruption loses at most the running simulations
        if (!out && write_error.empty())
          write_error = "cannot append to " + jsonl.string() +
                        " (disk full?); the rows before stay, --resume continues";
        result.rows.push_back(row);
        const std::string line =
            describe_layout(row.plan, s.model) +
            (row.ok ? ": step " + std::to_string(row.step_s) + " s" : ": failed: " + row.failure);
        progress(++finished, todo.size(), line);
      });
  result.simulate_s = seconds_since(simulation_start);
  if (!write_error.empty()) throw std::runtime_error(write_error);
  sort_rows(result.rows);
  write_sweep_outputs(result, s, options.scenario_file);
  return result;
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
         "bubble,peak_memory_gib,estimate_step_s,llm_microbatch_cv,llm_microbatch_max_over_mean,"
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
        << r.tokens_per_s << "," << r.tflops_per_device << "," << r.mfu << "," << r.bubble << ","
        << r.peak_memory_bytes / (1024.0 * 1024 * 1024) << "," << r.estimate_step_s << ","
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
  // Each shard simulated its own best K by estimate, so the best K overall are among them:
  // keep, per (grid point, GPU count), the K best estimates — exactly what one run simulates.
  std::map<std::pair<std::string, int64_t>, std::vector<SweepRow>> groups;
  for (SweepRow& row : rows) groups[{row.point.dump(), row.gpus}].push_back(std::move(row));
  for (auto& [key, group] : groups) {
    std::sort(group.begin(), group.end(), [](const SweepRow& a, const SweepRow& b) {
      return a.estimate_step_s != b.estimate_step_s ? a.estimate_step_s < b.estimate_step_s
                                                    : a.key < b.key;
    });
    if (static_cast<int64_t>(group.size()) > merged.top_k)
      group.resize(static_cast<std::size_t>(merged.top_k));
    for (SweepRow& row : group) merged.rows.push_back(std::move(row));
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
  out << "\n\n";
  char line[512];
  const bool points = std::any_of(r.rows.begin(), r.rows.end(),
                                  [](const SweepRow& row) { return !row.point.empty(); });
  std::snprintf(line, sizeof line,
                "%-4s %-5s %-14s %-56s %-4s %-5s %-9s %-11s %-9s %-6s %-9s %-7s %-6s\n", "#",
                "GPUs", "placement", "layout", "MBS", "GBS", "step (s)", "tokens/s", "TFLOP/s",
                "MFU", "memory", "idle %", "mb CV");
  out << line;
  for (std::size_t i = 0; i < r.rows.size() && i < shown; ++i) {
    const SweepRow& row = r.rows[i];
    if (points && (i == 0 || row.point != r.rows[i - 1].point)) {
      std::string where;
      for (const auto& item : row.point.items())
        where += (where.empty() ? "" : ", ") + item.key() + "=" + item.value().dump();
      out << "at " << where << ":\n";
    }
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
                    human_bytes(row.peak_memory_bytes).c_str(), 100 * row.bubble,
                    row.llm_microbatch_cv);
    }
    out << line;
  }
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
  // The best homogeneous plan beside the best heterogeneous one.
  const SweepRow* homogeneous = nullptr;
  const SweepRow* heterogeneous = nullptr;
  for (const SweepRow& row : r.rows) {
    if (!row.ok) continue;
    if (row.plan.placement == Placement::kHomogeneous && homogeneous == nullptr) homogeneous = &row;
    if (row.plan.placement != Placement::kHomogeneous && heterogeneous == nullptr)
      heterogeneous = &row;
  }
  if (homogeneous != nullptr && heterogeneous != nullptr) {
    std::snprintf(line, sizeof line,
                  "\nbest heterogeneous (%s, %s) vs best homogeneous (%s): %.2fx tokens/s\n",
                  enum_name(heterogeneous->plan.placement, kPlacements).c_str(),
                  describe_layout(heterogeneous->plan, s.model).c_str(),
                  describe_layout(homogeneous->plan, s.model).c_str(),
                  heterogeneous->tokens_per_s / homogeneous->tokens_per_s);
    out << line;
  }
  if (r.enumerate_s + r.estimate_s + r.simulate_s > 0) {
    auto rate = [](double n, double seconds) { return seconds > 0 ? n / seconds : 0.0; };
    std::snprintf(line, sizeof line,
                  "\ntiming: enumerated and validated %lld in %.2f s (%.0f/s), estimated %lld in "
                  "%.2f s (%.0f/s), "
                  "simulated %lld in %.2f s (%.1f/s)\n",
                  static_cast<long long>(r.considered), r.enumerate_s,
                  rate(static_cast<double>(r.considered), r.enumerate_s),
                  static_cast<long long>(r.valid), r.estimate_s,
                  rate(static_cast<double>(r.valid), r.estimate_s),
                  static_cast<long long>(r.simulated), r.simulate_s,
                  rate(static_cast<double>(r.simulated), r.simulate_s));
    out << line;
  }
  out << "\nreport: " << r.out_dir
      << "/report.html (also results.jsonl, results.csv, summary.json)\n";
  return out.str();
}

}  // namespace tessera::sim

// The running half of tessera sweep: the chosen plans (sweep_plan.hpp) simulated in child
// processes, each result appended to results.jsonl as it finishes, then the outputs written
// (sweep_outputs.cpp).
#include "sim/sweep.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "shared/base/failpoint.hpp"
#include "shared/search/scenario_report.hpp"
#include "sim/child_process.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep_families.hpp"
#include "sim/sweep_plan.hpp"

namespace tessera::sim {

namespace {

// (In a child process.) One chosen plan simulated, its metrics averaged over the iterations.
Json simulation_summary(const ChosenPlan& chosen, const SweepOptions& options) {
  const Candidate* c = &chosen.ranked.candidate;
  Scenario sized = *chosen.scenario;
  sized.cluster = cluster_with_devices(sized.cluster, c->gpus);
  SimulateOptions sim;
  sim.iterations = options.iterations;
  sim.nested = options.nested;
  sim.timeout_s = options.timeout_s;
  sim.cost = options.cost;
  // Already inside a child: run each iteration's engine in a grandchild as usual.
  const SimulationResult r = simulate(sized, c->plan, sim);
  Json j = {{"feasible", r.feasible}, {"reason", r.reason}};
  if (r.feasible) {
    double tokens = 0, tflops = 0, mfu = 0, idle = 0, memory = 0, compute = 0, busiest = 0,
           exposed = 0, boundary = 0, cv = 0, max_over_mean = 0;
    const std::string llm_name = find_llm(sized.model)->name;
    for (const SimulatedIteration& it : r.iterations) {
      for (const MicrobatchVariability& v : it.metrics.microbatch_variability)
        if (v.module == llm_name) {
          cv += v.cv;
          max_over_mean += v.max_over_mean;
        }
      // bubble = idle / busy per rank, so a rank computes step / (1 + bubble) and sits idle
      // bubble / (1 + bubble) of the step
      const auto& b = it.metrics.bubble;
      double most = 0;
      for (double x : b) {
        const double busy = it.metrics.step_s / (1 + x);
        compute += busy / static_cast<double>(b.size());
        idle += x / (1 + x) / static_cast<double>(b.size());
        most = std::max(most, busy);
      }
      busiest += most;
      exposed += it.metrics.exposed_comm_mean_s;
      boundary += it.metrics.exposed_boundary_mean_s;
      tokens += it.metrics.tokens_per_s;
      tflops += it.metrics.tflops_per_device;
      mfu += it.metrics.mfu;
      memory = std::max(memory,
                        it.metrics.memory[static_cast<std::size_t>(it.metrics.peak_rank)].total());
    }
    const double n = static_cast<double>(r.iterations.size());
    j.update({{"step_s", r.step_mean_s},
              {"tokens_per_s", tokens / n},
              {"tflops_per_device", tflops / n},
              {"mfu", mfu / n},
              {"idle_share", idle / n},
              {"peak_memory_bytes", memory},
              {"compute_s", compute / n},
              {"compute_max_s", busiest / n},
              {"exposed_comm_s", exposed / n},
              {"exposed_boundary_s", boundary / n},
              {"llm_microbatch_cv", cv / n},
              {"llm_microbatch_max_over_mean", max_over_mean / n}});
  }
  return j;
}

// The row of a chosen plan from its child's result.
SweepRow row_of(const ChosenPlan& chosen, const ChildResult& child) {
  const RankedCandidate& c = chosen.ranked;
  SweepRow row;
  row.key = c.candidate.key;
  row.point = chosen.point;
  row.gpus = c.candidate.gpus;
  row.global_batch = chosen.scenario->workload.global_batch;
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
      row.idle_share = j.at("idle_share").get<double>();
      row.peak_memory_bytes = j.at("peak_memory_bytes").get<double>();
      row.compute_s = j.at("compute_s").get<double>();
      row.compute_max_s = j.at("compute_max_s").get<double>();
      row.exposed_comm_s = j.at("exposed_comm_s").get<double>();
      row.exposed_boundary_s = j.at("exposed_boundary_s").get<double>();
      row.llm_microbatch_cv = j.at("llm_microbatch_cv").get<double>();
      row.llm_microbatch_max_over_mean = j.at("llm_microbatch_max_over_mean").get<double>();
    }
  }
  return row;
}

}  // namespace

SweepResult run_sweep(const Scenario& base, const SweepOptions& options,
                      const SweepProgress& progress) {
  SweepResult result;
  result.out_dir = options.out_dir;
  std::vector<ChosenPlan> chosen = plan_sweep(base, options, result, progress);
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
  std::vector<const ChosenPlan*> todo;
  for (const ChosenPlan& c : chosen)
    if (!done.contains(c.ranked.candidate.key)) todo.push_back(&c);

  std::vector<std::function<std::string()>> tasks;
  for (const ChosenPlan* chosen_one : todo)
    tasks.push_back([chosen_one, &options, index = static_cast<int64_t>(tasks.size())] {
      // (Runs in a child process.) A test's injected crash of this simulation.
      if (failpoint("sweep-simulation-crash", index)) std::raise(SIGSEGV);
      return simulation_summary(*chosen_one, options).dump();
    });
  std::ofstream out(jsonl, std::ios::app);
  std::string write_error;  // the first failed append (reported once the children are done)
  std::size_t finished = 0;
  const auto simulation_start = std::chrono::steady_clock::now();
  result.simulated = static_cast<int64_t>(tasks.size());
  if (!tasks.empty()) progress("simulated", "", 0, tasks.size(), "", false);
  run_children(
      tasks, options.jobs, options.timeout_s * static_cast<double>(options.iterations) + 60,
      [&](std::size_t i, const ChildResult& child) {
        const SweepRow row = row_of(*todo[i], child);
        out << row_to_json(row).dump() << "\n";
        out.flush();  // streamed: an interruption loses at most the running simulations
        if (!out && write_error.empty())
          write_error = "cannot append to " + jsonl.string() +
                        " (disk full?); the rows before stay, --resume continues";
        result.rows.push_back(row);
        const std::string line =
            describe_layout(row.plan, s.model) +
            (row.ok ? ": step " + std::to_string(row.step_s) + " s" : ": failed: " + row.failure);
        progress("simulated", "", ++finished, todo.size(), line, !row.ok);
      });
  result.simulate_s = seconds_since(simulation_start);
  if (!write_error.empty()) throw std::runtime_error(write_error);
  sort_rows(result.rows);
  // The report's timelines: each family's best, one step op by op.
  for (const auto& group : family_bests(result.rows))
    for (const SweepRow* row : group) {
      Diagnostics diag;
      std::optional<Scenario> here = scenario_at(s, row->point, diag);
      if (!here) continue;
      here->cluster = cluster_with_devices(here->cluster, row->gpus);
      result.pictures[row->key] = step_picture(
          *here, row->plan, options.cost ? *options.cost : default_cost_params(here->cluster));
    }
  write_sweep_outputs(result, s, options.scenario_file);
  return result;
}

}  // namespace tessera::sim

#include "sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "shared/records/profile_report.hpp"
#include "shared/records/trace_writer.hpp"
#include "shared/search/scenario_report.hpp"
#include "shared/search/stage_split.hpp"
#include "sim/child_process.hpp"
#include "sim/periodic.hpp"
#include "sim/timeline_codec.hpp"

namespace tessera::sim {

namespace {

// Whether a calibration profile makes single op instances vary (FitStats::spread): each rank
// draws its own factors.
bool varies(const CostParams& params) {
  const auto spread = [](const auto& fits) {
    return std::any_of(fits.begin(), fits.end(),
                       [](const auto& f) { return !f.stats.spread.empty(); });
  };
  return spread(params.compute_fits) || spread(params.collective_fits) || spread(params.p2p_fits) ||
         (params.optimizer_fit && !params.optimizer_fit->stats.spread.empty());
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

SimulationResult simulate(const Scenario& s, const ParallelPlan& given,
                          const SimulateOptions& options) {
  SimulationResult result;
  // The frozen-aware stage boundaries, from these costs (a resolved plan is kept as it is).
  const ParallelPlan plan = resolve_stage_split(given, s.model, s.workload, s.cluster,
                                                options.cost ? &*options.cost : nullptr);
  const CostModel cost(s.cluster, s.model.dtype,
                       options.cost ? *options.cost : default_cost_params(s.cluster), s.model);
  std::vector<Program> programs;
  std::vector<Timeline> timelines;
  // DIP re-plans every iteration: a search for its batch from the previous batch's schedule.
  std::optional<DipPlanner> dip_planner;
  DipSchedule dip_schedule;
  if (plan.schedule == Schedule::kDip) dip_planner.emplace(s, plan, cost);
  const int64_t count =
      options.batches.empty() ? options.iterations : static_cast<int64_t>(options.batches.size());
  // Identical ranks fold into one class (exact: each member's transfers still run as flows)
  // unless every rank's timeline is wanted, a profile's measured spread makes each rank's ops
  // vary on their own, or the ranks share one machine's cores.
  const bool fold = options.trace_dir.empty() && !options.keep_timelines &&
                    !varies(cost.params()) && s.cluster.kind != ClusterKind::kCpuLocal;
  for (int64_t k = 0; k < count; ++k) {
    const auto started = std::chrono::steady_clock::now();
    const Batch batch = options.batches.empty()
                            ? draw_batch(s.workload, options.first_iteration + k)
                            : options.batches[static_cast<std::size_t>(k)];
    const int64_t iteration = batch.iteration;
    std::optional<DipSearchResult> search;
    if (dip_planner && !options.dip_schedules.empty()) {
      dip_schedule = options.dip_schedules.at(static_cast<std::size_t>(k));  // a recorded run's
    } else if (dip_planner) {
      search = dip_planner->search(batch, dip_schedule);
      if (search->error.empty()) dip_schedule = search->schedule;
    }
    Lowered lowered =
        lower(s.model, s.cluster, plan, s.workload, batch, dip_planner ? &dip_schedule : nullptr,
              fold ? RankFolding::kIdentical : RankFolding::kOff);
    if (!lowered.error.empty()) {
      result.reason = lowered.error;
      result.failure = PlanFailure::kRefused;
      return result;
    }
    if (k == 0) {
      result.notes = lowered.notes;
      if (options.cost)
        for (std::string& note :
             profile_coverage(*options.cost, lowered.program, s.model, s.cluster))
          result.notes.push_back(std::move(note));
    }
    const Program& p = lowered.program;
    const double lower_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const bool tell = options.progress && lower_s >= 1;
    if (tell)
      options.progress("iteration " + std::to_string(iteration) + " (" + std::to_string(k + 1) +
                       " of " + std::to_string(count) + "): " + lowering_note(p, lower_s) +
                       "; simulating");
    // Memory first: a plan that does not fit is reported, not simulated.
    const std::vector<RankMemory> memory = memory_per_rank(p);
    result.capacity_bytes = memory_capacity_bytes(s.cluster, p.world);
    const auto worst = std::max_element(
        memory.begin(), memory.end(),
        [](const RankMemory& a, const RankMemory& b) { return a.total() < b.total(); });
    if (worst->total() > result.capacity_bytes) {
      result.failure = PlanFailure::kOutOfMemory;
      result.reason = "infeasible: rank " + std::to_string(worst - memory.begin()) + " needs " +
                      memory_parts(*worst) + " > " + human_bytes(result.capacity_bytes) +
                      " in iteration " + std::to_string(iteration);
      return result;
    }
    RunOptions run{options.contention, options.nested == NestedMode::kFlows};
    // cpu-local plans run on the Gloo executor, whose one thread per rank issues ops in order.
    run.serial_host = s.cluster.kind == ClusterKind::kCpuLocal;
    ChildResult child;
    Timeline t;
    using NestedCheck = SimulatedIteration::NestedCheck;
    NestedCheck check = NestedCheck::kNone;
    const bool nested = std::any_of(p.ranks.begin(), p.ranks.end(), [](const auto& rank_ops) {
      return std::any_of(rank_ops.begin(), rank_ops.end(),
                         [](const Op& op) { return !op.nested.empty(); });
    });
    const auto simulate_once = [&](const Program& program) {
      child = run_in_child([&] { return serialize_timeline(run_program(program, cost, run)); },
                           options.timeout_s);
      if (child.ok) t = deserialize_timeline(child.output, program);
    };
    const auto simulate_program = [&](const Program& program) {
      run.nested_flows = options.nested == NestedMode::kFlows;
      simulate_once(program);
      check = NestedCheck::kNone;
      if (child.ok && nested && options.contention && !run.nested_flows)
        check = t.nested_shared_links ? NestedCheck::kShared : NestedCheck::kAlone;
      if (child.ok && t.error.empty() && options.nested == NestedMode::kAuto &&
          check == NestedCheck::kShared) {
        // Timed nested collectives may have met other transfers on their links: flows decide.
        run.nested_flows = true;
        simulate_once(program);
      }
    };
    SimulatedIteration it;
    // Alike micro-batches in a 1F1B pipeline: a shortened batch's steady phase stands for the
    // full batch's where it repeats; elsewhere the full batch runs.
    std::optional<PeriodicShortening> shortening;
    if (fold && options.periodic) shortening = periodic_shortening(s, plan, batch, p);
    if (shortening) {
      const Lowered short_run = lower(s.model, s.cluster, shortening->plan, shortening->workload,
                                      shortening->batch, nullptr, RankFolding::kIdentical);
      if (short_run.error.empty()) {
        simulate_program(short_run.program);
        if (child.ok && t.error.empty()) {
          PeriodicExtension extended = extend_periodic(p, short_run.program, t, *shortening);
          it.microbatches = shortening->full_microbatches;
          if (extended.failure.empty()) {
            t = std::move(extended.timeline);
            it.simulated_microbatches = shortening->microbatches;
            it.period_microbatches = extended.period_microbatches;
            it.period_s = extended.period_s;
          } else {
            it.periodic_failure = extended.failure;
          }
        }
      } else {
        it.periodic_failure = short_run.error;
      }
    }
    if (it.simulated_microbatches == 0) simulate_program(p);
    if (!child.ok) {
      result.failure = PlanFailure::kFailed;
      result.reason =
          "simulation of iteration " + std::to_string(iteration) + " failed: " + child.error;
      return result;
    }
    if (!t.error.empty()) {
      result.failure = PlanFailure::kFailed;
      result.reason = "iteration " + std::to_string(iteration) + ": " + t.error;
      return result;
    }
    it.iteration = iteration;
    it.metrics = compute_metrics(p, t, s.model, s.cluster, batch);
    it.estimate_step_s = evaluate(p, cost).step_s;
    it.ops = op_count(p);
    it.activities = t.activities;
    it.folded_flows = t.folded_flows;
    it.nested_flows = run.nested_flows;
    it.nested_check = check;
    it.actors = t.actors;
    it.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (tell) {
      char text[96];
      std::snprintf(text, sizeof text, ": simulated, %.1f s in all", it.wall_s);
      options.progress("iteration " + std::to_string(iteration) + text);
    }
    it.dip = std::move(search);
    result.iterations.push_back(std::move(it));
    if (!options.trace_dir.empty() || options.keep_timelines) {
      programs.push_back(std::move(lowered.program));
      timelines.push_back(std::move(t));
    }
  }
  result.feasible = true;
  std::vector<double> steps;
  for (const SimulatedIteration& it : result.iterations) steps.push_back(it.metrics.step_s);
  double sum = 0;
  for (double x : steps) sum += x;
  result.step_mean_s = sum / static_cast<double>(steps.size());
  result.step_p50_s = quantile(steps, 0.5);
  result.step_p95_s = quantile(steps, 0.95);
  if (!options.trace_dir.empty()) {
    std::vector<TraceIteration> traced;
    double offset = 0;
    for (std::size_t k = 0; k < programs.size(); ++k) {
      traced.push_back({&programs[k], &timelines[k], offset});
      offset += timelines[k].step_s;
    }
    result.trace_error = write_chrome_traces(options.trace_dir, traced, "sim");
  }
  if (options.keep_timelines) {
    result.programs = std::move(programs);
    result.timelines = std::move(timelines);
  }
  return result;
}

}  // namespace tessera::sim

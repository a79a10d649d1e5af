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

// Counters, then every op's start and finish, then each rank's nested slices (count first),
// then the error text.
std::string serialize_timeline(const Timeline& t) {
  std::string out;
  out.append(reinterpret_cast<const char*>(&t.activities), sizeof t.activities);
  out.append(reinterpret_cast<const char*>(&t.actors), sizeof t.actors);
  out.append(reinterpret_cast<const char*>(&t.folded_flows), sizeof t.folded_flows);
  const int64_t shared = t.nested_shared_links ? 1 : 0;
  out.append(reinterpret_cast<const char*>(&shared), sizeof shared);
  for (const auto& ops : t.ops)
    for (const OpTime& o : ops) out.append(reinterpret_cast<const char*>(&o), sizeof o);
  for (std::size_t r = 0; r < t.ops.size(); ++r) {
    const int64_t n = r < t.nested.size() ? static_cast<int64_t>(t.nested[r].size()) : 0;
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    for (int64_t k = 0; k < n; ++k)
      out.append(reinterpret_cast<const char*>(&t.nested[r][static_cast<std::size_t>(k)]),
                 sizeof(NestedSlice));
  }
  return out + t.error;
}

Timeline deserialize_timeline(const std::string& bytes, const Program& p) {
  Timeline t;
  std::size_t at = 4 * sizeof(int64_t);
  if (bytes.size() < at) {
    t.error = "simulation returned no timeline";
    return t;
  }
  std::memcpy(&t.activities, bytes.data(), sizeof t.activities);
  std::memcpy(&t.actors, bytes.data() + sizeof t.activities, sizeof t.actors);
  std::memcpy(&t.folded_flows, bytes.data() + 2 * sizeof(int64_t), sizeof t.folded_flows);
  int64_t shared = 0;
  std::memcpy(&shared, bytes.data() + 3 * sizeof(int64_t), sizeof shared);
  t.nested_shared_links = shared != 0;
  t.ops.resize(p.ranks.size());
  t.compute_busy_s.assign(p.ranks.size(), 0);
  t.peak_activation_bytes.assign(p.ranks.size(), 0);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    t.ops[r].resize(p.ranks[r].size());
    for (std::size_t i = 0; i < p.ranks[r].size(); ++i) {
      if (at + sizeof(OpTime) > bytes.size()) {
        t.error = "simulation returned a truncated timeline";
        return t;
      }
      std::memcpy(&t.ops[r][i], bytes.data() + at, sizeof(OpTime));
      at += sizeof(OpTime);
      const OpTime& o = t.ops[r][i];
      t.step_s = std::max(t.step_s, o.finish_s);
      if (p.ranks[r][i].stream == StreamKind::kCompute && p.ranks[r][i].kind != OpKind::kRecv)
        t.compute_busy_s[r] += o.finish_s - o.start_s;
    }
  }
  for (std::size_t r = 0; r < p.ranks.size(); ++r)  // a folded Program's represented ranks
    t.compute_busy_s[r] =
        t.compute_busy_s[static_cast<std::size_t>(representative(p, static_cast<int64_t>(r)))];
  t.nested.resize(p.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    int64_t n = 0;
    if (at + sizeof n > bytes.size()) {
      t.error = "simulation returned a truncated timeline";
      return t;
    }
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (n < 0 || at + static_cast<std::size_t>(n) * sizeof(NestedSlice) > bytes.size()) {
      t.error = "simulation returned a truncated timeline";
      return t;
    }
    t.nested[r].resize(static_cast<std::size_t>(n));
    if (n > 0)
      std::memcpy(t.nested[r].data(), bytes.data() + at,
                  static_cast<std::size_t>(n) * sizeof(NestedSlice));
    at += static_cast<std::size_t>(n) * sizeof(NestedSlice);
  }
  t.error = bytes.substr(at);
  return t;
}

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

namespace {

// How far the simulation landed from the contention-free estimate of the same Programs, and why.
std::string against_estimate(const SimulationResult& r, const ClusterSpec& cluster) {
  double simulated = 0, estimated = 0;
  for (const SimulatedIteration& it : r.iterations) {
    simulated += it.metrics.step_s;
    estimated += it.estimate_step_s;
  }
  const auto n = static_cast<double>(r.iterations.size());
  const double gap = estimated > 0 ? simulated / estimated - 1 : 0;
  char line[320];
  if (std::fabs(gap) < 1e-9)
    std::snprintf(line, sizeof line,
                  "against the estimate: equal (%.4g s mean): no transfer was slowed by another\n",
                  estimated / n);
  else if (gap > 0)
    std::snprintf(line, sizeof line,
                  "against the estimate: %+.2f%% (%.4g s mean, every transfer priced alone): "
                  "transfers met on links and NICs and slowed each other\n",
                  100 * gap, estimated / n);
  else if (cluster.inter_node.oversubscription > 1)
    std::snprintf(line, sizeof line,
                  "against the estimate: %+.2f%% (%.4g s mean): the estimate prices cross-node "
                  "transfers at an oversubscribed uplink's full-load share; fewer met on the "
                  "uplinks here\n",
                  100 * gap, estimated / n);
  else
    std::snprintf(line, sizeof line,
                  "against the estimate: %+.2f%% (%.4g s mean): transfers as flows on the "
                  "simulated links finished sooner than the estimate prices them\n",
                  100 * gap, estimated / n);
  return line;
}

}  // namespace

std::string format_simulation(const SimulationResult& r, const Scenario& s) {
  std::string out;
  for (const std::string& note : r.notes) out += "note: " + note + "\n";
  if (!r.feasible) return out + r.reason + "\n";
  char line[256];
  out +=
      "iteration   step (s)   samples/s   TFLOP/s/dev   MFU     idle/busy   ops       activities  "
      "actors   wall (s)\n";
  for (const SimulatedIteration& it : r.iterations) {
    std::snprintf(line, sizeof line,
                  "%-11lld %-10.4g %-11.4g %-13.4g %-7.1f %-11.3f %-9lld %-11lld %-8lld %.3f\n",
                  static_cast<long long>(it.iteration), it.metrics.step_s, it.metrics.samples_per_s,
                  it.metrics.tflops_per_device, 100 * it.metrics.mfu, it.metrics.bubble_mean,
                  static_cast<long long>(it.ops), static_cast<long long>(it.activities),
                  static_cast<long long>(it.actors), it.wall_s);
    out += line;
  }
  std::snprintf(line, sizeof line,
                "step time over %zu iterations: mean %.4g s, p50 %.4g s, p95 %.4g s\n",
                r.iterations.size(), r.step_mean_s, r.step_p50_s, r.step_p95_s);
  out += line;
  out += against_estimate(r, s.cluster) + "\n";
  if (r.iterations.front().dip) {
    // How the per-iteration re-planning went: each search starts from the previous schedule.
    double seconds = 0, gain = 0;
    int64_t scored = 0, cached = 0;
    for (const SimulatedIteration& it : r.iterations) {
      seconds += it.dip->seconds;
      scored += it.dip->scored;
      cached += it.dip->cached;
      gain += it.dip->step_s > 0 ? it.dip->start_step_s / it.dip->step_s : 1;
    }
    const auto n = static_cast<double>(r.iterations.size());
    std::snprintf(line, sizeof line,
                  "dip re-planned every iteration: search %.3g s mean, %.1f schedules scored "
                  "(%.1f cached), evaluator step %.3fx faster than the schedule it started from\n",
                  seconds / n, static_cast<double>(scored) / n, static_cast<double>(cached) / n,
                  gain / n);
    out += line;
    out += "dip schedule of the last iteration: " +
           describe_dip_schedule(r.iterations.back().dip->schedule, s.model) + "\n\n";
  }
  if (r.iterations.front().folded_flows > 0)
    out += "symmetry: " + std::to_string(r.iterations.front().folded_flows) +
           " flows of TP twins were not simulated; their class leader's identical flows stood "
           "for them (exact: no link is shared between them)\n\n";
  {
    // Periodic folding: how many iterations a short run stood for, and why one could not.
    const SimulatedIteration& first = r.iterations.front();
    const auto folded = std::count_if(r.iterations.begin(), r.iterations.end(),
                                      [](const auto& it) { return it.simulated_microbatches > 0; });
    if (folded > 0) {
      std::snprintf(line, sizeof line,
                    "periodic steady state: in %lld of %zu iterations, %d of %d micro-batches per "
                    "pipeline simulated; the others repeat its steady phase (a period of %d "
                    "micro-batch%s, %.4g s), checked op by op around the cut\n\n",
                    static_cast<long long>(folded), r.iterations.size(),
                    first.simulated_microbatches, first.microbatches, first.period_microbatches,
                    first.period_microbatches == 1 ? "" : "es", first.period_s);
      out += line;
    }
    for (const SimulatedIteration& it : r.iterations)
      if (!it.periodic_failure.empty()) {
        out += "periodic steady state: not found in iteration " + std::to_string(it.iteration) +
               " (" + it.periodic_failure + "); all " + std::to_string(it.microbatches) +
               " micro-batches simulated\n\n";
        break;
      }
  }
  int64_t alone = 0, retried = 0, shared = 0;
  for (const SimulatedIteration& it : r.iterations) {
    using NestedCheck = SimulatedIteration::NestedCheck;
    alone += it.nested_check == NestedCheck::kAlone;
    retried += it.nested_check == NestedCheck::kShared && it.nested_flows;
    shared += it.nested_check == NestedCheck::kShared && !it.nested_flows;
  }
  const auto n = std::to_string(r.iterations.size());
  if (alone > 0)
    out += "nested collectives: timed in " + std::to_string(alone) + " of " + n +
           " iterations, alone on their links there, so ring flows would give the same times\n";
  if (retried > 0)
    out += "nested collectives: ring flows in " + std::to_string(retried) + " of " + n +
           " iterations, where timed ones would have met other transfers on their links\n";
  if (shared > 0)
    out += "nested collectives: timed; other transfers used their links meanwhile in " +
           std::to_string(shared) + " of " + n +
           " iterations, where ring flows can differ (--nested auto or flows)\n";
  if (alone + retried + shared > 0) out += "\n";
  // The iteration closest to the median, in full.
  const SimulatedIteration* median = &r.iterations.front();
  for (const SimulatedIteration& it : r.iterations)
    if (std::fabs(it.metrics.step_s - r.step_p50_s) <
        std::fabs(median->metrics.step_s - r.step_p50_s))
      median = &it;
  out += "iteration " + std::to_string(median->iteration) + " (median):\n";
  out += format_metrics(median->metrics, s.cluster, s.model.dtype, r.capacity_bytes);
  if (!r.trace_error.empty()) out += "trace: " + r.trace_error + "\n";
  return out;
}

Json simulation_to_json(const SimulationResult& r) {
  Json j;
  j["feasible"] = r.feasible;
  if (!r.reason.empty()) j["reason"] = r.reason;
  j["notes"] = r.notes;
  j["step_mean_s"] = r.step_mean_s;
  j["step_p50_s"] = r.step_p50_s;
  j["step_p95_s"] = r.step_p95_s;
  Json iterations = Json::array();
  for (const SimulatedIteration& it : r.iterations) {
    const IterationMetrics& m = it.metrics;
    Json busy = Json::object();
    for (const auto& [module, seconds] : m.module_busy_s) busy[module] = seconds;
    Json variability = Json::object();
    for (const MicrobatchVariability& v : m.microbatch_variability)
      variability[v.module] = {{"cv", v.cv}, {"max_over_mean", v.max_over_mean}};
    Json path = Json::array();
    for (const Contributor& c : m.critical_path)
      path.push_back({{"what", c.what}, {"seconds", c.seconds}});
    Json memory = Json::array();
    for (const RankMemory& mem : m.memory) memory.push_back(mem.total());
    iterations.push_back({{"iteration", it.iteration},
                          {"step_s", m.step_s},
                          {"estimate_step_s", it.estimate_step_s},
                          {"samples_per_s", m.samples_per_s},
                          {"tokens_per_s", m.tokens_per_s},
                          {"text_tokens_per_s", m.text_tokens_per_s},
                          {"image_tokens_per_s", m.image_tokens_per_s},
                          {"audio_tokens_per_s", m.audio_tokens_per_s},
                          {"video_tokens_per_s", m.video_tokens_per_s},
                          {"tflops_per_device", m.tflops_per_device},
                          {"mfu", m.mfu},
                          {"bubble_per_rank", m.bubble},
                          {"exposed_comm_s_per_rank", m.exposed_comm_s},
                          {"module_busy_s", busy},
                          {"microbatch_variability", variability},
                          {"peak_memory_bytes_per_rank", memory},
                          {"peak_rank", m.peak_rank},
                          {"critical_path", path},
                          {"ops", it.ops},
                          {"activities", it.activities},
                          {"folded_flows", it.folded_flows},
                          {"nested_collectives", it.nested_flows ? "flows" : "timed"},
                          {"actors", it.actors},
                          {"simulated_microbatches", it.simulated_microbatches},
                          {"wall_s", it.wall_s}});
    if (!it.periodic_failure.empty()) iterations.back()["periodic_failure"] = it.periodic_failure;
    if (it.dip)
      iterations.back()["dip_search"] = {{"scored", it.dip->scored},
                                         {"cached", it.dip->cached},
                                         {"seconds", it.dip->seconds},
                                         {"start_step_s", it.dip->start_step_s},
                                         {"step_s", it.dip->step_s},
                                         {"lookahead", it.dip->schedule.lookahead},
                                         {"in_flight", it.dip->schedule.in_flight},
                                         {"encoders_first", it.dip->schedule.encoders_first}};
  }
  j["iterations"] = iterations;
  return j;
}

}  // namespace tessera::sim

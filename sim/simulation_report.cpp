#include "sim/simulation_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tessera::sim {

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
           " flows were not simulated: each is a simulated flow moved to other ranks, started "
           "by the same op, whose links no other flow shares, so it takes the same time\n\n";
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

#include "shared/search/estimate.hpp"

#include <chrono>
#include <cstdio>
#include <numeric>
#include <optional>

#include "shared/cost/evaluator.hpp"
#include "shared/search/dip_search.hpp"
#include "shared/search/scenario_report.hpp"
#include "shared/search/stage_split.hpp"

namespace tessera {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

EvaluatedStep evaluate_step(const Scenario& s, const ParallelPlan& given, int64_t iteration,
                            const CostParams& params,
                            const std::function<void(const std::string&)>& progress) {
  EvaluatedStep step;
  const auto t0 = std::chrono::steady_clock::now();
  // The frozen-aware stage boundaries, from these costs (a resolved plan is kept as it is).
  const ParallelPlan plan = resolve_stage_split(given, s.model, s.workload, s.cluster, &params);
  step.batch = draw_batch(s.workload, iteration);
  const CostModel cost(s.cluster, s.model.dtype, params, s.model);
  // DIP: this batch's schedule, searched with the evaluator (lowering time includes it).
  if (plan.schedule == Schedule::kDip) {
    DipPlanner planner(s, plan, cost);
    step.dip = planner.search(step.batch, DipSchedule{});
  }
  // Identical ranks fold into one (exact: the evaluator gives each the times it would).
  step.lowered = lower(s.model, s.cluster, plan, s.workload, step.batch,
                       step.dip ? &step.dip->schedule : nullptr, RankFolding::kIdentical);
  step.lower_s = seconds_since(t0);
  if (!step.lowered.error.empty()) return step;
  if (progress && step.lower_s >= 1)
    progress(lowering_note(step.lowered.program, step.lower_s) + "; evaluating");
  const auto t1 = std::chrono::steady_clock::now();
  step.timeline = evaluate(step.lowered.program, cost);
  step.evaluate_s = seconds_since(t1);
  return step;
}

Estimate estimate(const Scenario& s, const ParallelPlan& given, int64_t iteration,
                  const CostParams& params,
                  const std::function<void(const std::string&)>& progress) {
  Estimate e;
  const EvaluatedStep step = evaluate_step(s, given, iteration, params, progress);
  e.lower_s = step.lower_s;
  e.evaluate_s = step.evaluate_s;
  e.notes = step.lowered.notes;
  if (step.dip && step.dip->error.empty())
    e.notes.push_back(describe_dip_search(*step.dip, s.model));
  if (!step.lowered.error.empty()) {
    e.reason = step.lowered.error;
    e.failure = PlanFailure::kRefused;
    return e;
  }
  const Program& p = step.lowered.program;
  const Timeline& timeline = step.timeline;
  const Batch& batch = step.batch;
  e.ops = op_count(p);
  e.ranks_lowered = lowered_ranks(p);
  if (!timeline.error.empty()) {
    e.reason = timeline.error;
    e.failure = PlanFailure::kFailed;
    return e;
  }
  e.metrics = compute_metrics(p, timeline, s.model, s.cluster, batch);
  e.peak_memory = e.metrics.memory[static_cast<std::size_t>(e.metrics.peak_rank)];
  e.capacity_bytes = memory_capacity_bytes(s.cluster, p.world);
  const double worst = e.peak_memory.total();
  e.feasible = worst <= e.capacity_bytes;
  if (!e.feasible) {
    e.failure = PlanFailure::kOutOfMemory;
    e.reason = "rank " + std::to_string(e.metrics.peak_rank) + " needs " +
               memory_parts(e.peak_memory) + " > " + human_bytes(e.capacity_bytes);
  }
  return e;
}

std::string lowering_note(const Program& p, double seconds) {
  const int64_t ops = op_count(p), lowered = lowered_ranks(p);
  char text[128];
  if (lowered == p.world)
    std::snprintf(text, sizeof text, "lowered %.3g M ops on %lld ranks in %.1f s",
                  static_cast<double>(ops) / 1e6, static_cast<long long>(p.world), seconds);
  else
    std::snprintf(text, sizeof text, "lowered %.3g M ops on %lld ranks standing for %lld in %.1f s",
                  static_cast<double>(ops) / 1e6, static_cast<long long>(lowered),
                  static_cast<long long>(p.world), seconds);
  return text;
}

double memory_capacity_bytes(const ClusterSpec& cluster, int64_t world) {
  const double device = static_cast<double>(cluster.device.memory_bytes);
  // cpu-local ranks share the machine's memory.
  return cluster.kind == ClusterKind::kCpuLocal
             ? device / static_cast<double>(std::max<int64_t>(1, world))
             : device;
}

std::string format_metrics(const IterationMetrics& m, const ClusterSpec& cluster, DType dtype,
                           double capacity_bytes) {
  char line[1024];
  std::string out;
  const RankMemory& mem = m.memory[static_cast<std::size_t>(m.peak_rank)];
  std::snprintf(
      line, sizeof line,
      "step time        %.4g s\n"
      "throughput       %.4g samples/s, %.4g tokens/s (text %.4g, image %.4g, audio "
      "%.4g, video %.4g)\n"
      "model TFLOP/s    %.4g per device (MFU %.1f%% of %s dense %s; no "
      "recomputation, attention over the pairs its mask keeps)\n"
      "hardware TFLOP/s %.4g per device (HFU %.1f%%: with recomputation)\n"
      "idle / busy      %.3f (%s, mean over ranks)\n"
      "exposed comm     %.4g s per rank (mean; transfers while the rank computes nothing)\n"
      "peak memory      %s on rank %lld (weights %s, gradients %s, optimizer %s, "
      "activations %s, boundary %s) of %s\n",
      m.step_s, m.samples_per_s, m.tokens_per_s, m.text_tokens_per_s, m.image_tokens_per_s,
      m.audio_tokens_per_s, m.video_tokens_per_s, m.tflops_per_device, 100 * m.mfu,
      (human_si(peak_flops(cluster, dtype)) + "FLOP/s").c_str(), enum_name(dtype, kDTypes).c_str(),
      m.hardware_tflops_per_device, 100 * m.hfu, m.bubble_mean,
      m.pipelined ? "pipeline bubble, load imbalance and waits"
                  : "load imbalance and waits; no pipeline",
      m.exposed_comm_mean_s, human_bytes(mem.total()).c_str(), static_cast<long long>(m.peak_rank),
      human_bytes(mem.weight_bytes).c_str(), human_bytes(mem.gradient_bytes).c_str(),
      human_bytes(mem.optimizer_bytes).c_str(), human_bytes(mem.activation_bytes).c_str(),
      human_bytes(mem.boundary_bytes).c_str(), human_bytes(capacity_bytes).c_str());
  out += line;
  out += "busy per module ";
  for (const auto& [module, seconds] : m.module_busy_s) {
    std::snprintf(line, sizeof line, " %s %.4g s", module.c_str(), seconds);
    out += line;
  }
  out += " (summed over ranks)\n";
  if (!m.microbatch_variability.empty()) {
    out += "micro-batch CV  ";
    for (const MicrobatchVariability& v : m.microbatch_variability) {
      std::snprintf(line, sizeof line, " %s %.3f (max/mean %.3f)", v.module.c_str(), v.cv,
                    v.max_over_mean);
      out += line;
    }
    out += " (stage time per micro-batch, mean over ranks)\n";
  }
  out += "critical path   ";
  double total = 0;
  for (const Contributor& c : m.critical_path) total += c.seconds;
  for (std::size_t i = 0; i < m.critical_path.size() && i < 5; ++i) {
    std::snprintf(line, sizeof line, " %s %.0f%%", m.critical_path[i].what.c_str(),
                  total > 0 ? 100 * m.critical_path[i].seconds / total : 0.0);
    out += (i ? "," : "") + std::string(line);
  }
  return out + "\n";
}

std::string format_estimate(const Estimate& e, const Scenario& s) {
  std::string out;
  for (const std::string& note : e.notes) out += "note: " + note + "\n";
  if (e.metrics.step_s <= 0)
    return out +
           (e.failure == PlanFailure::kRefused  ? "refused: "
            : e.failure == PlanFailure::kFailed ? "failed: "
                                                : "infeasible: ") +
           e.reason + "\n";
  out += format_metrics(e.metrics, s.cluster, s.model.dtype, e.capacity_bytes);
  if (!e.feasible) out += "infeasible: " + e.reason + "\n";
  char line[256];
  const std::string ranks = e.ranks_lowered == static_cast<int64_t>(e.metrics.memory.size())
                                ? std::string()
                                : " on " + std::to_string(e.ranks_lowered) + " of " +
                                      std::to_string(e.metrics.memory.size()) +
                                      " ranks, each standing for those identical to it,";
  std::snprintf(line, sizeof line, "(%lld ops lowered%s in %.3f s, evaluated in %.3f s)\n",
                static_cast<long long>(e.ops), ranks.c_str(), e.lower_s, e.evaluate_s);
  return out + line;
}

}  // namespace tessera

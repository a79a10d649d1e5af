#include "shared/estimate.hpp"

#include <chrono>
#include <cstdio>
#include <numeric>

#include "shared/evaluator.hpp"
#include "shared/scenario_report.hpp"

namespace tessera {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Estimate estimate(const Scenario& s, const ParallelPlan& plan, int64_t iteration, const CostParams& params) {
  Estimate e;
  const auto t0 = std::chrono::steady_clock::now();
  const Batch batch = draw_batch(s.workload, iteration);
  Lowered lowered = lower(s.model, s.cluster, plan, s.workload, batch);
  e.lower_s = seconds_since(t0);
  e.notes = lowered.notes;
  if (!lowered.error.empty()) {
    e.reason = lowered.error;
    return e;
  }
  const Program& p = lowered.program;
  for (const auto& ops : p.ranks) e.ops += static_cast<int64_t>(ops.size());
  std::vector<ModuleRole> roles;
  for (const ModuleSpec& m : s.model.modules) roles.push_back(m.role);
  const CostModel cost(s.cluster, s.model.dtype, params, roles);
  const auto t1 = std::chrono::steady_clock::now();
  const Timeline timeline = evaluate(p, cost);
  e.evaluate_s = seconds_since(t1);
  if (!timeline.error.empty()) {
    e.reason = timeline.error;
    return e;
  }
  e.step_s = timeline.step_s;
  e.samples_per_s = static_cast<double>(p.samples) / e.step_s;
  e.tokens_per_s = static_cast<double>(p.llm_tokens) / e.step_s;
  e.tflops_per_device = p.model_flops / e.step_s / static_cast<double>(p.world) / 1e12;
  e.mfu = e.tflops_per_device * 1e12 / peak_flops(s.cluster, s.model.dtype);
  double bubble = 0;
  for (double busy : timeline.compute_busy_s) bubble += busy > 0 ? (e.step_s - busy) / busy : 0;
  e.bubble = bubble / static_cast<double>(p.world);

  e.capacity_bytes = static_cast<double>(s.cluster.device.memory_bytes);
  if (s.cluster.kind == ClusterKind::kCpuLocal) e.capacity_bytes /= static_cast<double>(p.world);  // ranks share RAM
  double worst = -1;
  for (std::size_t r = 0; r < p.memory.size(); ++r) {
    RankMemory m = p.memory[r];
    m.activation_bytes = timeline.peak_activation_bytes[r];
    if (m.total() > worst) {
      worst = m.total();
      e.peak_rank = static_cast<int64_t>(r);
      e.peak_memory = m;
    }
  }
  e.feasible = worst <= e.capacity_bytes;
  if (!e.feasible) {
    const RankMemory& m = e.peak_memory;
    e.reason = "rank " + std::to_string(e.peak_rank) + " needs " + human_bytes(m.total()) + " > " +
               human_bytes(e.capacity_bytes) + " (weights " + human_bytes(m.weight_bytes) + ", gradients " +
               human_bytes(m.gradient_bytes) + ", optimizer " + human_bytes(m.optimizer_bytes) + ", activations " +
               human_bytes(m.activation_bytes) + ", boundary " + human_bytes(m.boundary_bytes) + ")";
  }
  return e;
}

std::string format_estimate(const Estimate& e, const Scenario& s) {
  char line[512];
  std::string out;
  for (const std::string& note : e.notes) out += "note: " + note + "\n";
  if (e.step_s <= 0) return out + "infeasible: " + e.reason + "\n";
  std::snprintf(line, sizeof line,
                "step time        %.4g s\n"
                "throughput       %.4g samples/s, %.4g tokens/s\n"
                "model TFLOP/s    %.4g per device (MFU %.1f%% of %s dense %s)\n"
                "idle / busy      %.3f (pipeline bubble + load imbalance, mean over ranks)\n"
                "peak memory      %s on rank %lld (weights %s, gradients %s, optimizer %s, activations %s, boundary %s) of %s\n",
                e.step_s, e.samples_per_s, e.tokens_per_s, e.tflops_per_device, 100 * e.mfu,
                (human_si(peak_flops(s.cluster, s.model.dtype)) + "FLOP/s").c_str(), enum_name(s.model.dtype, kDTypes).c_str(),
                e.bubble, human_bytes(e.peak_memory.total()).c_str(), static_cast<long long>(e.peak_rank),
                human_bytes(e.peak_memory.weight_bytes).c_str(), human_bytes(e.peak_memory.gradient_bytes).c_str(),
                human_bytes(e.peak_memory.optimizer_bytes).c_str(), human_bytes(e.peak_memory.activation_bytes).c_str(),
                human_bytes(e.peak_memory.boundary_bytes).c_str(), human_bytes(e.capacity_bytes).c_str());
  out += line;
  if (!e.feasible) out += "infeasible: " + e.reason + "\n";
  std::snprintf(line, sizeof line, "(%lld ops lowered in %.3f s, evaluated in %.3f s)\n", static_cast<long long>(e.ops),
                e.lower_s, e.evaluate_s);
  out += line;
  return out;
}

}  // namespace tessera

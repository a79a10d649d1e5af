// lower(): the driver of one iteration's lowering (lowering.hpp), and the gradient flow of a
// model.
#include <cstdlib>

#include "shared/lowering/lowering.hpp"

namespace tessera {

std::vector<GradientFlow> gradient_flow(const ModelSpec& model) {
  std::vector<GradientFlow> flow(model.modules.size());
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < model.modules.size(); ++i) index[model.modules[i].name] = i;
  // trainable upstream: some module on a path into this one (itself excluded) trains.
  std::function<bool(std::size_t)> trains_upstream_or_self = [&](std::size_t i) {
    const ModuleSpec& m = model.modules[i];
    if (!m.frozen) return true;
    return std::any_of(m.inputs.begin(), m.inputs.end(), [&](const std::string& in) {
      return trains_upstream_or_self(index.at(in));
    });
  };
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const ModuleSpec& m = model.modules[i];
    flow[i].trainable = !m.frozen;
    flow[i].needs_input_grad =
        std::any_of(m.inputs.begin(), m.inputs.end(),
                    [&](const std::string& in) { return trains_upstream_or_self(index.at(in)); });
  }
  return flow;
}

namespace lowering {

void Lowering::run() {
  if (plan_.schedule == Schedule::kDip) {
    // A schedule's layers (from a search, or read back from a run) must fit this plan.
    if (const std::string why =
            dip_schedule_problem(dip_, model_, plan_.layout.pp, plan_.layout.vpp);
        !why.empty()) {
      out_.error = "DIP schedule: " + why;
      return;
    }
  }
  place();
  if (plan_.schedule == Schedule::kDip) {
    if (const std::string why = dip_unsupported(); !why.empty()) {
      out_.error = why;
      return;
    }
  }
  // Under DIP, Entrain's micro-batches are the LLM's (both levels); DIP cuts their media into
  // sub-micro-batches itself, so level 1's encoder micro-batches play no part.
  if (plan_.microbatching == MicrobatchPolicy::kEntrain && plan_.schedule != Schedule::kDip) {
    // The LLM's micro-batch takes rows from its encoder micro-batch and the one before: a
    // producer replica must hold whole LLM micro-batches (fan-in or equal), and the pipeline
    // walks its micro-batches in order (no interleaving).
    const int64_t dp = modules_[static_cast<std::size_t>(llm_)].layout.dp;
    for (const ModuleInfo& m : modules_)
      if (m.host < 0 && m.index != llm_ && plan_.placement == Placement::kNonColocated &&
          m.layout.dp < dp) {
        out_.error = "microbatching entrain: " + m.spec->name + " has fewer replicas (" +
                     std::to_string(m.layout.dp) + ") than the LLM (" + std::to_string(dp) +
                     "); Entrain needs each encoder replica to feed whole LLM micro-batches";
        return;
      }
    for (const ModuleInfo& m : modules_)
      if (m.layout.vpp > 1) {
        out_.error = "microbatching entrain with interleaved 1F1B (vpp > 1) is not lowered yet";
        return;
      }
  }
  const int64_t dp_llm = modules_[static_cast<std::size_t>(llm_)].layout.dp;
  for (const ModuleInfo& m : modules_) {
    const int64_t dp =
        m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)].layout.dp : m.layout.dp;
    if (dp % dp_llm != 0 && dp_llm % dp != 0) {
      out_.error = "module " + m.spec->name + ": dp " + std::to_string(dp) + " and the LLM's dp " +
                   std::to_string(dp_llm) + " must divide one another";
      return;
    }
  }
  if (plan_.placement == Placement::kColocated)
    for (const ModuleInfo& m : modules_)
      if (m.spec->role == ModuleRole::kGenerator && m.host < 0) {
        out_.error = "colocated: give generator '" + m.spec->name +
                     "' no layout of its own; it then runs in the LLM's last pipeline stage";
        return;
      }
  assign_samples();
  if (plan_.schedule == Schedule::kDip)
    lower_dip();
  else if (plan_.placement == Placement::kColocated)
    lower_colocated();
  else
    lower_pipelines();
  TESSERA_CHECK(gather_next_.empty(), "a received activation slice has no compute op to gather it");
  if (!cp_cache_.empty()) {
    // How evenly the CP groups' attention work is spread, against the uniform split: the mean
    // over all micro-batches, and the CP group (data-parallel replica) whose micro-batches are
    // worst on average.
    double chosen = 0, uniform = 0;
    std::map<int64_t, std::array<double, 3>> groups;  // replica -> chosen, uniform, count
    for (const auto& [key, share] : cp_cache_) {
      chosen += share.balance;
      uniform += share.uniform_balance;
      auto& g = groups[share.replica];
      g[0] += share.balance;
      g[1] += share.uniform_balance;
      g[2] += 1;
    }
    std::array<double, 3> worst{0, 0, 1};
    for (const auto& [replica, g] : groups)
      if (g[0] / g[2] > worst[0] / worst[2]) worst = g;
    const auto n = static_cast<double>(cp_cache_.size());
    char line[300];
    std::snprintf(line, sizeof line,
                  "cp_split %s: attention work max/mean over the CP ranks %.3f (uniform split: "
                  "%.3f), mean of %zu micro-batches; worst of %zu CP groups %.3f (uniform: %.3f)",
                  enum_name(plan_.cp_split, kCpSplits).c_str(), chosen / n, uniform / n,
                  cp_cache_.size(), groups.size(), worst[0] / worst[2], worst[1] / worst[2]);
    out_.notes.push_back(line);
  }
  // Model FLOPs of the iteration (recompute excluded), summed over ranks.
  for (const auto& ops : p_.ranks)
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute && op.phase != Phase::kR) p_.model_flops += op.flops;
}

}  // namespace lowering

Lowered lower(const ModelSpec& model, const ClusterSpec& cluster, const ParallelPlan& plan,
              const WorkloadSpec& workload, const Batch& batch, const DipSchedule* dip) {
  Lowered out;
  out.program.iteration = batch.iteration;
  // Frozen-aware stage boundaries (stage_split.hpp), the same for every iteration.
  const ParallelPlan resolved = resolve_stage_split(plan, model, workload, cluster);
  lowering::Lowering(model, cluster, resolved, workload, batch, dip, out).run();
  // Debug builds verify every Program they produce, and so does any build run with
  // TESSERA_CHECK_PROGRAMS set (ctest sets it for every test).
#ifdef NDEBUG
  static const bool verify = std::getenv("TESSERA_CHECK_PROGRAMS") != nullptr;
#else
  constexpr bool verify = true;
#endif
  if (verify && out.error.empty()) {
    const auto problems = check_program(out.program);
    TESSERA_CHECK(problems.empty(), problems.empty() ? std::string() : problems.front());
  }
  return out;
}

}  // namespace tessera

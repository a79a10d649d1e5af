// lower(): the driver of one iteration's lowering (lowering.hpp).
#include <cstdlib>

#include "shared/lowering/lowering.hpp"

namespace tessera {

namespace lowering {

void Lowering::run() {
  Diagnostics diag;
  const std::vector<PlacedModule> placed = place_modules(plan_, model_, "", "", diag);
  TESSERA_CHECK(diag.ok(), "lower() needs a validated plan: " + diag.format());
  out_.error = lowering_refusal(plan_, model_, &dip_, placed);
  if (!out_.error.empty()) return;
  place(placed);
  assign_samples();
  if (folding_ == RankFolding::kIdentical) fold_ranks();
  if (plan_.schedule == Schedule::kDip)
    lower_dip();
  else if (plan_.placement == Placement::kColocated)
    lower_colocated();
  else
    lower_pipelines();
  TESSERA_CHECK(gather_next_.empty(), "a received activation slice has no compute op to gather it");
  if (plan_.moe_a2a_overlap) pair_expert_overlap();
  for (const auto& [key, range] : chunk_held_) {
    const auto [module, stage, chunk] = key;
    p_.chunk_layers.push_back({static_cast<int16_t>(module), static_cast<int16_t>(stage),
                               static_cast<int16_t>(chunk), static_cast<int32_t>(range.first),
                               static_cast<int32_t>(range.second)});
  }
  if (!cp_cache_.empty()) {
    // How evenly the CP groups' attention work is spread, against the uniform split: the mean
    // over all micro-batches, and the CP group (data-parallel replica) whose micro-batches are
    // worst on average. Folded replicas stand for the others, all alike.
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
                  cp_cache_.size() * replicas_folded_, groups.size() * replicas_folded_,
                  worst[0] / worst[2], worst[1] / worst[2]);
    out_.notes.push_back(line);
  }
  if (!p_.represented_by.empty()) {
    p_.member_groups.resize(p_.groups.size());
    // A represented rank holds what its representative does.
    for (std::size_t r = 0; r < p_.memory.size(); ++r)
      p_.memory[r] = p_.memory[static_cast<std::size_t>(p_.represented_by[r])];
  }
  // Model FLOPs of the iteration (recompute excluded, heads' padding too), summed over ranks. A
  // module run whole on every CP rank (or TP rank) repeats its work there: the model's FLOPs
  // count it once.
  const ModuleLayout& llm_layout = modules_[static_cast<std::size_t>(llm_)].layout;
  for (std::size_t r = 0; r < p_.ranks.size(); ++r)
    for (const Op& op :
         p_.ranks[static_cast<std::size_t>(representative(p_, static_cast<int64_t>(r)))])
      if (op.kind == OpKind::kCompute && op.phase != Phase::kR) {
        double copies = 1;
        if (op.module >= 0) {
          const ModuleInfo& m = modules_[static_cast<std::size_t>(op.module)];
          if (whole_on_cp_ranks(m)) copies *= static_cast<double>(llm_layout.cp);
          if (split_tp(m) < grid_of(m).layout.tp) copies *= static_cast<double>(llm_layout.tp);
        }
        const double flops = op.flops - op.padded_flops;
        p_.model_flops += copies == 1 ? flops : flops / copies;
      }
}

// Megatron-LM overlaps the expert all-to-alls by running a forward and a backward of two
// micro-batches together, each one's all-to-alls beside the other's compute. The forwards a rank
// runs before its first backward (the pipeline's warm-up) and the backwards (with their
// recomputation) after its last forward (the cool-down) have no partner: their all-to-alls stay
// exposed.
void Lowering::pair_expert_overlap() {
  for (std::vector<Op>& ops : p_.ranks) {
    std::ptrdiff_t first_backward = -1, last_forward = -1;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != OpKind::kCompute) continue;
      const auto at = static_cast<std::ptrdiff_t>(i);
      if (ops[i].phase == Phase::kB && first_backward < 0) first_backward = at;
      if (ops[i].phase == Phase::kF) last_forward = at;
    }
    for (std::size_t i = 0; i < ops.size(); ++i) {
      Op& op = ops[i];
      if (op.kind != OpKind::kCompute || (op.flags & kOpEpCommOverlap) == 0) continue;
      const auto at = static_cast<std::ptrdiff_t>(i);
      const bool warm_up = op.phase == Phase::kF && (first_backward < 0 || at < first_backward);
      const bool cool_down = (op.phase == Phase::kB || op.phase == Phase::kR) && at > last_forward;
      if (warm_up || cool_down) op.flags &= ~static_cast<uint32_t>(kOpEpCommOverlap);
    }
  }
}

}  // namespace lowering

Lowered lower(const ModelSpec& model, const ClusterSpec& cluster, const ParallelPlan& plan,
              const WorkloadSpec& workload, const Batch& batch, const DipSchedule* dip,
              RankFolding folding) {
  Lowered out;
  out.program.iteration = batch.iteration;
  TESSERA_CHECK(stage_split_resolved(plan, model),
                "lower() needs the frozen-aware stage split resolved first (resolve_stage_split)");
  lowering::Lowering(model, cluster, plan, workload, batch, dip, folding, out).run();
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

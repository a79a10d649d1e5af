// lowering_refusal(): the plans validate_plan accepts that lower() cannot express yet, each with
// its reason, in one place.
#include "shared/lowering/lowering.hpp"

namespace tessera {

namespace {

// validate_plan has refused an LLM without a pipeline (pp 1) already.
std::string dip_refusal(const PlacedModule& llm, const ModelSpec& model) {
  if (llm.layout.cp > 1) return "schedule dip with context parallelism (cp > 1) is not lowered yet";
  for (const ModuleSpec& spec : model.modules) {
    if (spec.role == ModuleRole::kGenerator)
      return "schedule dip: generator '" + spec.name + "' after the LLM is not lowered yet";
    if (spec.role == ModuleRole::kEncoder) {
      if (!spec.transformer || spec.transformer->layers < llm.layout.pp)
        return "schedule dip: encoder '" + spec.name + "' needs at least one layer per stage (" +
               std::to_string(llm.layout.pp) + ")";
      if (!spec.inputs.empty())
        return "schedule dip: encoder '" + spec.name + "' with inputs is not lowered yet";
    }
  }
  return "";
}

}  // namespace

std::string lowering_refusal(const ParallelPlan& plan, const ModelSpec& model,
                             const DipSchedule* dip) {
  Diagnostics diag;
  const std::vector<PlacedModule> placed = place_modules(plan, model, "", "", diag);
  TESSERA_CHECK(diag.ok(), "lower() needs a validated plan: " + diag.format());
  return lowering_refusal(plan, model, dip, placed);
}

std::string lowering_refusal(const ParallelPlan& plan, const ModelSpec& model,
                             const DipSchedule* dip, const std::vector<PlacedModule>& placed) {
  if (plan.schedule == Schedule::kDip) {
    // A schedule's layers (from a search, or read back from a run) must fit this plan.
    if (const std::string why = dip_schedule_problem(dip ? *dip : DipSchedule{}, model,
                                                     plan.layout.pp, plan.layout.vpp);
        !why.empty())
      return "DIP schedule: " + why;
  }
  const auto llm = std::find_if(placed.begin(), placed.end(), [](const PlacedModule& p) {
    return p.module->role == ModuleRole::kLlm;
  });
  TESSERA_CHECK(llm != placed.end(), "lower() needs an llm module");
  if (plan.schedule == Schedule::kDip)
    if (std::string why = dip_refusal(*llm, model); !why.empty()) return why;
  // Under DIP, Entrain's micro-batches are the LLM's (both levels); DIP cuts their media into
  // sub-micro-batches itself, so level 1's encoder micro-batches play no part.
  if (plan.microbatching == MicrobatchPolicy::kEntrain && plan.schedule != Schedule::kDip) {
    // The LLM's micro-batch takes rows from its encoder micro-batch and the one before: a
    // producer replica must hold whole LLM micro-batches (fan-in or equal), and the pipeline
    // walks its micro-batches in order (no interleaving).
    for (const PlacedModule& m : placed)
      if (m.host.empty() && m.module != llm->module && plan.placement == Placement::kNonColocated &&
          m.layout.dp < llm->layout.dp)
        return "microbatching entrain: " + m.module->name + " has fewer replicas (" +
               std::to_string(m.layout.dp) + ") than the LLM (" + std::to_string(llm->layout.dp) +
               "); Entrain needs each encoder replica to feed whole LLM micro-batches";
    for (const PlacedModule& m : placed)
      if (m.layout.vpp > 1)
        return "microbatching entrain with interleaved 1F1B (vpp > 1) is not lowered yet";
  }
  for (const PlacedModule& m : placed) {
    // A borrowed layout is its host's.
    const int64_t dp = m.layout.dp, dp_llm = llm->layout.dp;
    if (dp % dp_llm != 0 && dp_llm % dp != 0)
      return "module " + m.module->name + ": dp " + std::to_string(dp) + " and the LLM's dp " +
             std::to_string(dp_llm) + " must divide one another";
  }
  if (plan.placement == Placement::kColocated)
    for (const PlacedModule& m : placed)
      if (m.module->role == ModuleRole::kGenerator && m.host.empty())
        return "colocated: give generator '" + m.module->name +
               "' no layout of its own; it then runs in the LLM's last pipeline stage";
  return "";
}

}  // namespace tessera

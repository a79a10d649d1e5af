#include "shared/search/memory_bound.hpp"

#include "shared/base/check.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

RankMemory mean_parameter_memory(const ParallelPlan& plan, const ModelSpec& model) {
  Diagnostics diag;
  const std::vector<PlacedModule> placed = place_modules(plan, model, "", "", diag);
  TESSERA_CHECK(diag.ok(), "mean_parameter_memory() needs a validated plan: " + diag.format());
  RankMemory total;
  for (const PlacedModule& m : placed) {
    const ModuleLayout& l = m.layout;  // a hosted module's is its host's
    const int64_t replicas = l.dp * l.cp;
    // Routed experts have replicas·(tp / expert TP) / ep copies, the replicas their gradients
    // reduce over (whole experts on each TP rank count tp times); the rest `replicas`.
    const int64_t expert_copies = replicas * (l.tp / l.expert_tp()) / l.ep;
    const auto& t = m.module->transformer;
    const double experts =
        t ? static_cast<double>(moe_layers(*t, 0, t->layers)) * expert_layer_parameters(*t, 1, 1)
          : 0.0;
    const double params = static_cast<double>(module_parameters(*m.module));
    for (const auto& [count, copies] :
         {std::pair{params - experts, replicas}, std::pair{experts, expert_copies}}) {
      const RankMemory one =
          parameter_memory(count, !m.module->frozen, plan.distributed_optimizer ? copies : 1,
                           model.dtype, plan.fully_sharded, kept_gradient_bytes(plan, model.dtype));
      total.weight_bytes += one.weight_bytes * static_cast<double>(copies);
      total.gradient_bytes += one.gradient_bytes * static_cast<double>(copies);
      total.optimizer_bytes += one.optimizer_bytes * static_cast<double>(copies);
    }
  }
  const auto world = static_cast<double>(world_size(plan, model));
  total.weight_bytes /= world;
  total.gradient_bytes /= world;
  total.optimizer_bytes /= world;
  return total;
}

}  // namespace tessera

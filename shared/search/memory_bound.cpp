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
    const RankMemory one =
        parameter_memory(static_cast<double>(module_parameters(*m.module)), !m.module->frozen,
                         plan.distributed_optimizer ? replicas : 1, model.dtype);
    const auto copies = static_cast<double>(replicas);
    total.weight_bytes += one.weight_bytes * copies;
    total.gradient_bytes += one.gradient_bytes * copies;
    total.optimizer_bytes += one.optimizer_bytes * copies;
  }
  const auto world = static_cast<double>(world_size(plan, model));
  total.weight_bytes /= world;
  total.gradient_bytes /= world;
  total.optimizer_bytes /= world;
  return total;
}

}  // namespace tessera

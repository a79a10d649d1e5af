#include "exec/module_places.hpp"

#include "exec/worker_internal.hpp"
#include "shared/layout/rank_groups.hpp"

namespace tessera::exec {

ModulePlaces::ModulePlaces(const ParallelPlan& plan, const ModelSpec& model, Groups& groups)
    : groups_(rank_groups(plan, model)),
      places_(model.modules.size()),
      alone_{{groups.world_rank()}, 0, {}, torch::kCPU},
      llm_(module_index(model, find_llm(model)->name)) {
  const int64_t rank = groups.world_rank();
  for (const ModuleGroups& mg : groups_) {
    const auto m = static_cast<std::size_t>(module_index(model, mg.module));
    ModulePlace& place = places_[m];
    const Group* tp = group_with(mg.tp, rank);
    const Group* cp = group_with(mg.cp, rank);
    const Group* dp = group_with(mg.dp, rank);
    if (!mg.dp.empty()) place.dp_size = static_cast<int64_t>(mg.dp.front().size());
    if (tp == nullptr) continue;
    place.tp = &groups.get(*tp);
    if (replicated_over_tp(plan, model, model.modules[m])) {
      place.tp_replicas = static_cast<int64_t>(tp->size());
      place.tp = &alone_;
    }
    place.cp = &groups.get(*cp);
    place.shard_copies = static_cast<int64_t>(dp->size() * cp->size());
    // Modules without experts share the grid's EP groups (homogeneous plans) but have no use
    // for them.
    const auto& arch = model.modules[m].transformer;
    if (const Group* ep = group_with(mg.ep, rank); ep != nullptr && arch && arch->experts > 0)
      place.ep = &groups.get(*ep);
    place.dp_rank = index_in(dp, rank);
    if (static_cast<int>(m) == llm_) {
      tp_index_ = index_in(tp, rank);
      cp_index_ = index_in(cp, rank);
      dp_index_ = index_in(dp, rank);
    }
  }
}

}  // namespace tessera::exec

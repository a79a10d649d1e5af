// Lowering: which ranks a folded Program lowers (RankFolding::kIdentical; Program::represented_by).
// A rank stands in for the others of its class when their ops would equal its own and cost the
// same: tensor-parallel shards always run the same ops in a homogeneous pipeline, data-parallel
// replicas when their data has the same shapes; costs are the same when every group a member
// uses, and every message it exchanges, sits on the nodes as its representative's does.
#include "shared/cost/collective_cost.hpp"
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

void Lowering::fold_ranks() {
  if (plan_.placement != Placement::kHomogeneous || plan_.schedule == Schedule::kDip) return;
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const auto shards = [](const Coord& x) { return Coord{0, x.c, x.d, x.p}; };
  const auto shards_and_replicas = [](const Coord& x) { return Coord{0, x.c, 0, x.p}; };
  std::function<Coord(const Coord&)> to;
  if (llm.layout.dp > 1 && identical_replicas() && same_costs(shards_and_replicas)) {
    to = shards_and_replicas;
    replicas_folded_ = static_cast<std::size_t>(llm.layout.dp);
  } else if (llm.layout.tp > 1 && same_costs(shards)) {
    to = shards;
  } else {
    return;
  }
  p_.represented_by.resize(static_cast<std::size_t>(p_.world));
  std::iota(p_.represented_by.begin(), p_.represented_by.end(), 0);
  class_members_.resize(static_cast<std::size_t>(p_.world));
  for (int64_t r = llm.first; r < llm.first + llm.layout.size(); ++r) {
    const int64_t by = llm.rank(to(llm.coord(r)));
    p_.represented_by[static_cast<std::size_t>(r)] = static_cast<int32_t>(by);
    class_members_[static_cast<std::size_t>(by)].push_back(r);
  }
}

void Lowering::record_member_groups(std::size_t module, int64_t rank, int32_t id,
                                    std::vector<Group> ModuleGroups::*kind,
                                    std::vector<int32_t> GroupIndex::*index) {
  const auto at_id = static_cast<std::size_t>(id);
  if (at_id < p_.member_groups.size() && !p_.member_groups[at_id].empty()) return;  // recorded
  const ModuleGroups& g = grids_[module];
  std::vector<int32_t> used;
  for (const int64_t member : class_members_[static_cast<std::size_t>(rank)]) {
    const int32_t at =
        (grid_index_[module].*index)[static_cast<std::size_t>(member - g.first_rank)];
    TESSERA_CHECK(at >= 0, "rank " + std::to_string(member) + " has no group in " + g.module +
                               "'s grid, unlike its representative");
    used.push_back(group((g.*kind)[static_cast<std::size_t>(at)]));
  }
  p_.member_groups.resize(p_.groups.size());  // `used` may have added groups
  p_.member_groups[at_id] = std::move(used);
}

bool Lowering::identical_replicas() {
  const int64_t dp = modules_[static_cast<std::size_t>(llm_)].layout.dp;
  const auto same_shapes = [](const std::vector<const Sample*>& a,
                              const std::vector<const Sample*>& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                      [](const Sample* x, const Sample* y) { return *x == *y; });
  };
  for (int64_t d = 1; d < dp; ++d) {
    if (encoder_done_[static_cast<std::size_t>(d)] != encoder_done_[0]) return false;
    for (const ModuleInfo& m : modules_)
      for (const bool encoder_level : {false, true})
        for (int32_t mb = -1; mb < static_cast<int32_t>(microbatches_); ++mb)
          if (!same_shapes(samples_of(m.index, 0, mb, encoder_level),
                           samples_of(m.index, d, mb, encoder_level)))
            return false;
  }
  return true;
}

bool Lowering::same_costs(const std::function<Coord(const Coord&)>& to) const {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t per_node = std::max<int64_t>(1, cluster_.devices_per_node);
  const bool one_node = cluster_.kind == ClusterKind::kCpuLocal;
  const auto node = [&](int64_t r) { return one_node ? 0 : r / per_node; };
  // What the cost model reads of a group's placement (CostModel::collective_s).
  const auto placed = [&](const RankList& g) {
    const GroupSpan s = group_span(cluster_, g);
    return std::array<int64_t, 3>{static_cast<int64_t>(g.size()), one_node ? 1 : s.nodes,
                                  one_node ? 0 : s.per_node};
  };
  const int64_t pp = llm.layout.pp;
  for (int64_t r = llm.first; r < llm.first + llm.layout.size(); ++r) {
    const Coord x = llm.coord(r);
    const Coord y = to(x);
    const int64_t by = llm.rank(y);
    if (by == r) continue;
    // Pipeline neighbours (the previous and next virtual stage's ranks).
    for (const int64_t step : {int64_t{1}, pp - 1}) {
      if (pp == 1) break;
      const int64_t mine = llm.rank({x.t, x.c, x.d, (x.p + step) % pp});
      const int64_t theirs = llm.rank({y.t, y.c, y.d, (y.p + step) % pp});
      if ((node(r) == node(mine)) != (node(by) == node(theirs))) return false;
    }
    // Every group of every grid the two ranks are in.
    for (std::size_t i = 0; i < grids_.size(); ++i) {
      const ModuleGroups& g = grids_[i];
      if (r < g.first_rank || r >= g.first_rank + g.size) continue;
      if (by < g.first_rank || by >= g.first_rank + g.size) return false;
      const GroupIndex& at = grid_index_[i];
      const std::pair<std::vector<Group> ModuleGroups::*, std::vector<int32_t> GroupIndex::*>
          kinds[] = {{&ModuleGroups::tp, &GroupIndex::tp},
                     {&ModuleGroups::cp, &GroupIndex::cp},
                     {&ModuleGroups::tpcp, &GroupIndex::tpcp},
                     {&ModuleGroups::dpcp, &GroupIndex::dpcp},
                     {&ModuleGroups::ep, &GroupIndex::ep},
                     {&ModuleGroups::edp, &GroupIndex::edp},
                     {&ModuleGroups::kv, &GroupIndex::kv},
                     {&ModuleGroups::stages, &GroupIndex::stage}};
      for (const auto& [groups, index] : kinds) {
        const int32_t a = (at.*index)[static_cast<std::size_t>(r - g.first_rank)];
        const int32_t b = (at.*index)[static_cast<std::size_t>(by - g.first_rank)];
        if ((a < 0) != (b < 0)) return false;
        if (a >= 0 && placed((g.*groups)[static_cast<std::size_t>(a)]) !=
                          placed((g.*groups)[static_cast<std::size_t>(b)]))
          return false;
      }
    }
  }
  return true;
}

}  // namespace tessera::lowering

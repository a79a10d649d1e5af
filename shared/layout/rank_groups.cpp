#include "shared/layout/rank_groups.hpp"

#include <array>
#include <span>

#include "shared/base/check.hpp"

namespace tessera {

namespace {

// A rank's coordinates on four axes: (t, c, d, p) in the dense grid, (t, e, d, p) in the
// expert grid.
using Coords = std::array<int64_t, 4>;
constexpr int T = 0, C = 1, E = 1, D = 2, P = 3;

// Calls visit() for every value of the `axes` of x, the first axis varying slowest.
template <class Visit>
void each(Coords& x, const Coords& sizes, std::span<const int> axes, Visit&& visit) {
  if (axes.empty()) return visit();
  const auto a = static_cast<std::size_t>(axes.front());
  for (x[a] = 0; x[a] < sizes[a]; ++x[a]) each(x, sizes, axes.subspan(1), visit);
}

// One group per value of the `across` axes, holding the ranks along the `along` axes (each list
// with its first axis varying slowest).
template <class Rank>
std::vector<Group> groups(const Coords& sizes, std::initializer_list<int> across,
                          std::initializer_list<int> along, Rank rank) {
  std::vector<Group> out;
  Coords x{};
  each(x, sizes, across, [&] {
    Group& g = out.emplace_back();
    each(x, sizes, along, [&] { g.push_back(rank(x)); });
  });
  return out;
}

}  // namespace

int64_t grid_rank(const ModuleLayout& l, int64_t first, const GridCoord& x) {
  return first + x.t + l.tp * (x.c + l.cp * (x.d + l.dp * x.p));
}

GridCoord grid_coord(const ModuleLayout& l, int64_t first, int64_t rank) {
  const int64_t local = rank - first;
  return {local % l.tp, (local / l.tp) % l.cp, (local / (l.tp * l.cp)) % l.dp,
          local / (l.tp * l.cp * l.dp)};
}

ModuleGroups layout_groups(const ModuleLayout& l, int64_t first) {
  TESSERA_CHECK(l.tp >= 1 && l.cp >= 1 && l.dp >= 1 && l.pp >= 1 && l.ep >= 1);
  const int64_t etp = l.expert_tp();
  TESSERA_CHECK(l.tp % etp == 0 && (l.tp / etp * l.cp * l.dp) % l.ep == 0,
                "ep must divide (tp/etp)*cp*dp");
  ModuleGroups g;
  g.first_rank = first;
  g.size = l.size();
  const Coords dense{l.tp, l.cp, l.dp, l.pp},
      expert{etp, l.ep, l.tp / etp * l.cp * l.dp / l.ep, l.pp};
  auto dense_rank = [&](const Coords& x) { return grid_rank(l, first, {x[T], x[C], x[D], x[P]}); };
  auto expert_rank = [&](const Coords& x) {
    return first + x[T] + etp * (x[E] + expert[E] * (x[D] + expert[D] * x[P]));
  };
  g.tp = groups(dense, {P, D, C}, {T}, dense_rank);
  g.tpcp = groups(dense, {P, D}, {C, T}, dense_rank);
  g.cp = groups(dense, {P, D, T}, {C}, dense_rank);
  g.dp = groups(dense, {P, C, T}, {D}, dense_rank);
  g.dpcp = groups(dense, {P, T}, {D, C}, dense_rank);
  g.pp = groups(dense, {D, C, T}, {P}, dense_rank);
  g.ep = groups(expert, {P, D, T}, {E}, expert_rank);
  g.edp = groups(expert, {P, E, T}, {D}, expert_rank);
  g.stages = groups(dense, {P}, {D, C, T}, dense_rank);
  return g;
}

std::vector<int32_t> group_index(const std::vector<Group>& groups, int64_t first, int64_t size) {
  std::vector<int32_t> index(static_cast<std::size_t>(size), -1);
  for (std::size_t i = 0; i < groups.size(); ++i)
    for (int64_t r : groups[i])
      if (r >= first && r < first + size)
        index[static_cast<std::size_t>(r - first)] = static_cast<int32_t>(i);
  return index;
}

std::vector<ModuleGroups> rank_groups(const ParallelPlan& plan, const ModelSpec& model) {
  Diagnostics diag;
  const std::vector<PlacedModule> placed = place_modules(plan, model, "", "", diag);
  TESSERA_CHECK(diag.ok(), "rank_groups needs a validated plan: " + diag.format());
  return rank_groups(plan, placed);
}

std::vector<ModuleGroups> rank_groups(const ParallelPlan& plan,
                                      const std::vector<PlacedModule>& placed) {
  std::vector<ModuleGroups> out;
  for (const PlacedModule& p : placed) {
    ModuleGroups g = layout_groups(p.layout, p.first_rank);
    g.module = p.module->name;
    const auto& arch = p.module->transformer;
    const int64_t share = arch && arch->kv_heads > 0 && arch->kv_heads < p.layout.tp
                              ? p.layout.tp / arch->kv_heads
                              : 1;
    for (const Group& tp : g.tp)
      for (std::size_t i = 0; i < tp.size(); i += static_cast<std::size_t>(share))
        g.kv.emplace_back(tp.begin() + static_cast<std::ptrdiff_t>(i),
                          tp.begin() + static_cast<std::ptrdiff_t>(i) + share);
    // A borrowed layout runs on its host's last stage; a homogeneous encoder on stage 0 — under
    // DIP on every stage (a segment of its own), with its projector on the last.
    const bool homogeneous = plan.placement == Placement::kHomogeneous;
    const bool dip = homogeneous && plan.schedule == Schedule::kDip;
    const ModuleRole role = p.module->role;
    const bool in_first_stage = homogeneous && role != ModuleRole::kLlm && !dip;
    const bool in_last_stage =
        !p.host.empty() || (dip && role != ModuleRole::kLlm && role != ModuleRole::kEncoder);
    if (in_first_stage || in_last_stage) {
      const int64_t stage = in_first_stage ? 0 : p.layout.pp - 1;
      const int64_t stage_size = p.layout.tp * p.layout.cp * p.layout.dp;
      auto keep = [&](std::vector<Group>& groups) {
        std::vector<Group> kept;
        for (const Group& grp : groups)
          if ((grp.front() - p.first_rank) / stage_size == stage) kept.push_back(grp);
        groups = kept;
      };
      keep(g.tp);
      keep(g.cp);
      keep(g.dp);
      keep(g.dpcp);
      keep(g.tpcp);
      keep(g.ep);
      keep(g.edp);
      keep(g.kv);
      g.pp.clear();
      for (int64_t r : g.stages[static_cast<std::size_t>(stage)]) g.pp.push_back({r});
      g.stages = {g.stages[static_cast<std::size_t>(stage)]};
      g.size = stage_size;
      g.first_rank = p.first_rank + stage * stage_size;
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace tessera

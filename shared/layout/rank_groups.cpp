#include "shared/layout/rank_groups.hpp"

#include "shared/base/check.hpp"

namespace tessera {

ModuleGroups layout_groups(const ModuleLayout& l, int64_t first) {
  TESSERA_CHECK(l.tp >= 1 && l.cp >= 1 && l.dp >= 1 && l.pp >= 1 && l.ep >= 1);
  TESSERA_CHECK((l.cp * l.dp) % l.ep == 0, "ep must divide cp*dp");
  ModuleGroups g;
  g.first_rank = first;
  g.size = l.size();
  const int64_t TP = l.tp, CP = l.cp, DP = l.dp, PP = l.pp, EP = l.ep, EDP = l.cp * l.dp / l.ep;
  auto dense = [&](int64_t t, int64_t c, int64_t d, int64_t p) {
    return first + t + TP * (c + CP * (d + DP * p));
  };
  auto expert = [&](int64_t t, int64_t e, int64_t d, int64_t p) {
    return first + t + TP * (e + EP * (d + EDP * p));
  };

  for (int64_t p = 0; p < PP; ++p)
    for (int64_t d = 0; d < DP; ++d)
      for (int64_t c = 0; c < CP; ++c) {
        Group tp;
        for (int64_t t = 0; t < TP; ++t) tp.push_back(dense(t, c, d, p));
        g.tp.push_back(tp);
      }
  for (int64_t p = 0; p < PP; ++p)
    for (int64_t d = 0; d < DP; ++d) {
      Group tpcp;
      for (int64_t c = 0; c < CP; ++c)
        for (int64_t t = 0; t < TP; ++t) tpcp.push_back(dense(t, c, d, p));
      g.tpcp.push_back(tpcp);
    }
  for (int64_t p = 0; p < PP; ++p)
    for (int64_t d = 0; d < DP; ++d)
      for (int64_t t = 0; t < TP; ++t) {
        Group cp;
        for (int64_t c = 0; c < CP; ++c) cp.push_back(dense(t, c, d, p));
        g.cp.push_back(cp);
      }
  for (int64_t p = 0; p < PP; ++p)
    for (int64_t c = 0; c < CP; ++c)
      for (int64_t t = 0; t < TP; ++t) {
        Group dp;
        for (int64_t d = 0; d < DP; ++d) dp.push_back(dense(t, c, d, p));
        g.dp.push_back(dp);
      }
  for (int64_t p = 0; p < PP; ++p)
    for (int64_t t = 0; t < TP; ++t) {
      Group dpcp;
      for (int64_t d = 0; d < DP; ++d)
        for (int64_t c = 0; c < CP; ++c) dpcp.push_back(dense(t, c, d, p));
      g.dpcp.push_back(dpcp);
    }
  for (int64_t d = 0; d < DP; ++d)
    for (int64_t c = 0; c < CP; ++c)
      for (int64_t t = 0; t < TP; ++t) {
        Group pp;
        for (int64_t p = 0; p < PP; ++p) pp.push_back(dense(t, c, d, p));
        g.pp.push_back(pp);
      }
  for (int64_t p = 0; p < PP; ++p)
    for (int64_t d = 0; d < EDP; ++d)
      for (int64_t t = 0; t < TP; ++t) {
        Group ep;
        for (int64_t e = 0; e < EP; ++e) ep.push_back(expert(t, e, d, p));
        g.ep.push_back(ep);
      }
  for (int64_t p = 0; p < PP; ++p)
    for (int64_t e = 0; e < EP; ++e)
      for (int64_t t = 0; t < TP; ++t) {
        Group edp;
        for (int64_t d = 0; d < EDP; ++d) edp.push_back(expert(t, e, d, p));
        g.edp.push_back(edp);
      }
  const int64_t stage_size = TP * CP * DP;
  for (int64_t p = 0; p < PP; ++p) {
    Group stage;
    for (int64_t r = 0; r < stage_size; ++r) stage.push_back(first + p * stage_size + r);
    g.stages.push_back(stage);
  }
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

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "shared/layout/rank_groups.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

ModuleLayout grid(int64_t tp, int64_t cp, int64_t pp, int64_t dp, int64_t ep = 1) {
  ModuleLayout l;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  l.dp = dp;
  l.ep = ep;
  return l;
}

// Every rank of [first, first + size) appears in exactly one group, and all groups have `n` ranks.
void check_partition(const std::vector<Group>& groups, int64_t first, int64_t size, int64_t n) {
  std::vector<int> seen(static_cast<std::size_t>(size), 0);
  for (const Group& g : groups) {
    REQUIRE(static_cast<int64_t>(g.size()) == n);
    for (int64_t r : g) {
      REQUIRE(r >= first);
      REQUIRE(r < first + size);
      ++seen[static_cast<std::size_t>(r - first)];
    }
  }
  for (int count : seen) REQUIRE(count == 1);
}

}  // namespace

TEST_CASE("Megatron's documented example: 16 ranks, tp=2, pp=4, dp=2") {
  const ModuleGroups g = layout_groups(grid(2, 1, 4, 2), 0);
  CHECK(g.tp ==
        std::vector<Group>{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}});
  CHECK(g.pp == std::vector<Group>{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}});
  CHECK(g.dp ==
        std::vector<Group>{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(g.stages.front() == Group{0, 1, 2, 3});
}

TEST_CASE("tp=2, cp=2, dp=2: context groups sit between tensor and data groups") {
  const ModuleGroups g = layout_groups(grid(2, 2, 1, 2), 0);
  CHECK(g.tp == std::vector<Group>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(g.cp == std::vector<Group>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(g.dp == std::vector<Group>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(g.tpcp == std::vector<Group>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(group_index(g.cp, 0, 8) == std::vector<int32_t>{0, 1, 0, 1, 2, 3, 2, 3});
  CHECK(group_index({{2, 3}}, 2, 3) == std::vector<int32_t>{0, 0, -1});
}

TEST_CASE("expert groups are carved out of cp*dp, and a span offsets every group") {
  const ModuleGroups g = layout_groups(grid(1, 1, 1, 4, 2), 16);
  CHECK(g.ep == std::vector<Group>{{16, 17}, {18, 19}});
  CHECK(g.edp == std::vector<Group>{{16, 18}, {17, 19}});
  CHECK(g.dp == std::vector<Group>{{16, 17, 18, 19}});
}

TEST_CASE("expert TP 1 carves the expert groups out of tp*cp*dp") {
  // tp 2, dp 4, ep 2: each rank holds whole experts; an EP group pairs the two TP ranks of a
  // replica, and the replicas of one expert shard are every second rank.
  ModuleLayout l = grid(2, 1, 1, 4, 2);
  l.etp = 1;
  const ModuleGroups g = layout_groups(l, 0);
  CHECK(g.ep == std::vector<Group>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(g.edp == std::vector<Group>{{0, 2, 4, 6}, {1, 3, 5, 7}});
  // The dense groups do not change.
  CHECK(g.tp == layout_groups(grid(2, 1, 1, 4, 2), 0).tp);
  // With EP over all eight ranks every rank holds its own experts alone.
  l.ep = 8;
  const ModuleGroups all = layout_groups(l, 0);
  CHECK(all.ep == std::vector<Group>{{0, 1, 2, 3, 4, 5, 6, 7}});
  check_partition(all.edp, 0, 8, 1);
  // Expert TP equal to TP is the default's layout.
  l.ep = 2;
  l.etp = 2;
  CHECK(layout_groups(l, 0).ep == layout_groups(grid(2, 1, 1, 4, 2), 0).ep);
  CHECK(layout_groups(l, 0).edp == layout_groups(grid(2, 1, 1, 4, 2), 0).edp);
}

TEST_CASE("every kind of group partitions the span, up to 4096 ranks") {
  int layouts = 0;
  for (int64_t tp : {1, 2, 4, 8})
    for (int64_t cp : {1, 2, 4})
      for (int64_t pp : {1, 2, 4, 8, 16})
        for (int64_t dp : {1, 2, 3, 8, 32}) {
          if (tp * cp * pp * dp > 4096) continue;
          for (int64_t ep : {1, 2, 8}) {
            if ((cp * dp) % ep != 0) continue;
            const ModuleLayout l = grid(tp, cp, pp, dp, ep);
            const int64_t first = (tp * dp) % 5;  // any offset
            const ModuleGroups g = layout_groups(l, first);
            check_partition(g.tp, first, l.size(), tp);
            check_partition(g.cp, first, l.size(), cp);
            check_partition(g.dp, first, l.size(), dp);
            check_partition(g.pp, first, l.size(), pp);
            check_partition(g.dpcp, first, l.size(), cp * dp);
            check_partition(g.tpcp, first, l.size(), tp * cp);
            check_partition(g.ep, first, l.size(), ep);
            check_partition(g.edp, first, l.size(), cp * dp / ep);
            check_partition(g.stages, first, l.size(), tp * cp * dp);
            // A TP group and a DP group meet in at most one rank; an EP group lies inside one
            // pipeline stage and one TP column.
            const std::set<int64_t> tp0(g.tp[0].begin(), g.tp[0].end());
            int shared = 0;
            for (int64_t r : g.dp[0]) shared += static_cast<int>(tp0.count(r));
            REQUIRE(shared <= 1);
            const int64_t stage_size = tp * cp * dp;
            for (const Group& e : g.ep)
              for (int64_t r : e) {
                REQUIRE((r - first) / stage_size == (e[0] - first) / stage_size);
                REQUIRE((r - first) % tp == (e[0] - first) % tp);
              }
            ++layouts;
          }
        }
  CHECK(layouts > 300);
}

namespace {

// Every TP, CP, EP and data-parallel collective the lowering emits (stream or nested) runs on a
// group that rank_groups() names for its module: the rank grid has one definition.
void check_lowered_groups(const Scenario& s, const ParallelPlan& plan) {
  Diagnostics diag;
  validate_plan(plan, s.model, s.workload, s.cluster, "", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  const Lowered lowered =
      lower(s.model, s.cluster, resolve_stage_split(plan, s.model, s.workload, s.cluster),
            s.workload, draw_batch(s.workload, 0));
  INFO(lowered.error);
  REQUIRE(lowered.error.empty());
  const Program& p = lowered.program;
  std::map<std::string, ModuleGroups> by_module;
  for (ModuleGroups& g : rank_groups(plan, s.model)) by_module[g.module] = std::move(g);
  auto sorted = [](RankList r) {
    std::sort(r.begin(), r.end());
    return r;
  };
  auto named = [&](const std::vector<Group>& groups, const RankList& members) {
    for (const Group& g : groups)
      if (sorted(g) == sorted(members)) return true;
    return false;
  };
  int checked = 0;
  auto check = [&](const Op& op, Purpose purpose, int32_t group) {
    if (op.module < 0) return;
    const ModuleGroups& g = by_module.at(p.modules[static_cast<std::size_t>(op.module)]);
    const RankList& members = p.groups[static_cast<std::size_t>(group)];
    INFO(op_name(p, op) << " on group " << group);
    switch (purpose) {
      case Purpose::kTp:
        // Replicated key/value heads' gradients: the TP ranks sharing each head.
        CHECK(named((op.flags & kOpKvReplicas) != 0 ? g.kv : g.tp, members));
        break;
      case Purpose::kCp:
        CHECK(named(g.cp, members));
        break;
      case Purpose::kEp:
        CHECK(named(g.ep, members));
        break;
      case Purpose::kDp:
        // A routed expert's replicas are fewer: those of its expert shard.
        CHECK(named((op.flags & kOpRoutedExperts) != 0 ? g.edp : g.dpcp, members));
        break;
      default:
        return;  // boundaries, pipeline messages and the global norm are not grid groups
    }
    ++checked;
  };
  for (const auto& ops : p.ranks)
    for (const Op& op : ops) {
      if (op.kind == OpKind::kCollective) check(op, op.purpose, op.group);
      for (const NestedCollective& n : op.nested) check(op, n.purpose, n.group);
    }
  CHECK(checked > 0);
}

Scenario scenario(const std::string& name) {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/" + name, diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return *s;
}

ParallelPlan plan_file(const std::string& name) {
  const std::string file = std::string(TESSERA_SOURCE_DIR) + "/scenarios/plans/" + name;
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  Diagnostics diag;
  ParallelPlan p = read_plan(Json::parse(text.str()), file, "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  return p;
}

}  // namespace

TEST_CASE("the lowering's groups are rank_groups()'s, for every placement family") {
  const Scenario tiny = scenario("cpu-tiny.json");
  for (const char* f : {"cpu-tiny-tp2-pp2.json", "cpu-tiny-dp2-pp2.json", "cpu-tiny-colocated.json",
                        "cpu-tiny-non-colocated.json"}) {
    INFO(f);
    check_lowered_groups(tiny, plan_file(f));
  }
  const Scenario valm = scenario("cpu-tiny-valm.json");
  for (const char* f : {"cpu-tiny-valm-non-colocated.json", "cpu-tiny-valm-tp2-dp2.json"}) {
    INFO(f);
    check_lowered_groups(valm, plan_file(f));
  }
  // Context parallelism beside tensor and data parallelism (homogeneous), and DIP's encoder
  // segments on every stage.
  const Scenario big = scenario("default.json");
  ParallelPlan cp = *big.plan;
  cp.layout.cp = 2;
  cp.layout.dp = big.plan->layout.dp / 2;
  check_lowered_groups(big, cp);
  // Key/value heads replicated over TP ranks (the LLM's 2 on TP 4): their gradients' sums.
  ParallelPlan tp4 = plan_file("cpu-tiny-tp2-pp2.json");
  tp4.layout.tp = 4;
  tp4.layout.pp = 1;
  check_lowered_groups(tiny, tp4);
  // Expert parallelism, alone and beside TP, with the distributed optimizer.
  const Scenario moe = scenario("cpu-tiny-moe.json");
  for (const char* f : {"cpu-tiny-moe-ep2.json", "cpu-tiny-moe-ep2-tp2.json"}) {
    INFO(f);
    ParallelPlan plan = plan_file(f);
    plan.distributed_optimizer = true;
    check_lowered_groups(moe, plan);
  }
  const Scenario variable = scenario("cpu-tiny-variable.json");
  ParallelPlan dip = *variable.plan;
  dip.schedule = Schedule::kDip;
  dip.layout.tp = 2;
  check_lowered_groups(variable, dip);
}

TEST_CASE("grid_rank and grid_coord: the groups' own rank order, both ways") {
  ModuleLayout l;
  l.tp = 2;
  l.cp = 2;
  l.dp = 3;
  l.pp = 2;
  const int64_t first = 5;
  const ModuleGroups g = layout_groups(l, first);
  for (int64_t r = first; r < first + l.size(); ++r) {
    const GridCoord x = grid_coord(l, first, r);
    CHECK(grid_rank(l, first, x) == r);
    // Its TP group is the ranks that differ from it in t alone, in t order; its pipeline group
    // those that differ in p alone.
    for (const Group& tp : g.tp)
      if (std::find(tp.begin(), tp.end(), r) != tp.end())
        for (int64_t t = 0; t < l.tp; ++t)
          CHECK(tp[static_cast<std::size_t>(t)] == grid_rank(l, first, {t, x.c, x.d, x.p}));
    for (const Group& pp : g.pp)
      if (std::find(pp.begin(), pp.end(), r) != pp.end())
        for (int64_t p = 0; p < l.pp; ++p)
          CHECK(pp[static_cast<std::size_t>(p)] == grid_rank(l, first, {x.t, x.c, x.d, p}));
  }
}

// Process groups of a plan, as pure functions: which ranks form each TP, CP, DP, PP, EP group
// of every module. The simulator and the executor both use these; neither recomputes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/layout/parallel_plan.hpp"

namespace tessera {

using Group = std::vector<int64_t>;

struct ModuleGroups {
  std::string module;
  int64_t first_rank = 0;
  int64_t size = 0;
  std::vector<Group> tp, cp, dp, pp;
  std::vector<Group> dpcp;    // data and context replicas together: gradients reduce over it
  std::vector<Group> tpcp;    // tensor and context ranks of one replica's stage
  std::vector<Group> ep;      // expert parallel (over cp·dp)
  std::vector<Group> edp;     // expert data parallel: replicas of one expert shard
  std::vector<Group> stages;  // all ranks of pipeline stage s, s = 0..pp-1
  // Within a TP group, the ranks holding one key/value head when the module has fewer of them
  // than TP (each replicated on tp / kv_heads consecutive ranks): their gradients are summed
  // over it. Groups of one otherwise.
  std::vector<Group> kv;
};

// A rank's place in a grid: its TP, CP, DP and pipeline indices.
struct GridCoord {
  int64_t t = 0, c = 0, d = 0, p = 0;
};
// The rank at `x` of a grid placed at `first` (Megatron order, as below), and back.
// REQUIRES: x within the layout's degrees; `rank` within [first, first + layout.size()).
int64_t grid_rank(const ModuleLayout& layout, int64_t first, const GridCoord& x);
GridCoord grid_coord(const ModuleLayout& layout, int64_t first, int64_t rank);

// Groups of one grid placed at `first_rank`, Megatron order tp-cp-ep-dp-pp:
//   rank = first + tp_i + TP·(cp_i + CP·(dp_i + DP·pp_i))            (dense groups)
//   rank = first + etp_i + ETP·(ep_i + EP·(edp_i + EDP·pp_i)), EDP = TP·CP·DP/(ETP·EP)
//                                                                        (expert groups)
// with ETP the expert TP (TP itself by default). Every kind of group partitions the span.
// REQUIRES: degrees >= 1, ep divides (tp/etp)·cp·dp.
ModuleGroups layout_groups(const ModuleLayout& layout, int64_t first_rank);

// For each rank of [first, first + size), the index of the group in `groups` that holds it (-1
// for a rank in none): how a caller finds a rank's group without rebuilding it.
std::vector<int32_t> group_index(const std::vector<Group>& groups, int64_t first, int64_t size);

// Groups of every module of a validated plan. Homogeneous: encoders and projectors live in the
// LLM's first pipeline stage, so their groups are the LLM's restricted to stage 0.
std::vector<ModuleGroups> rank_groups(const ParallelPlan& plan, const ModelSpec& model);
// The same, with the plan's modules already placed (place_modules).
std::vector<ModuleGroups> rank_groups(const ParallelPlan& plan,
                                      const std::vector<PlacedModule>& placed);

}  // namespace tessera

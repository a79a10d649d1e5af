// Where this rank sits in each module's parallel grid (rank_groups): per module its TP, CP and
// EP communicators, its data-parallel degree and replica, and how many ranks hold the same
// shard; the LLM's TP, CP and DP indices. Built once per Worker, after every group it names has
// been created in `groups`.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/comm.hpp"
#include "shared/layout/parallel_plan.hpp"
#include "shared/layout/rank_groups.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera::exec {

struct ModulePlace {
  const Comm* tp = nullptr;  // null: the module has no layers on this rank
  const Comm* cp = nullptr;
  const Comm* ep = nullptr;  // null without routed experts
  // A module run whole on every TP rank of its grid (indivisible_heads replicate): its TP group
  // is this rank alone, and its parameters have this many copies (the grid's TP ranks).
  int64_t tp_replicas = 1;
  int64_t dp_size = 1;       // data-parallel degree (every module's, here or not)
  int64_t dp_rank = 0;       // this rank's replica
  int64_t shard_copies = 1;  // ranks holding the same shard: data- times context-parallel
  bool here() const { return tp != nullptr; }
};

class ModulePlaces {
 public:
  // REQUIRES: groups.create() has made every group of rank_groups(plan, model).
  ModulePlaces(const ParallelPlan& plan, const ModelSpec& model, Groups& groups);
  ModulePlaces(const ModulePlaces&) = delete;  // places point into `alone_`
  ModulePlaces& operator=(const ModulePlaces&) = delete;

  const ModulePlace& operator[](int module) const {
    return places_.at(static_cast<std::size_t>(module));
  }
  const std::vector<ModuleGroups>& groups() const { return groups_; }
  int llm() const { return llm_; }  // the LLM's module index
  const ModulePlace& llm_place() const { return (*this)[llm_]; }
  // This rank's index in the LLM's TP, CP and DP groups.
  int64_t llm_tp_index() const { return tp_index_; }
  int64_t llm_cp_index() const { return cp_index_; }
  int64_t llm_dp_index() const { return dp_index_; }

 private:
  std::vector<ModuleGroups> groups_;
  std::vector<ModulePlace> places_;
  Comm alone_;
  int llm_ = -1;
  int64_t tp_index_ = 0, cp_index_ = 0, dp_index_ = 0;
};

}  // namespace tessera::exec

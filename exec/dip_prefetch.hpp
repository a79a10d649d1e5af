// schedule dip in the executor: each step's schedule is searched on a background thread while
// the step before trains, on the next batch, drawn ahead. When that search has not finished on
// every rank as a step begins (a collective decides, so that every rank lowers the same
// Program), the step runs the previous schedule and the search goes on.
#pragma once

#include <cstdint>
#include <future>
#include <optional>

#include "exec/comm.hpp"
#include "exec/data.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/search/dip_search.hpp"

namespace tessera::exec {

// How a step's schedule came about.
struct DipStepInfo {
  DipSchedule schedule;   // what the step ran
  bool searched = false;  // a finished search supplied it (false: the previous or the start)
  bool late = false;      // a search was running and had not finished on every rank
  double search_s = 0;    // the supplying search's wall time
  int64_t scored = 0, cached = 0;
};

class DipPrefetcher {
 public:
  // REQUIRES: scenario validated; plan validated against it with schedule dip. Both outlive
  // the prefetcher.
  DipPrefetcher(const Scenario& scenario, const ParallelPlan& plan, DatasetKind dataset);
  // The batch of `iteration`: the one drawn ahead for it, or drawn now.
  TrainBatch batch(int64_t iteration);
  // The schedule step `iteration` runs, agreed over `world`; starts the next batch's search
  // from it (layers stay where they are: moving them would move weights and optimizer state).
  DipStepInfo schedule_for_step(int64_t iteration, const Comm& world);
  const DipSchedule& schedule() const { return schedule_; }

 private:
  const Scenario& scenario_;
  DatasetKind dataset_;
  CostModel cost_;
  DipPlanner planner_;
  DipSchedule schedule_;                  // the last step's
  std::optional<TrainBatch> next_batch_;  // the next step's batch, drawn ahead
  std::future<DipSearchResult> next_;     // its search (declared last: joined first)
};

}  // namespace tessera::exec

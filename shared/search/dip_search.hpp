// DIP's per-batch schedule search (docs/ALGORITHMS.md §5): from a starting schedule, try the
// encoder segments' order, then the interleaving (look-ahead, in-flight micro-batches), then
// moves of one layer across each stage boundary of every segment, keeping a change only when the
// in-order evaluator (evaluator.hpp) finds the batch's step strictly faster within the memory
// cap. The result is never worse than the start. Scores of identical (batch, schedule) pairs are
// cached across searches, so an unchanged batch costs nothing the second time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "shared/cost/cost_model.hpp"
#include "shared/layout/dip_schedule.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/model/batch.hpp"

namespace tessera {

struct DipSearchResult {
  DipSchedule schedule;
  double start_step_s = 0, step_s = 0;    // evaluator step time of the start and of the result
  bool start_fits = false, fits = false;  // within the memory cap
  int64_t scored = 0, cached = 0;         // candidates scored, of which from the cache
  double seconds = 0;                     // wall time of the search
  std::string error;                      // the start could not be lowered (plan unsupported)
};

class DipPlanner {
 public:
  // REQUIRES: scenario validated; plan validated against it with schedule dip.
  DipPlanner(const Scenario& scenario, const ParallelPlan& plan, const CostModel& cost);
  // `start`: the previous batch's schedule, or DipSchedule{} for the first. Without
  // `move_layers` the layers stay where `start` has them (a running job keeps its weights).
  DipSearchResult search(const Batch& batch, const DipSchedule& start, bool move_layers = true);

 private:
  struct Score {
    bool lowered = false, fits = false;
    double step_s = 0;
    std::map<int32_t, std::vector<int64_t>> layers;  // as lowered
    bool better_than(const Score& o) const {
      if (lowered != o.lowered) return lowered;
      if (fits != o.fits) return fits;
      return step_s < o.step_s;
    }
  };
  Score score(const Batch& batch, const std::string& fingerprint, const DipSchedule& candidate,
              DipSearchResult& result, std::string* error = nullptr);

  const Scenario& scenario_;
  const ParallelPlan& plan_;
  const CostModel& cost_;
  std::map<std::pair<std::string, DipSchedule>, Score> cache_;
};

// "dip schedule search: 41 scored (3 cached) in 0.21 s; step 4.1 s (start 6.4 s); <schedule>"
std::string describe_dip_search(const DipSearchResult& result, const ModelSpec& model);

// What identifies a batch's work: every sample's text length and media, in order.
std::string batch_fingerprint(const Batch& batch);

}  // namespace tessera

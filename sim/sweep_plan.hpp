// The planning half of tessera sweep, in this process (no child process, no file): every grid
// point's plans enumerated per GPU count, ranked by the analytic estimate, and the best K of each
// chosen for simulation with the stage-split twins of the best frozen-aware plans.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "shared/search/plan_search.hpp"
#include "sim/sweep.hpp"

namespace tessera::sim {

// Wall seconds since `start` (the sweep's phase timings).
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A plan the sweep simulates: a ranked candidate of one grid point's scenario.
struct ChosenPlan {
  RankedCandidate ranked;  // its key names the grid point too, when there are --set axes
  Json point;
  std::shared_ptr<const Scenario> scenario;
};

// The plans to simulate; `result` gets the counts, every estimate, the timings of enumeration
// and estimation, and the split gains. REQUIRES: as run_sweep.
std::vector<ChosenPlan> plan_sweep(const Scenario& base, const SweepOptions& options,
                                   SweepResult& result, const SweepProgress& progress = {});

}  // namespace tessera::sim

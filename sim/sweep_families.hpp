// The placement families side by side: the best simulated plan of each (homogeneous, colocated,
// non-colocated) per grid point and GPU count, where its step time goes, and in words why the
// fastest wins. The terminal table and report.html both lead with it.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "shared/layout/sweep_rows.hpp"
#include "sim/sweep.hpp"

namespace tessera::sim {

// Of a ranking, best first, the positions a sweep keeps: the best `k`, and the best of each
// placement family even when it ranks lower. `placement_of(item)` names an item's family.
template <class Item, class PlacementOf>
std::vector<std::size_t> best_k_and_each_family(const std::vector<Item>& ranked, int64_t k,
                                                const PlacementOf& placement_of) {
  std::vector<std::size_t> kept;
  std::set<Placement> families;
  for (std::size_t i = 0; i < ranked.size(); ++i)
    if (families.insert(placement_of(ranked[i])).second || static_cast<int64_t>(i) < k)
      kept.push_back(i);
  return kept;
}

// A grid point as "workload.max_seq_len=8192, workload.global_batch=32" ("" for none).
std::string point_text(const Json& point);

// Per (grid point, GPU count), in the rows' order: the best successful row of each placement
// family, fastest first.
std::vector<std::vector<const SweepRow*>> family_bests(const std::vector<SweepRow>& rows);

// Where a row's step goes, per rank on average; the parts add up to the step:
// - compute: the mean rank's compute-stream busy time;
// - imbalance: how much longer the busiest rank computes (the others wait at least that long);
// - bubble and waits: the rest of the idle time (pipeline warm-up and drain, dependencies);
// - communication: exposed transfers other than at module boundaries (TP/CP/EP collectives
//   nested in compute count as compute);
// - boundary: exposed transfers between modules.
struct StepParts {
  double compute_s = 0, imbalance_s = 0, bubble_s = 0, comm_s = 0, boundary_s = 0;
};
StepParts step_parts(const SweepRow& row);

// "colocated takes 4.5% less time per step than homogeneous (0.84 s vs 0.88 s): the homogeneous
// plan's ranks wait 0.035 s longer per step in pipeline bubbles and on dependencies (...)" — the
// part of the step that grew most names the reason; the percentage is a share of the slower step.
std::string why_faster(const SweepRow& winner, const SweepRow& other);

// What each second-stage technique did to the best first-stage plan of each family
// (TechniqueGain), as lines "  colocated llm t2 d32 | vision t1 d64 sp dopt: sorted 1.004x, ...".
std::vector<std::string> technique_lines(const SweepResult& result, const ModelSpec& model);

}  // namespace tessera::sim

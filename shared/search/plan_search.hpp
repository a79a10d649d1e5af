// Plan search: enumerate candidate plans per placement family from a SearchSpace, reject the
// invalid ones with a counted reason, and rank the rest with the analytic estimate.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "shared/layout/scenario.hpp"
#include "shared/layout/search_space.hpp"
#include "shared/search/estimate.hpp"

namespace tessera {

struct Candidate {
  std::string key;  // stable id: the canonical JSON of (gpus, plan)
  int64_t gpus = 0;
  ParallelPlan plan;
};

struct Enumeration {
  std::vector<Candidate> valid;             // in enumeration order
  std::map<std::string, int64_t> rejected;  // reason -> count
  int64_t considered = 0;
};

// The scenario's cluster resized to `gpus` devices (whole nodes; fewer than a node's devices
// make one smaller node). REQUIRES: gpus >= 1.
ClusterSpec cluster_with_devices(const ClusterSpec& cluster, int64_t gpus);

// Every candidate of the space for `gpus` devices, validated against the scenario, frozen-aware
// stage boundaries priced with `cost` (a calibration profile's; nullptr: analytic). Memory is
// not checked here (rank_candidates does, since it needs the lowered program).
// `encoder_share` > 0 (Entrain's static layout, encoder_work_share()): non-colocated plans also
// give the encoders that share of the devices.
Enumeration enumerate_plans(const Scenario& scenario, const SearchSpace& space, int64_t gpus,
                            const CostParams* cost = nullptr, double encoder_share = 0);

// The second stage of the search (SearchSpace::refine): each of `bases` again with one costlier
// technique, or DIP with a micro-batching policy — every variant that validates on `gpus`
// devices and is not among `known` (candidate keys), with the technique it tries ("entrain",
// "dip+sorted", "cp zigzag") and the index of its base.
struct Refinement {
  Candidate candidate;
  std::size_t base = 0;
  std::string technique;
};
std::vector<Refinement> refinements(const Scenario& scenario, const SearchSpace& space,
                                    const std::vector<const Candidate*>& bases, int64_t gpus,
                                    const std::set<std::string>& known);

// A short name for why a plan was rejected, from its first validation message.
std::string rejection_reason(const std::string& message);

struct RankedCandidate {
  Candidate candidate;
  Estimate estimate;
};

// Estimates every candidate (iteration `iteration`'s batch; with `batches` > 1 the mean of the
// batches from `iteration` on) on `threads` threads, moves plans
// that do not fit in memory into `rejected` ("memory"), and sorts the rest by step time (then
// key). The result does not depend on `threads`. `cost`: a calibration profile's parameters
// (nullptr: default_cost_params()). `progress(done, total)`, when given, is called as each
// candidate is estimated, one call at a time. `leanest`, when given, receives the plan that
// needs the least memory among those that did not fit (if any did not; its estimate's
// peak_memory and capacity_bytes say how much), unless a plan it already holds needs less.
using EstimateProgress = std::function<void(std::size_t done, std::size_t total)>;
std::vector<RankedCandidate> rank_candidates(const Scenario& scenario,
                                             std::vector<Candidate> candidates, int64_t iteration,
                                             std::map<std::string, int64_t>& rejected,
                                             int threads = 1, const CostParams* cost = nullptr,
                                             int64_t batches = 1,
                                             const EstimateProgress& progress = {},
                                             std::optional<RankedCandidate>* leanest = nullptr);

// Sorts by step time, then key (a total order: the same on every machine and thread count).
void sort_by_estimate(std::vector<RankedCandidate>& ranked);

}  // namespace tessera

// Frozen-aware pipeline partitioning (Cornstarch; docs/ALGORITHMS.md §1): where a module's
// layers are cut into pipeline stages. A layer costs its forward, plus a backward for inputs when
// a gradient must pass through it, plus a weight backward when it trains — so a frozen encoder
// costs about a third of a trainable one — and the stages are cut to minimise the largest. The
// baseline, `stage_split: uniform`, cuts equal layer counts and ignores what is frozen (what
// Megatron does).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/layout/parallel_plan.hpp"
#include "shared/spec/cluster_spec.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

// Splits `costs` (per layer, in order) into `stages` contiguous non-empty parts minimising the
// largest part, `first_extra` counting on the first part and `last_extra` on the last (work the
// stage holds besides its layers). Exact (linear-partition DP); among the splits that reach the
// least largest part, the most even one (least sum of squared parts), earlier stages longer.
// REQUIRES: 1 <= stages <= costs.size().
std::vector<int64_t> linear_partition(const std::vector<double>& costs, int64_t stages,
                                      double first_extra = 0, double last_extra = 0);

// The seconds one micro-batch spends along a module's layer chain — per layer, and what its first
// stage (front end; in a homogeneous plan the encoders and projectors hosted there) and its last
// stage (output head and loss) add — priced by the cost model with `params` (a calibration
// profile's; nullptr: the cluster's analytic defaults): a frozen layer
// with nothing trainable upstream runs only its forward, one that passes gradients adds the input
// backward, a trainable one the weight backward too; TP all-reduces and per-layer overheads
// count.
struct ChainCosts {
  std::vector<double> layers;
  double first_extra = 0;
  double last_extra = 0;
};
// Mean token counts come from the workload's first batches (deterministic), so every iteration
// and every rank sees the same split. REQUIRES: plan validated, module has a transformer.
ChainCosts chain_costs(const ModelSpec& model, std::size_t module, const ParallelPlan& plan,
                       const WorkloadSpec& workload, const ClusterSpec& cluster,
                       const CostParams* params = nullptr);

// The plan with `stage_layers` filled for every pipelined module, by the frozen-aware partition
// of its chain costs, when the plan asks for `frozen_aware` and gives no layers itself; as given
// otherwise (uniform: even layers, lower()'s default). lower() needs this done first; estimate(),
// simulate() and the commands do it once with their costs (`params`: a calibration profile's, so
// the split follows the measured costs; null: the analytic defaults).
ParallelPlan resolve_stage_split(const ParallelPlan& plan, const ModelSpec& model,
                                 const WorkloadSpec& workload, const ClusterSpec& cluster,
                                 const CostParams* params = nullptr);

// Layers per stage of each pipelined module: "llm 3,5" (homogeneous), "vision even | llm 6,6,5"
// (non-colocated; "even" where the plan gives none); a run of three or more stages with the same
// count as "count×stages": "llm 1,2×62,1".
std::string stage_layers_text(const ParallelPlan& plan, const ModelSpec& model);

}  // namespace tessera

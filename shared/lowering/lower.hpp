// lower(): one training iteration of a plan, as a per-rank Program (program.hpp).
// Placements: homogeneous (encoders in the LLM's first pipeline stage), colocated (three-phase:
// encoders on all ranks, boundary regroup, LLM pipeline, encoder backward), non_colocated
// (module pipelines on disjoint spans, leader send/recv + broadcast at boundaries, graph-aware
// 1F1B). What runs follows from the model: frozen modules get no weight-gradient ops, no DP
// reduction, no optimizer step; backward ops nothing consumes are not emitted.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "shared/layout/dip_schedule.hpp"
#include "shared/layout/parallel_plan.hpp"
#include "shared/model/batch.hpp"
#include "shared/model/gradient_flow.hpp"
#include "shared/program/program.hpp"
#include "shared/spec/cluster_spec.hpp"

namespace tessera {

struct Lowered {
  Program program;
  std::vector<std::string> notes;  // approximations a user should know about
  std::string error;               // non-empty: the plan uses an option lower() cannot express yet
  // schedule dip: layers per virtual stage of each encoder (P) and the LLM (P·V) as lowered,
  // by ModelSpec index — where the schedule search starts moving layers from.
  std::map<int32_t, std::vector<int64_t>> dip_layers;
};

// Why lower() refuses a validated plan (an option it cannot express yet), or "": lower() returns
// exactly this as Lowered::error and lowers every other validated plan.
std::string lowering_refusal(const ParallelPlan& plan, const ModelSpec& model,
                             const DipSchedule* dip = nullptr);
// The same, with the plan's modules already placed (place_modules).
std::string lowering_refusal(const ParallelPlan& plan, const ModelSpec& model,
                             const DipSchedule* dip, const std::vector<PlacedModule>& placed);

// Whether lower() folds ranks that would run the same ops at the same times into one class
// (Program::represented_by). kIdentical folds, in homogeneous placements outside DIP, the
// tensor-parallel shards of each stage and — when every data-parallel replica's micro-batches
// hold samples of the same shapes as the first replica's — the replicas too, provided every
// member's groups and pipeline neighbours sit on the cluster's nodes as its representative's
// do (so every cost is the same); otherwise it folds less or nothing. The evaluator, the
// metrics and the SimGrid simulator read folded Programs; the executor, its traces and replays
// need every rank's ops (kOff).
enum class RankFolding : uint8_t { kOff, kIdentical };

// REQUIRES: plan validated against model, workload and cluster, its frozen-aware stage split
// resolved (stage_split_resolved; resolve_stage_split in stage_split.hpp does it with the cost
// model); batch drawn from workload.
// `dip`: the batch's schedule under schedule dip (dip_search.hpp); null: the starting one
// (encoders in topological order, even layers).
Lowered lower(const ModelSpec& model, const ClusterSpec& cluster, const ParallelPlan& plan,
              const WorkloadSpec& workload, const Batch& batch, const DipSchedule* dip = nullptr,
              RankFolding folding = RankFolding::kOff);

}  // namespace tessera

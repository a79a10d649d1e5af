// Scenario: model + workload + cluster [+ plan] [+ search space], the input of every command.
// Each part is inline JSON or a path to a JSON file, resolved relative to the scenario file;
// problems are reported against the file that holds them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/layout/parallel_plan.hpp"
#include "shared/layout/search_space.hpp"
#include "shared/spec/cluster_spec.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

// A measurement of this exact run published by others: what `tessera fidelity` compares the
// prediction with. `step_s` is the published step time, or the step time the published figure
// implies (the conversion written in `metric`).
struct Published {
  double step_s = 0;
  std::string metric;     // the published figure as stated, and how step_s follows from it
  std::string source;     // paper + table, or page + section
  std::string source_id;  // short name of the source: leave-one-source-out folds by it
  std::string series;     // the scaling series the row belongs to (ranked within it)
  bool holdout = false;   // kept aside as an independent check: never used to fit
  // The published figure is a mean over this many steps or more: the prediction is the mean
  // step of the workload's first `iterations` drawn batches (1 for data whose batches repeat).
  int64_t iterations = 1;
  bool operator==(const Published&) const = default;
};

struct Scenario {
  std::string file;  // where it was loaded from ("" when built in memory)
  std::string name;
  std::string description;
  ModelSpec model;
  WorkloadSpec workload;
  ClusterSpec cluster;
  // Modules this scenario freezes besides those the model file marks frozen ("freeze": ["vision",
  // "llm"]): one model file serves a pretraining stage that trains only the projectors and a
  // fine-tuning stage that trains more. Already applied to `model`.
  std::vector<std::string> freeze;
  std::optional<ParallelPlan> plan;
  std::optional<SearchSpace> search;
  std::optional<Published> published;
  // For each part given as a path: that path as written ("" = inline). Kept for the round trip.
  std::string model_ref, workload_ref, cluster_ref, plan_ref;
};

// Loads and validates a scenario file. nullopt when any problem was found (all in `diag`).
std::optional<Scenario> load_scenario(const std::string& file, Diagnostics& diag);
// The same from JSON already parsed; `file` names it in messages and anchors relative paths.
std::optional<Scenario> read_scenario(const Json& json, const std::string& file, Diagnostics& diag);

// Cross-part rules: the model can train (has an llm), the workload's media have encoders,
// the plan fits model, workload and cluster.
void validate_scenario(const Scenario& scenario, Diagnostics& diag);

// Parts given by path are written back as paths; inline parts inline.
Json to_json(const Scenario& scenario);

// The scenario as one self-contained JSON document: every part inline (a manifest path made
// absolute), so a field of any part can be changed and the result read back.
Json inline_scenario_json(const Scenario& scenario);

// Sets `value` at a dotted JSON path ("cluster.inter_node.bandwidth_bytes_per_s",
// "model.modules[0].frozen"). Intermediate objects must exist; the last key may be new.
// Returns an error message, or "".
std::string set_json_path(Json& root, const std::string& path, const Json& value);

// Loaders for files that hold one part only (a model.json, a cluster.json ...).
std::optional<ModelSpec> load_model(const std::string& file, Diagnostics& diag);
std::optional<ClusterSpec> load_cluster(const std::string& file, Diagnostics& diag);

}  // namespace tessera

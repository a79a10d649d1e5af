// A calibration profile: the cost-model parameters `tessera calibrate` fitted to recorded runs,
// with the machine they were measured on and how well each fit holds (profile.json). `tessera
// simulate / sweep / replay --profile` load one and use its fits in place of the analytic
// defaults; classes it did not fit keep the defaults.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/base/json_reader.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/spec/cluster_spec.hpp"

namespace tessera {

struct Profile {
  // Where the measurements come from.
  ClusterKind cluster_kind = ClusterKind::kCpuLocal;
  std::string device;             // the cluster's device name
  int64_t cores = 0;              // the machine's cores (cpu-local)
  std::string cpu;                // the machine's processor model
  std::vector<std::string> runs;  // run directories fitted
  int64_t warmup_iterations = 1;  // traced iterations left out of every run
  // The fits (CostParams' fitted members; the analytic members are not part of a profile).
  std::vector<ComputeFit> compute;
  std::vector<LinkFit> collectives;
  std::vector<LinkFit> p2p;
  std::optional<OptimizerFit> optimizer;
  double overlap_slowdown = 1;
  FitStats overlap_stats;
  std::vector<std::string> warnings;  // what calibrate warned about
};

Json to_json(const Profile& profile);
// Reads and checks a profile file (every problem named by file and JSON path in `diag`).
std::optional<Profile> load_profile(const std::string& file, Diagnostics& diag);

// The cost parameters for `cluster` with the profile's fits. A profile measured on another
// kind of cluster or device is refused (recorded in `diag` under `file`).
CostParams profile_cost_params(const Profile& profile, const ClusterSpec& cluster,
                               const std::string& file, Diagnostics& diag);

extern const EnumTable<SizeClass> kSizeClasses;

}  // namespace tessera

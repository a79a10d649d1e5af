// The cost model: pure functions from an op to seconds and from a rank's state to bytes.
// Defaults are analytic and documented here; a calibration profile (issue 8) overrides any of
// the parameters.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "shared/cluster_spec.hpp"
#include "shared/program.hpp"

namespace tessera {

struct CostParams {
  // Fraction of the device's dense peak a Compute op sustains, by (module role, phase).
  // Default: kDefaultEfficiency for every class.
  std::map<std::pair<ModuleRole, Phase>, double> efficiency;
  double default_efficiency = 0.6;
  // Fixed cost per transformer layer of a Compute op (kernel launches, norms, small ops).
  double overhead_per_layer_s = 25e-6;
  // Fixed cost of any Compute op (framework dispatch).
  double overhead_per_op_s = 10e-6;
  // Scale of the link bandwidths taken from the cluster (NCCL reaches ~80-90% of the wire).
  double bandwidth_efficiency = 0.85;
};

// Analytic defaults for a cluster kind: GPUs sustain 60% of dense peak in large matmuls
// (Megatron's GPT runs: 52% MFU end to end), CPUs 50% with larger per-layer overheads.
CostParams default_cost_params(const ClusterSpec& cluster);

class CostModel {
 public:
  // REQUIRES: the program's groups and ranks were built for `cluster`.
  CostModel(const ClusterSpec& cluster, DType dtype, CostParams params,
            const std::vector<ModuleRole>& module_roles);

  // Seconds of a Compute op, nested collectives included; or of an optimizer step.
  double compute_s(const Program& program, const Op& op) const;
  // The same without the nested collectives (a simulator runs those itself).
  double compute_only_s(const Program& program, const Op& op) const;
  // Seconds of one collective of `bytes` (NCCL-tests size) over `group`.
  double collective_s(CollectiveKind kind, const RankList& group, double bytes) const;
  // Seconds for a point-to-point message between two ranks.
  double p2p_s(int64_t from, int64_t to, double bytes) const;

  // Bus bandwidth and latency between the members of a group: inside one node, or across.
  bool same_node(const RankList& group) const;
  const ClusterSpec& cluster() const { return cluster_; }
  const CostParams& params() const { return params_; }

 private:
  double efficiency(const Op& op) const;
  ClusterSpec cluster_;
  DType dtype_;
  CostParams params_;
  std::vector<ModuleRole> roles_;
};

// NCCL-tests bus-bandwidth factor of a collective over n ranks: time = factor · S / B.
double bus_factor(CollectiveKind kind, int64_t n);

// Mixed-precision Adam per parameter: 16-bit weight; trainable ones add a 4-byte gradient and
// 12 bytes of fp32 master weight and moments (divided over `optimizer_shards` ranks with a
// distributed optimizer) — 18 bytes, or 6 + 12/dp (ALGORITHMS.md §6).
RankMemory parameter_memory(double parameters, bool trainable, int64_t optimizer_shards,
                            DType dtype);

}  // namespace tessera

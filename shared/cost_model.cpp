#include "shared/cost_model.hpp"

#include <algorithm>

#include "shared/check.hpp"

namespace tessera {

CostParams default_cost_params(const ClusterSpec& cluster) {
  CostParams p;
  if (cluster.kind == ClusterKind::kCpuLocal) {
    p.default_efficiency = 0.5;
    p.overhead_per_layer_s = 100e-6;
    p.overhead_per_op_s = 50e-6;
    p.bandwidth_efficiency = 1.0;
  }
  return p;
}

double bus_factor(CollectiveKind kind, int64_t n) {
  if (n <= 1) return 0;
  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2 * ring;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      return ring;
    case CollectiveKind::kBroadcast:
      return 1;
  }
  return 1;
}

CostModel::CostModel(const ClusterSpec& cluster, DType dtype, CostParams params,
                     const std::vector<ModuleRole>& roles)
    : cluster_(cluster), dtype_(dtype), params_(std::move(params)), roles_(roles) {}

bool CostModel::same_node(const RankList& group) const {
  if (cluster_.kind == ClusterKind::kCpuLocal || group.empty()) return true;
  const int64_t node = group.front() / cluster_.devices_per_node;
  return std::all_of(group.begin(), group.end(),
                     [&](int64_t r) { return r / cluster_.devices_per_node == node; });
}

double CostModel::collective_s(CollectiveKind kind, const RankList& group, double bytes) const {
  const int64_t n = static_cast<int64_t>(group.size());
  if (n <= 1 || bytes <= 0) return 0;
  const bool local = same_node(group);
  const LinkSpec& link = local ? cluster_.intra_node : cluster_.inter_node.link;
  double bandwidth = link.bandwidth_bytes_per_s * params_.bandwidth_efficiency;
  if (!local) bandwidth /= std::max(1.0, cluster_.inter_node.oversubscription);
  // Ring algorithms take n-1 latency steps (all-reduce: 2(n-1)); broadcast pipelines.
  const double steps = kind == CollectiveKind::kAllReduce   ? 2.0 * static_cast<double>(n - 1)
                       : kind == CollectiveKind::kBroadcast ? 1.0
                                                            : static_cast<double>(n - 1);
  return steps * link.latency_s + bus_factor(kind, n) * bytes / bandwidth;
}

double CostModel::p2p_s(int64_t from, int64_t to, double bytes) const {
  const bool local = same_node({from, to});
  const LinkSpec& link = local ? cluster_.intra_node : cluster_.inter_node.link;
  double bandwidth = link.bandwidth_bytes_per_s * params_.bandwidth_efficiency;
  if (!local) bandwidth /= std::max(1.0, cluster_.inter_node.oversubscription);
  return link.latency_s + bytes / bandwidth;
}

double CostModel::efficiency(const Op& op) const {
  if (op.module >= 0 && static_cast<std::size_t>(op.module) < roles_.size()) {
    const auto it =
        params_.efficiency.find({roles_[static_cast<std::size_t>(op.module)], op.phase});
    if (it != params_.efficiency.end()) return it->second;
  }
  return params_.default_efficiency;
}

double CostModel::compute_s(const Program& program, const Op& op) const {
  double seconds = compute_only_s(program, op);
  for (const NestedCollective& n : op.nested)
    seconds +=
        n.count * collective_s(n.kind, program.groups[static_cast<std::size_t>(n.group)], n.bytes);
  return seconds;
}

double CostModel::compute_only_s(const Program& program, const Op& op) const {
  if (op.kind == OpKind::kOptimizerStep)
    return params_.overhead_per_op_s + op.bytes / cluster_.device.memory_bandwidth_bytes_per_s;
  TESSERA_CHECK(op.kind == OpKind::kCompute);
  // cpu-local ranks share the machine's cores.
  double peak = peak_flops(cluster_, dtype_);
  if (cluster_.kind == ClusterKind::kCpuLocal && program.world > cluster_.cores)
    peak *= static_cast<double>(cluster_.cores) / static_cast<double>(program.world);
  double seconds =
      params_.overhead_per_op_s + static_cast<double>(op.layers) * params_.overhead_per_layer_s;
  if (op.flops > 0) seconds += op.flops / (peak * efficiency(op));
  return seconds;
}

RankMemory parameter_memory(double parameters, bool trainable, int64_t optimizer_shards,
                            DType dtype) {
  RankMemory m;
  m.weight_bytes = parameters * static_cast<double>(dtype_bytes(dtype));
  if (trainable) {
    m.gradient_bytes = parameters * 4.0;
    m.optimizer_bytes =
        parameters * 12.0 / static_cast<double>(std::max<int64_t>(1, optimizer_shards));
  }
  return m;
}

}  // namespace tessera

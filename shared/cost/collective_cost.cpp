#include "shared/cost/collective_cost.hpp"

#include <algorithm>
#include <cmath>
#include <ranges>
#include <vector>

#include "shared/base/check.hpp"
#include "shared/cost/cost_model.hpp"

namespace tessera {

GroupSpan group_span(const ClusterSpec& cluster, const RankList& group) {
  GroupSpan span;
  if (group.empty() || cluster.devices_per_node <= 0) return span;
  // The nodes of the members in order (groups mostly list their ranks ascending already), then
  // counted run by run: no allocation for a sorted group, called per collective priced.
  const int64_t per = cluster.devices_per_node;
  const auto node_runs = [&](auto&& nodes_in_order) {
    int64_t run = 0, last = -1;
    span.nodes = 0;
    span.per_node = 0;
    for (int64_t node : nodes_in_order) {
      if (node != last) {
        ++span.nodes;
        run = 0;
        last = node;
      }
      span.per_node = std::max(span.per_node, ++run);
    }
  };
  if (std::is_sorted(group.begin(), group.end())) {
    node_runs(group | std::views::transform([per](int64_t r) { return r / per; }));
  } else {
    std::vector<int64_t> nodes(group.size());
    std::transform(group.begin(), group.end(), nodes.begin(), [per](int64_t r) { return r / per; });
    std::sort(nodes.begin(), nodes.end());
    node_runs(nodes);
  }
  return span;
}

double log_interpolated(const std::vector<std::pair<double, double>>& curve, double x) {
  TESSERA_CHECK(!curve.empty());
  if (x <= curve.front().first) return curve.front().second;
  if (x >= curve.back().first) return curve.back().second;
  const auto upper = std::upper_bound(curve.begin(), curve.end(), x,
                                      [](double v, const auto& point) { return v < point.first; });
  const auto lower = upper - 1;
  const double f = std::log(x / lower->first) / std::log(upper->first / lower->first);
  return lower->second + f * (upper->second - lower->second);
}

double curve_bus_bandwidth(const BusBandwidthCurve& curve, double bytes) {
  TESSERA_CHECK(!curve.empty());
  const auto& [first_bytes, first_bw] = curve.front();
  // Below the first point the time stays the first point's: bandwidth grows with the size.
  if (bytes <= first_bytes) return first_bw * bytes / first_bytes;
  return log_interpolated(curve, bytes);
}

namespace {

const BusBandwidthCurve& curve_for(const NodeCollectives& node, CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
      return node.all_gather.empty() ? node.all_reduce : node.all_gather;
    case CollectiveKind::kReduceScatter:
      return node.reduce_scatter.empty() ? node.all_reduce : node.reduce_scatter;
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kBroadcast:
      return node.all_reduce;
  }
  return node.all_reduce;
}

}  // namespace

namespace {

// ln C(n, r).
double log_choose(int64_t n, int64_t r) {
  return std::lgamma(static_cast<double>(n) + 1) - std::lgamma(static_cast<double>(r) + 1) -
         std::lgamma(static_cast<double>(n - r) + 1);
}

// Picks spread at random over `nodes` equally likely nodes: the distinct ones they reach.
double reached_of_uniform(double nodes, double picks) {
  return nodes * (1.0 - std::pow(1.0 - 1.0 / nodes, picks));
}

}  // namespace

double expected_nodes_reached(const GroupSpan& span, const Routing& routing) {
  const int64_t nodes = span.nodes;
  const double k = static_cast<double>(routing.top_k);
  const int64_t groups = routing.groups, best = routing.group_top_k;
  if (nodes <= 1) return 1.0;
  if (groups <= 1 || best >= groups) return reached_of_uniform(static_cast<double>(nodes), k);
  // A best group is best for its best scores, so each of them gets a pick (of k picks, at most
  // k groups do): `picked` groups, a random set of the G.
  const int64_t picked = std::min(best, routing.top_k);
  if (groups % nodes == 0) {
    // m whole groups a node: a node is reached when one of its groups is picked.
    const int64_t m = groups / nodes;
    if (picked > groups - m) return static_cast<double>(nodes);
    return static_cast<double>(nodes) *
           (1.0 - std::exp(log_choose(groups - m, picked) - log_choose(groups, picked)));
  }
  // Groups over several nodes (or straddling them): each picked group's k / picked picks spread
  // over its nodes, at most all of them.
  const double group_nodes = static_cast<double>(nodes) / static_cast<double>(groups);
  const double per_group = std::max(1.0, group_nodes);
  return std::min(
      static_cast<double>(nodes),
      static_cast<double>(picked) * reached_of_uniform(per_group, k / static_cast<double>(picked)));
}

double node_deduplicated_share(const GroupSpan& span, const Routing& routing) {
  if (span.nodes <= 1 || routing.top_k <= 1) return 1.0;
  return expected_nodes_reached(span, routing) / static_cast<double>(routing.top_k);
}

AllToAllRate all_to_all_rate(const NetworkSpec& net, Transport transport, double ring_efficiency,
                             double link_latency_s, int64_t nodes) {
  if (transport == Transport::kHybridEp && !net.hybridep_efficiency.empty())
    return {log_interpolated(net.hybridep_efficiency, static_cast<double>(nodes)), link_latency_s};
  if (transport == Transport::kDeepEp || transport == Transport::kHybridEp)
    return {net.deepep_efficiency > 0 ? net.deepep_efficiency : ring_efficiency, link_latency_s};
  return {net.all_to_all_efficiency > 0 ? net.all_to_all_efficiency : ring_efficiency,
          net.all_to_all_latency_s > 0 ? net.all_to_all_latency_s : link_latency_s};
}

double nccl_collective_s(const ClusterSpec& cluster, CollectiveKind kind, int64_t n,
                         const GroupSpan& span, double bytes, double nic_efficiency,
                         Transport transport) {
  TESSERA_CHECK(!cluster.intra_node_collectives.empty());
  if (n <= 1 || bytes <= 0) return 0;
  const BusBandwidthCurve& curve = curve_for(cluster.intra_node_collectives, kind);
  double bus = curve_bus_bandwidth(curve, bytes);
  const double factor = bus_factor(kind, n);
  if (span.nodes <= 1) return factor * bytes / bus;
  // Across nodes: every ring crosses each node boundary on its own NIC; a node's members share
  // min(members, NICs) NICs, and the fabric's oversubscription divides them.
  const int64_t nics = std::min(span.per_node, cluster.inter_node.nics_per_node > 0
                                                   ? cluster.inter_node.nics_per_node
                                                   : cluster.devices_per_node);
  // The NICs' line rate at `efficiency`, shared by the fabric's oversubscription.
  const auto rail_at = [&](double efficiency) {
    return static_cast<double>(nics) * cluster.inter_node.link.bandwidth_bytes_per_s * efficiency /
           std::max(1.0, cluster.inter_node.oversubscription);
  };
  const double rail = rail_at(nic_efficiency);
  const double latency = cluster.inter_node.link.latency_s;
  if (kind == CollectiveKind::kAllToAll) {
    // No ring: each member sends every other its 1/n share at once. What goes to the other
    // nodes' members leaves through the node's NICs, all its members' shares together, at the
    // all-to-all's own rate; the shares for its own node's members go over NVLink meanwhile.
    const double members = static_cast<double>(span.per_node);
    const double share = bytes / static_cast<double>(n);
    const double leaving = members * share * static_cast<double>(n - span.per_node);
    const double inside = share * (members - 1) / bus;
    const AllToAllRate a2a =
        all_to_all_rate(cluster.inter_node, transport, nic_efficiency, latency, span.nodes);
    return std::max(leaving / rail_at(a2a.efficiency), inside) + a2a.latency_s;
  }
  // The node curve's shape in size, capped at what the NICs carry.
  bus *= std::min(1.0, rail / curve.back().second);
  const double nodes = static_cast<double>(span.nodes);
  // Each step that crosses nodes pays the network latency: the steps of a ring over the nodes.
  const double ring = factor * bytes / bus + latency_steps(kind, span.nodes) * latency;
  if (kind != CollectiveKind::kAllReduce) return ring;
  const double tree = factor * bytes / (0.92 * bus) + 2 * std::ceil(std::log2(nodes)) * latency;
  return std::min(ring, tree);
}

}  // namespace tessera

// Collectives priced as NCCL runs them on a GPU cluster whose node has measured bus-bandwidth
// curves (ClusterSpec::intra_node_collectives): the bus bandwidth a message of its size reaches
// inside a node; across nodes, rings that use min(members per node, NICs per node) NICs at once
// (rail-aligned) and pay a network latency per step that crosses nodes; all-reduce as the faster
// of a ring and a tree (log-depth latency, NCCL's 0.92 tree bandwidth); all-to-alls through the
// NICs at once, at their own measured rate. Sources: docs/FIDELITY.md.
#pragma once

#include <cstdint>

#include "shared/program/program.hpp"
#include "shared/spec/cluster_spec.hpp"

namespace tessera {

// Where a group's members sit: how many nodes it spans and the most members on one node.
struct GroupSpan {
  int64_t nodes = 1;
  int64_t per_node = 1;
};
GroupSpan group_span(const ClusterSpec& cluster, const RankList& group);

// Bus bandwidth of `curve` at `bytes` (see BusBandwidthCurve).
double curve_bus_bandwidth(const BusBandwidthCurve& curve, double bytes);

// The curve's y at `x`: linear in log(x) between the points around it, the end point's beyond
// either end. REQUIRES: !curve.empty(), x increasing along it.
double log_interpolated(const std::vector<std::pair<double, double>>& curve, double x);

// How a token's experts are picked: `top_k` of them, with group-limited routing from the
// `group_top_k` best of `groups` contiguous groups of experts (groups 0: no groups).
struct Routing {
  int64_t top_k = 1;
  int64_t groups = 0;
  int64_t group_top_k = 0;
};

// The nodes of a group of `span` a token's experts lie on, on average, the experts spread evenly
// over the nodes in order. Without groups each pick lands on a node at random: nodes (1 - (1 -
// 1/nodes)^k). With groups each of the token's best groups gets a pick (it is best for its best
// scores; of k picks at most k groups get one): with m whole groups a node, a node is reached
// when one of its m is among them, nodes (1 - C(G - m, T) / C(G, T)); a group over several nodes
// spreads its picks over them at random.
double expected_nodes_reached(const GroupSpan& span, const Routing& routing);

// DeepEP's share of an all-to-all dispatcher's bytes, over a group of `span`: a token goes once
// to each node holding any of its experts (expected_nodes_reached), not once per expert. 1
// inside one node.
double node_deduplicated_share(const GroupSpan& span, const Routing& routing);

// How an all-to-all across `nodes` nodes moves: the fraction of the NICs' line rate, and the
// fixed seconds of a call. NCCL's: NetworkSpec's all_to_all_efficiency and all_to_all_latency_s;
// DeepEP's kernels: its deepep_efficiency and the link's latency; HybridEP's: its
// hybridep_efficiency at `nodes` (else DeepEP's) and the link's latency; each unset one the
// rings' (`ring_efficiency`, `link_latency_s`).
struct AllToAllRate {
  double efficiency = 1;
  double latency_s = 0;
};
AllToAllRate all_to_all_rate(const NetworkSpec& net, Transport transport, double ring_efficiency,
                             double link_latency_s, int64_t nodes);

// Seconds of one collective of `bytes` (nccl-tests size) over `n` ranks placed as `span`.
// `nic_efficiency`: the fraction of a NIC's line rate NCCL's rings move.
// REQUIRES: !cluster.intra_node_collectives.empty().
double nccl_collective_s(const ClusterSpec& cluster, CollectiveKind kind, int64_t n,
                         const GroupSpan& span, double bytes, double nic_efficiency,
                         Transport transport = Transport::kNccl);

}  // namespace tessera

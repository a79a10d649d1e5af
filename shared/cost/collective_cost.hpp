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

// DeepEP's share of an all-to-all dispatcher's bytes, over a group of `span`: a token goes once
// to each other node holding any of its `top_k` experts (the experts spread evenly over the
// nodes, each pick a node at random: (nodes - 1)(1 - (1 - 1/nodes)^k) of them on average), not
// once per expert on another node (k (nodes - 1)/nodes). 1 inside one node.
double node_deduplicated_share(const GroupSpan& span, int64_t top_k);

// Seconds of one collective of `bytes` (nccl-tests size) over `n` ranks placed as `span`.
// `nic_efficiency`: the fraction of a NIC's line rate NCCL moves.
// REQUIRES: !cluster.intra_node_collectives.empty().
double nccl_collective_s(const ClusterSpec& cluster, CollectiveKind kind, int64_t n,
                         const GroupSpan& span, double bytes, double nic_efficiency);

}  // namespace tessera

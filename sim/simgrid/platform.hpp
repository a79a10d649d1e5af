// Internal to the adapter: the SimGrid platform built from a ClusterSpec.
#pragma once

#include <memory>
#include <vector>

#include <simgrid/s4u.hpp>

#include "shared/spec/cluster_spec.hpp"

namespace tessera::sim {

// A fresh engine with the network model used everywhere: CM02 (latency + size / bandwidth),
// no reverse-direction cross-traffic, no TCP window bound.
std::unique_ptr<simgrid::s4u::Engine> make_engine();

// GPU clusters: one host per device; inside a node NVLink-class split-duplex links per device
// (latency halved on each side, so a device-to-device route has the link's latency) and a NIC
// link per device to the node's gateway; nodes hang off a star with one uplink per node whose
// capacity is devices x NIC bandwidth / oversubscription. cpu-local: one host with `cores` cores
// and a shared loopback link. Bandwidths are multiplied by `bandwidth_efficiency`.
// Returns the host of every rank (cpu-local: the same host `world` times).
std::vector<simgrid::s4u::Host*> build_platform(const ClusterSpec& cluster,
                                                double bandwidth_efficiency, int64_t world);

}  // namespace tessera::sim

// ClusterSpec: the machines a plan runs on. All quantities in SI units (bytes, bytes/s,
// seconds, FLOP/s), so JSON round-trips exactly; scenarios write them as 450e9 etc.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "shared/json_reader.hpp"
#include "shared/model_spec.hpp"

namespace tessera {

enum class ClusterKind {
  kGpu,       // nodes x devices_per_node accelerators
  kCpuLocal,  // this machine: one host whose cores all ranks share
};
extern const EnumTable<ClusterKind> kClusterKinds;
enum class Topology { kFatTree, kSingleSwitch };

struct DeviceSpec {
  std::string name;
  std::map<DType, double> peak_flops;  // dense peak FLOP/s per precision
  int64_t memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  bool operator==(const DeviceSpec&) const = default;
};

struct LinkSpec {
  double bandwidth_bytes_per_s = 0;  // per device, per direction
  double latency_s = 0;
  bool operator==(const LinkSpec&) const = default;
};

struct NetworkSpec {
  LinkSpec link;  // per-device NIC
  Topology topology = Topology::kFatTree;
  double oversubscription = 1.0;  // >= 1: uplink bandwidth = downlink / oversubscription
  bool operator==(const NetworkSpec&) const = default;
};

struct ClusterSpec {
  std::string name;
  std::string description;  // free text for people
  ClusterKind kind = ClusterKind::kGpu;
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node;     // NVLink-class (gpu) or shared memory (cpu-local)
  NetworkSpec inter_node;  // unused when nodes == 1
  // cpu-local only: the cores all ranks share, and one core's FLOP/s.
  int64_t cores = 0;
  double flops_per_core = 0;

  bool operator==(const ClusterSpec&) const = default;
};

ClusterSpec read_cluster(const Json& json, const std::string& file, const std::string& path,
                         Diagnostics& diag);
Json to_json(const ClusterSpec& cluster);

// Devices in the cluster. cpu-local: 0 (any world size; ranks share the cores).
int64_t device_count(const ClusterSpec& cluster);
// Peak FLOP/s of one device at `dtype`; falls back to fp32 peak, then 0.
double peak_flops(const ClusterSpec& cluster, DType dtype);

}  // namespace tessera

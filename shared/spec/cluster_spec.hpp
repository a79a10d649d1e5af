// ClusterSpec: the machines a plan runs on. All quantities in SI units (bytes, bytes/s,
// seconds, FLOP/s), so JSON round-trips exactly; scenarios write them as 450e9 etc.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shared/base/json_reader.hpp"
#include "shared/spec/device_kernels.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera {

enum class ClusterKind {
  kGpu,       // nodes x devices_per_node accelerators
  kCpuLocal,  // this machine: one host whose cores all ranks share
};
extern const EnumTable<ClusterKind> kClusterKinds;
enum class Topology { kFatTree, kSingleSwitch };

struct DeviceSpec {
  std::string name;
  std::string description;             // free text: where the numbers come from
  std::map<DType, double> peak_flops;  // dense peak FLOP/s per precision
  int64_t memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  // Kernel data (device_kernels.hpp): with it, compute is priced kernel by kernel; without it,
  // by FLOPs at a fixed fraction of peak (cost_model.hpp).
  std::optional<DeviceKernels> kernels;
  // The device this one is derived from (a device file's "base"), empty for none: the same die
  // run otherwise, whose fitted training scales it shares (`tessera fidelity --fit` fits the two
  // together).
  std::string base;
  // The device whose published runs fit this one's training scales.
  const std::string& fitted_as() const { return base.empty() ? name : base; }
  bool operator==(const DeviceSpec&) const = default;
};

// nccl-tests bus bandwidth by message size ("size" as nccl-tests counts it, bytes/s): points in
// increasing size, read between them linearly in log(size); below the first point a collective
// takes the first point's time (the latency floor), above the last it keeps the last bandwidth.
using BusBandwidthCurve = std::vector<std::pair<double, double>>;
// Bus bandwidth measured on one full node, per collective; a kind without its own curve uses the
// all-reduce's. Empty: the α–β link model.
struct NodeCollectives {
  BusBandwidthCurve all_reduce, all_gather, reduce_scatter;
  bool empty() const { return all_reduce.empty(); }
  bool operator==(const NodeCollectives&) const = default;
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
  // NICs per node (default: one per device). A ring that crosses nodes with k members per node
  // runs over min(k, nics_per_node) NICs at once (rail-aligned, as NCCL does).
  int64_t nics_per_node = 0;
  // Fraction of a NIC's line rate that NCCL moves; 0: the cost model's bandwidth_efficiency.
  double efficiency = 0;
  // NCCL's all-to-all across nodes (the all-to-all expert dispatcher's), which moves less than
  // its rings and costs more to start: the fraction of the line rate it reaches (0:
  // `efficiency`'s), and the fixed seconds of a call in place of the link's latency (0: the
  // link's).
  double all_to_all_efficiency = 0;
  double all_to_all_latency_s = 0;
  // DeepEP's internode kernels (the deepep expert dispatcher's): the fraction of the line rate
  // they move of the tokens bound for other nodes (0: `efficiency`'s).
  double deepep_efficiency = 0;
  // HybridEP's (the hybridep dispatcher's), by the nodes its group spans: [nodes, fraction]
  // points, nodes increasing, interpolated in log2(nodes) and held flat beyond the ends (empty:
  // deepep_efficiency's).
  std::vector<std::pair<double, double>> hybridep_efficiency;
  bool operator==(const NetworkSpec&) const = default;
};

struct ClusterSpec {
  std::string name;
  std::string description;  // free text for people
  ClusterKind kind = ClusterKind::kGpu;
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  DeviceSpec device;
  LinkSpec intra_node;                     // NVLink-class (gpu) or shared memory (cpu-local)
  NodeCollectives intra_node_collectives;  // intra_node.bus_bandwidth
  NetworkSpec inter_node;                  // unused when nodes == 1
  // cpu-local only: the cores all ranks share, and one core's FLOP/s.
  int64_t cores = 0;
  double flops_per_core = 0;

  bool operator==(const ClusterSpec&) const = default;
};

// The GPU `name_or_file` names as a cluster's "device" string does: a device file (a path) or a
// shipped device's name or alias. nullopt after recording why in `diag`.
std::optional<DeviceSpec> read_named_device(const std::string& name_or_file, Diagnostics& diag);

ClusterSpec read_cluster(const Json& json, const std::string& file, const std::string& path,
                         Diagnostics& diag);
Json to_json(const ClusterSpec& cluster);

// Devices in the cluster. cpu-local: 0 (any world size; ranks share the cores).
int64_t device_count(const ClusterSpec& cluster);
// Peak FLOP/s of one device at `dtype`; falls back to fp32 peak, then 0.
double peak_flops(const ClusterSpec& cluster, DType dtype);

}  // namespace tessera

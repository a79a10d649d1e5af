#include "shared/cluster_spec.hpp"

namespace tessera {

const EnumTable<ClusterKind> kClusterKinds = {{"gpu", ClusterKind::kGpu},
                                              {"cpu-local", ClusterKind::kCpuLocal}};

namespace {

const EnumTable<Topology> kTopologies = {{"fat_tree", Topology::kFatTree},
                                         {"single_switch", Topology::kSingleSwitch}};

LinkSpec read_link(ObjectReader& parent, std::string_view key, bool required) {
  LinkSpec link;
  const Json* v = parent.find(key);
  if (v == nullptr) {
    if (required) parent.missing(key);
    return link;
  }
  ObjectReader r(*v, parent.file(), parent.path_of(key), parent.diagnostics());
  if (r.required("bandwidth_bytes_per_s", link.bandwidth_bytes_per_s))
    r.check_positive("bandwidth_bytes_per_s", link.bandwidth_bytes_per_s);
  if (r.required("latency_s", link.latency_s)) r.check_at_least("latency_s", link.latency_s, 0.0);
  r.has({"topology", "oversubscription"});  // read by the caller for inter_node
  r.finish();
  return link;
}

Json to_json(const LinkSpec& link) {
  return Json{{"bandwidth_bytes_per_s", link.bandwidth_bytes_per_s}, {"latency_s", link.latency_s}};
}

}  // namespace

ClusterSpec read_cluster(const Json& json, const std::string& file, const std::string& path,
                         Diagnostics& diag) {
  ClusterSpec c;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return c;
  r.required("name", c.name);
  r.optional_enum("kind", c.kind, kClusterKinds);
  if (c.kind == ClusterKind::kCpuLocal) {
    if (r.required("cores", c.cores)) r.check_positive("cores", c.cores);
    if (r.required("flops_per_core", c.flops_per_core))
      r.check_positive("flops_per_core", c.flops_per_core);
    c.nodes = 1;
    c.devices_per_node = 1;
    for (const char* key : {"nodes", "devices_per_node", "inter_node"})
      if (r.has(key)) r.error(key, "not used with kind cpu-local");
  } else {
    for (const char* key : {"cores", "flops_per_core"})
      if (r.has(key)) r.error(key, "only used with kind cpu-local");
    if (r.required("nodes", c.nodes)) r.check_positive("nodes", c.nodes);
    if (r.required("devices_per_node", c.devices_per_node))
      r.check_positive("devices_per_node", c.devices_per_node);
  }

  if (const Json* d = r.find("device")) {
    ObjectReader dr(*d, file, r.path_of("device"), diag);
    dr.required("name", c.device.name);
    if (const Json* peaks = dr.find("peak_flops")) {
      ObjectReader pr(*peaks, file, dr.path_of("peak_flops"), diag);
      for (const auto& [name, dtype] : kDTypes) {
        double value = 0;
        if (pr.optional(name, value) && pr.check_positive(name, value))
          c.device.peak_flops[dtype] = value;
      }
      pr.finish();
      if (pr.valid() && c.device.peak_flops.empty())
        dr.error("peak_flops", "give at least one of bf16, fp16, fp32, fp8");
    } else if (c.kind == ClusterKind::kGpu) {
      dr.missing("peak_flops");
    }
    if (dr.required("memory_bytes", c.device.memory_bytes))
      dr.check_positive("memory_bytes", c.device.memory_bytes);
    if (dr.required("memory_bandwidth_bytes_per_s", c.device.memory_bandwidth_bytes_per_s))
      dr.check_positive("memory_bandwidth_bytes_per_s", c.device.memory_bandwidth_bytes_per_s);
    dr.finish();
  } else {
    r.missing("device");
  }

  c.intra_node = read_link(r, "intra_node", true);
  if (c.kind == ClusterKind::kGpu) {
    const bool multi_node = c.nodes > 1;
    c.inter_node.link = read_link(r, "inter_node", multi_node);
    if (const Json* net = r.find("inter_node")) {
      ObjectReader nr(*net, file, r.path_of("inter_node"), diag);
      nr.optional_enum("topology", c.inter_node.topology, kTopologies);
      if (nr.optional("oversubscription", c.inter_node.oversubscription))
        nr.check_at_least("oversubscription", c.inter_node.oversubscription, 1.0);
    }
  }
  r.optional("description", c.description);
  r.finish();
  return c;
}

Json to_json(const ClusterSpec& c) {
  Json j;
  j["name"] = c.name;
  if (!c.description.empty()) j["description"] = c.description;
  j["kind"] = enum_name(c.kind, kClusterKinds);
  if (c.kind == ClusterKind::kCpuLocal) {
    j["cores"] = c.cores;
    j["flops_per_core"] = c.flops_per_core;
  } else {
    j["nodes"] = c.nodes;
    j["devices_per_node"] = c.devices_per_node;
  }
  Json device;
  device["name"] = c.device.name;
  Json peaks = Json::object();
  for (const auto& [dtype, value] : c.device.peak_flops) peaks[enum_name(dtype, kDTypes)] = value;
  device["peak_flops"] = peaks;
  device["memory_bytes"] = c.device.memory_bytes;
  device["memory_bandwidth_bytes_per_s"] = c.device.memory_bandwidth_bytes_per_s;
  j["device"] = device;
  j["intra_node"] = to_json(c.intra_node);
  if (c.kind == ClusterKind::kGpu && c.inter_node.link.bandwidth_bytes_per_s > 0) {
    Json net = to_json(c.inter_node.link);
    net["topology"] = enum_name(c.inter_node.topology, kTopologies);
    net["oversubscription"] = c.inter_node.oversubscription;
    j["inter_node"] = net;
  }
  return j;
}

int64_t device_count(const ClusterSpec& c) {
  return c.kind == ClusterKind::kCpuLocal ? 0 : c.nodes * c.devices_per_node;
}

double peak_flops(const ClusterSpec& c, DType dtype) {
  if (c.kind == ClusterKind::kCpuLocal) return c.flops_per_core;
  if (auto it = c.device.peak_flops.find(dtype); it != c.device.peak_flops.end()) return it->second;
  if (auto it = c.device.peak_flops.find(DType::kFp32); it != c.device.peak_flops.end())
    return it->second;
  return 0;
}

}  // namespace tessera

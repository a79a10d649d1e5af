#include "shared/spec/cluster_spec.hpp"

#include <filesystem>

#include "shared/spec/device_catalog.hpp"

namespace tessera {

namespace fs = std::filesystem;

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
  // read by the caller: topology, oversubscription, nics_per_node, the efficiencies (inter_node);
  // bus_bandwidth (intra_node)
  r.has({"topology", "oversubscription", "nics_per_node", "efficiency", "all_to_all_efficiency",
         "all_to_all_latency_s", "deepep_efficiency", "hybridep_efficiency", "bus_bandwidth"});
  r.finish();
  return link;
}

// A cluster's "device" string names a device file when it looks like a path, else a shipped
// device.
bool names_file(const std::string& device) {
  return device.ends_with(".json") || device.find('/') != std::string::npos;
}

std::string shipped_list() {
  std::string names;
  for (const std::string& n : shipped_device_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

DeviceSpec read_device(const Json& json, const std::string& file, const std::string& path,
                       ClusterKind kind, Diagnostics& diag) {
  if (json.is_object() && json.contains("base")) {
    // A device derived from another (the same die run otherwise: another memory, a power
    // limit): the base's JSON with these keys merged over it (RFC 7386 merge patch). The base
    // is a shipped device's name or a device file relative to this one.
    const Json& base = json["base"];
    const std::string at = path.empty() ? "base" : path + ".base";
    if (!base.is_string()) {
      diag.error(file, at, "expected a device name or file, got " + json_type_name(base));
      return {};
    }
    std::optional<Json> merged;
    if (names_file(base.get<std::string>())) {
      merged = read_referenced_json(base.get<std::string>(), file, at, diag);
    } else if (auto shipped = shipped_device(base.get<std::string>())) {
      merged = std::move(shipped->json);
    } else {
      diag.error(file, at,
                 "no shipped device is named '" + base.get<std::string>() +
                     "' (shipped: " + shipped_list() + "); give a device file (.json)");
      return {};
    }
    if (!merged) return {};
    if (!merged->is_object()) {
      diag.error(file, at,
                 "the base is not a device: expected an object, got " + json_type_name(*merged));
      return {};
    }
    if (merged->contains("base")) {
      diag.error(file, at, "a base device is a device of its own, without a base");
      return {};
    }
    const Json base_name = merged->value("name", Json());
    Json patch = json;
    patch.erase("base");
    // Names and aliases are the derived device's own, never the base's.
    merged->erase("aliases");
    merged->merge_patch(patch);
    DeviceSpec device = read_device(*merged, file, path, kind, diag);
    if (base_name.is_string()) device.base = base_name.get<std::string>();
    return device;
  }
  DeviceSpec device;
  ObjectReader dr(json, file, path, diag);
  if (!dr.valid()) return device;
  dr.required("name", device.name);
  if (const Json* peaks = dr.find("peak_flops")) {
    ObjectReader pr(*peaks, file, dr.path_of("peak_flops"), diag);
    for (const auto& [name, dtype] : kDTypes) {
      double value = 0;
      if (pr.optional(name, value) && pr.check_positive(name, value))
        device.peak_flops[dtype] = value;
    }
    pr.finish();
    if (pr.valid() && device.peak_flops.empty())
      dr.error("peak_flops", "give at least one of bf16, fp16, fp32, fp8");
  } else if (kind == ClusterKind::kGpu) {
    dr.missing("peak_flops");
  }
  if (dr.required("memory_bytes", device.memory_bytes))
    dr.check_positive("memory_bytes", device.memory_bytes);
  if (dr.required("memory_bandwidth_bytes_per_s", device.memory_bandwidth_bytes_per_s))
    dr.check_positive("memory_bandwidth_bytes_per_s", device.memory_bandwidth_bytes_per_s);
  if (const Json* k = dr.find("kernels")) {
    if (kind == ClusterKind::kCpuLocal)
      dr.error("kernels", "only used with kind gpu");
    else
      device.kernels = read_device_kernels(*k, file, dr.path_of("kernels"), diag);
  }
  dr.optional("description", device.description);
  std::vector<std::string> aliases;  // other names of the device, for the shipped catalog
  dr.optional("aliases", aliases);
  dr.finish();
  return device;
}

// What pricing compute without kernel data costs in accuracy, as measured on the published runs
// (docs/FIDELITY.md, "Without kernel data").
constexpr const char* kNoKernelsCost =
    "its compute is priced at a flat share of peak, which predicts Megatron-LM's 2021 Table 1 at "
    "10.5% mean error (max 30.4%) where kernel data gives 4.6% (max 10.9%).";

// Points [[x, y], ...] with x increasing, each accepted by `valid`; `shape` says what a point
// must be ("[bytes > 0, ...]"), `what` names its x ("sizes").
std::vector<std::pair<double, double>> read_points(ObjectReader& r, std::string_view key,
                                                   bool (*valid)(double x, double y),
                                                   const std::string& shape,
                                                   const std::string& what) {
  std::vector<std::pair<double, double>> curve;
  std::vector<std::vector<double>> points;
  if (!r.optional(key, points)) return curve;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    if (points[i].size() != 2 || !valid(points[i][0], points[i][1])) {
      r.error(key, at + ": expected " + shape);
      return {};
    }
    if (i > 0 && !(points[i][0] > points[i - 1][0])) {
      r.error(key, at + ": " + what + " must increase");
      return {};
    }
    curve.emplace_back(points[i][0], points[i][1]);
  }
  if (curve.empty()) r.error(key, "give at least one point");
  return curve;
}

// A bus-bandwidth curve: [[bytes, bytes_per_s], ...] with sizes increasing.
BusBandwidthCurve read_curve(ObjectReader& r, std::string_view key) {
  return read_points(
      r, key, [](double bytes, double rate) { return bytes > 0 && rate > 0; },
      "[bytes > 0, bytes_per_s > 0]", "sizes");
}

// An efficiency by node count: [[nodes >= 1, fraction in (0, 1]], ...] with nodes increasing.
std::vector<std::pair<double, double>> read_efficiency_by_nodes(ObjectReader& r,
                                                                std::string_view key) {
  return read_points(
      r, key, [](double nodes, double e) { return nodes >= 1 && e > 0 && e <= 1; },
      "[nodes >= 1, efficiency in (0, 1]]", "node counts");
}

Json to_json(const BusBandwidthCurve& curve) {
  Json j = Json::array();
  for (const auto& [bytes, bandwidth] : curve) j.push_back(Json::array({bytes, bandwidth}));
  return j;
}

Json to_json(const LinkSpec& link) {
  return Json{{"bandwidth_bytes_per_s", link.bandwidth_bytes_per_s}, {"latency_s", link.latency_s}};
}

}  // namespace

std::optional<DeviceSpec> read_named_device(const std::string& name_or_file, Diagnostics& diag) {
  Diagnostics local;
  DeviceSpec device;
  if (names_file(name_or_file)) {
    if (const auto json = read_json_file(name_or_file, local))
      device = read_device(*json, name_or_file, "", ClusterKind::kGpu, local);
  } else if (const auto shipped = shipped_device(name_or_file)) {
    device = read_device(shipped->json, shipped->file, "", ClusterKind::kGpu, local);
  } else {
    local.error(name_or_file, "",
                "no shipped device is named so (shipped: " + shipped_list() +
                    "); give a device file (.json)");
  }
  diag.append(local);
  if (!local.ok()) return std::nullopt;
  return device;
}

ClusterSpec read_cluster(const Json& json, const std::string& file, const std::string& path,
                         Diagnostics& diag) {
  if (json.is_object() && json.contains("base")) {
    // A cluster derived from another file: that file's JSON with these keys merged over it
    // (RFC 7386 merge patch), e.g. {"base": "a100-selene-8.json", "nodes": 32}.
    const Json& base = json["base"];
    if (!base.is_string()) {
      diag.error(file, join_path(path, "base"),
                 "expected a file name, got " + json_type_name(base));
      return {};
    }
    std::string target;
    std::optional<Json> merged =
        read_referenced_json(base.get<std::string>(), file, join_path(path, "base"), diag, &target);
    if (!merged) return {};
    if (merged->is_object() && merged->contains("base")) {
      diag.error(target, "base", "a base cluster cannot have a base of its own");
      return {};
    }
    // The base's device file stays relative to the base.
    if (merged->is_object() && merged->contains("device") && (*merged)["device"].is_string() &&
        names_file((*merged)["device"].get<std::string>()))
      (*merged)["device"] =
          fs::absolute(referenced_path((*merged)["device"].get<std::string>(), target))
              .lexically_normal()
              .string();
    Json patch = json;
    patch.erase("base");
    merged->merge_patch(patch);
    return read_cluster(*merged, file, path, diag);
  }
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
    if (d->is_string() && names_file(d->get<std::string>())) {
      // A device file, relative to the file that names it.
      std::string target;
      if (const auto device_json =
              read_referenced_json(d->get<std::string>(), file, r.path_of("device"), diag, &target))
        c.device = read_device(*device_json, target, "", c.kind, diag);
    } else if (d->is_string()) {
      if (const auto shipped = shipped_device(d->get<std::string>()))
        c.device = read_device(shipped->json, shipped->file, "", c.kind, diag);
      else
        r.error("device", "no shipped device is named '" + d->get<std::string>() +
                              "' (shipped: " + shipped_list() +
                              "); give a device file (.json) or write the device inline");
    } else {
      // Inline. A name that is a shipped device's gives that device, with the fields written
      // here over its own ("kernels": null drops its kernel data).
      Json device = *d;
      if (d->is_object() && d->contains("name") && (*d)["name"].is_string())
        if (auto shipped = shipped_device((*d)["name"].get<std::string>())) {
          device = std::move(shipped->json);
          device.merge_patch(*d);
        }
      c.device = read_device(device, file, r.path_of("device"), c.kind, diag);
    }
    if (c.kind == ClusterKind::kGpu && !c.device.kernels && !c.device.name.empty())
      diag.warn(file, r.path_of("device"),
                "'" + c.device.name + "' has no kernel data: " + kNoKernelsCost +
                    " Name a shipped device (" + shipped_list() + ") or give \"kernels\".");
  } else {
    r.missing("device");
  }

  c.intra_node = read_link(r, "intra_node", true);
  if (const Json* node = r.find("intra_node"); node != nullptr && node->contains("bus_bandwidth")) {
    // read_link() reported intra_node's unknown keys already.
    ObjectReader nr(*node, file, r.path_of("intra_node"), diag);
    if (c.kind == ClusterKind::kCpuLocal) {
      nr.error("bus_bandwidth", "only used with kind gpu");
    } else if (const Json* bus = nr.find("bus_bandwidth")) {
      ObjectReader br(*bus, file, nr.path_of("bus_bandwidth"), diag);
      c.intra_node_collectives.all_reduce = read_curve(br, "allreduce");
      c.intra_node_collectives.all_gather = read_curve(br, "allgather");
      c.intra_node_collectives.reduce_scatter = read_curve(br, "reducescatter");
      if (br.valid() && c.intra_node_collectives.all_reduce.empty() && !br.has("allreduce"))
        br.missing("allreduce");
      br.finish();
    }
  }
  if (c.kind == ClusterKind::kGpu) {
    const bool multi_node = c.nodes > 1;
    c.inter_node.link = read_link(r, "inter_node", multi_node);
    if (const Json* net = r.find("inter_node")) {
      ObjectReader nr(*net, file, r.path_of("inter_node"), diag);
      nr.optional_enum("topology", c.inter_node.topology, kTopologies);
      if (nr.optional("oversubscription", c.inter_node.oversubscription))
        nr.check_at_least("oversubscription", c.inter_node.oversubscription, 1.0);
      if (nr.optional("nics_per_node", c.inter_node.nics_per_node))
        nr.check_positive("nics_per_node", c.inter_node.nics_per_node);
      if (nr.optional("efficiency", c.inter_node.efficiency) &&
          !(c.inter_node.efficiency > 0 && c.inter_node.efficiency <= 1))
        nr.error("efficiency", "must be in (0, 1], got " + std::to_string(c.inter_node.efficiency));
      if (nr.optional("all_to_all_efficiency", c.inter_node.all_to_all_efficiency) &&
          !(c.inter_node.all_to_all_efficiency > 0 && c.inter_node.all_to_all_efficiency <= 1))
        nr.error("all_to_all_efficiency",
                 "must be in (0, 1], got " + std::to_string(c.inter_node.all_to_all_efficiency));
      if (nr.optional("deepep_efficiency", c.inter_node.deepep_efficiency) &&
          !(c.inter_node.deepep_efficiency > 0 && c.inter_node.deepep_efficiency <= 1))
        nr.error("deepep_efficiency",
                 "must be in (0, 1], got " + std::to_string(c.inter_node.deepep_efficiency));
      c.inter_node.hybridep_efficiency = read_efficiency_by_nodes(nr, "hybridep_efficiency");
      if (nr.optional("all_to_all_latency_s", c.inter_node.all_to_all_latency_s))
        nr.check_at_least("all_to_all_latency_s", c.inter_node.all_to_all_latency_s, 0.0);
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
  // A shipped base is named, so that the device read back is fitted as it (every key is written
  // here, so the base adds none); a base from a file of its own is not named.
  if (!c.device.base.empty() && shipped_device(c.device.base)) device["base"] = c.device.base;
  Json peaks = Json::object();
  for (const auto& [dtype, value] : c.device.peak_flops) peaks[enum_name(dtype, kDTypes)] = value;
  device["peak_flops"] = peaks;
  device["memory_bytes"] = c.device.memory_bytes;
  device["memory_bandwidth_bytes_per_s"] = c.device.memory_bandwidth_bytes_per_s;
  if (!c.device.description.empty()) device["description"] = c.device.description;
  if (c.device.kernels) device["kernels"] = to_json(*c.device.kernels);
  j["device"] = device;
  j["intra_node"] = to_json(c.intra_node);
  if (!c.intra_node_collectives.empty()) {
    Json bus;
    bus["allreduce"] = to_json(c.intra_node_collectives.all_reduce);
    if (!c.intra_node_collectives.all_gather.empty())
      bus["allgather"] = to_json(c.intra_node_collectives.all_gather);
    if (!c.intra_node_collectives.reduce_scatter.empty())
      bus["reducescatter"] = to_json(c.intra_node_collectives.reduce_scatter);
    j["intra_node"]["bus_bandwidth"] = bus;
  }
  if (c.kind == ClusterKind::kGpu && c.inter_node.link.bandwidth_bytes_per_s > 0) {
    Json net = to_json(c.inter_node.link);
    net["topology"] = enum_name(c.inter_node.topology, kTopologies);
    net["oversubscription"] = c.inter_node.oversubscription;
    if (c.inter_node.nics_per_node > 0) net["nics_per_node"] = c.inter_node.nics_per_node;
    if (c.inter_node.efficiency > 0) net["efficiency"] = c.inter_node.efficiency;
    if (c.inter_node.all_to_all_efficiency > 0)
      net["all_to_all_efficiency"] = c.inter_node.all_to_all_efficiency;
    if (c.inter_node.all_to_all_latency_s > 0)
      net["all_to_all_latency_s"] = c.inter_node.all_to_all_latency_s;
    if (c.inter_node.deepep_efficiency > 0)
      net["deepep_efficiency"] = c.inter_node.deepep_efficiency;
    if (!c.inter_node.hybridep_efficiency.empty())
      net["hybridep_efficiency"] = to_json(c.inter_node.hybridep_efficiency);
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

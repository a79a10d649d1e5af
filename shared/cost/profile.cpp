#include "shared/cost/profile.hpp"

#include <cmath>

namespace tessera {

const EnumTable<SizeClass> kSizeClasses = {
    {"small", SizeClass::kSmall}, {"medium", SizeClass::kMedium}, {"large", SizeClass::kLarge}};

namespace {

constexpr int kFormatVersion = 1;

Json stats_json(const FitStats& s) {
  return {{"samples", s.samples},
          {"residual", s.residual},
          {"min", s.min_x},
          {"max", s.max_x},
          {"spread", s.spread}};
}

void read_stats(ObjectReader& parent, FitStats& s) {
  const Json* v = parent.find("fit");
  if (v == nullptr) return parent.missing("fit");
  ObjectReader r(*v, parent.file(), parent.path_of("fit"), parent.diagnostics());
  r.required("samples", s.samples);
  r.required("residual", s.residual);
  r.required("min", s.min_x);
  r.required("max", s.max_x);
  if (r.optional("spread", s.spread))
    for (std::size_t k = 0; k < s.spread.size(); ++k)
      if (!(s.spread[k] >= 0) || (k > 0 && s.spread[k] < s.spread[k - 1])) {
        r.error("spread", "must be non-negative quantiles in increasing order");
        break;
      }
  r.finish();
}

Json link_json(const LinkFit& f, bool collective) {
  Json j;
  if (collective) {
    j["kind"] = enum_name(f.kind, kCollectiveKinds);
    j["group_size"] = f.group_size;
  }
  j["locality"] = f.local ? "intra_node" : "inter_node";
  j["latency_s"] = f.latency_s;
  j["bandwidth_bytes_per_s"] = f.bandwidth_bytes_per_s;
  j["fit"] = stats_json(f.stats);
  return j;
}

bool read_link_fit(const Json& v, const std::string& file, const std::string& path, bool collective,
                   LinkFit& f, Diagnostics& diag) {
  ObjectReader r(v, file, path, diag);
  if (!r.valid()) return false;
  if (collective) {
    r.required_enum("kind", f.kind, kCollectiveKinds);
    if (r.required("group_size", f.group_size))
      r.check_at_least<int64_t>("group_size", f.group_size, 2);
  }
  std::string locality;
  if (r.required("locality", locality)) {
    if (locality != "intra_node" && locality != "inter_node")
      r.error("locality", unknown_value_message(locality, {"intra_node", "inter_node"}));
    f.local = locality == "intra_node";
  }
  if (r.required("latency_s", f.latency_s)) r.check_at_least("latency_s", f.latency_s, 0.0);
  if (r.required("bandwidth_bytes_per_s", f.bandwidth_bytes_per_s))
    r.check_positive("bandwidth_bytes_per_s", f.bandwidth_bytes_per_s);
  read_stats(r, f.stats);
  r.finish();
  return true;
}

}  // namespace

Json to_json(const Profile& p) {
  Json compute = Json::array();
  for (const ComputeFit& f : p.compute)
    compute.push_back({{"role", enum_name(f.role, kModuleRoles)},
                       {"phase", enum_name(f.phase, kPhases)},
                       {"size_class", enum_name(f.size, kSizeClasses)},
                       {"overhead_s", f.overhead_s},
                       {"seconds_per_flop", f.seconds_per_flop},
                       {"seconds_per_token_layer", f.seconds_per_token_layer},
                       {"seconds_per_logit", f.seconds_per_logit},
                       {"seconds_per_nested_call", f.seconds_per_nested_call},
                       {"seconds_per_layer", f.seconds_per_layer},
                       {"host_seconds_per_layer", f.host_seconds_per_layer},
                       {"fit", stats_json(f.stats)}});
  Json collectives = Json::array(), p2p = Json::array();
  for (const LinkFit& f : p.collectives) collectives.push_back(link_json(f, true));
  for (const LinkFit& f : p.p2p) p2p.push_back(link_json(f, false));
  Json j = {{"format", "tessera-profile"},
            {"version", kFormatVersion},
            {"machine",
             {{"cluster_kind", enum_name(p.cluster_kind, kClusterKinds)},
              {"device", p.device},
              {"cores", p.cores},
              {"cpu", p.cpu}}},
            {"runs", p.runs},
            {"warmup_iterations", p.warmup_iterations},
            {"compute", compute},
            {"collectives", collectives},
            {"p2p", p2p}};
  if (p.optimizer)
    j["optimizer"] = {{"overhead_s", p.optimizer->overhead_s},
                      {"bandwidth_bytes_per_s", p.optimizer->bandwidth_bytes_per_s},
                      {"fit", stats_json(p.optimizer->stats)}};
  j["overlap_slowdown"] = {{"factor", p.overlap_slowdown}, {"fit", stats_json(p.overlap_stats)}};
  j["warnings"] = p.warnings;
  return j;
}

std::optional<Profile> load_profile(const std::string& file, Diagnostics& diag) {
  const std::optional<Json> json = read_json_file(file, diag);
  if (!json) return std::nullopt;
  Profile p;
  const std::size_t before = diag.errors().size();
  ObjectReader r(*json, file, "", diag);
  if (!r.valid()) return std::nullopt;
  std::string format;
  if (r.required("format", format) && format != "tessera-profile")
    r.error("format", "expected \"tessera-profile\", got \"" + format + "\"");
  int version = 0;
  if (r.required("version", version) && version != kFormatVersion)
    r.error("version", "this Tessera reads version " + std::to_string(kFormatVersion) + ", got " +
                           std::to_string(version));
  if (const Json* m = r.find("machine")) {
    ObjectReader mr(*m, file, "machine", diag);
    mr.required_enum("cluster_kind", p.cluster_kind, kClusterKinds);
    mr.required("device", p.device);
    mr.optional("cores", p.cores);
    mr.optional("cpu", p.cpu);
    mr.finish();
  } else {
    r.missing("machine");
  }
  r.optional("runs", p.runs);
  r.optional("warmup_iterations", p.warmup_iterations);
  auto array = [&](std::string_view key) -> const Json* {
    const Json* v = r.find(key);
    if (v != nullptr && !v->is_array()) {
      r.error(key, "expected an array, got " + json_type_name(*v));
      return nullptr;
    }
    return v;
  };
  if (const Json* v = array("compute"))
    for (std::size_t i = 0; i < v->size(); ++i) {
      ObjectReader c((*v)[i], file, index_path("compute", i), diag);
      if (!c.valid()) continue;
      ComputeFit f;
      c.required_enum("role", f.role, kModuleRoles);
      c.required_enum("phase", f.phase, kPhases);
      c.required_enum("size_class", f.size, kSizeClasses);
      if (c.required("overhead_s", f.overhead_s)) c.check_at_least("overhead_s", f.overhead_s, 0.0);
      if (c.required("seconds_per_flop", f.seconds_per_flop))
        c.check_at_least("seconds_per_flop", f.seconds_per_flop, 0.0);
      if (c.required("seconds_per_token_layer", f.seconds_per_token_layer))
        c.check_at_least("seconds_per_token_layer", f.seconds_per_token_layer, 0.0);
      if (c.required("seconds_per_logit", f.seconds_per_logit))
        c.check_at_least("seconds_per_logit", f.seconds_per_logit, 0.0);
      if (c.required("seconds_per_nested_call", f.seconds_per_nested_call))
        c.check_at_least("seconds_per_nested_call", f.seconds_per_nested_call, 0.0);
      if (c.optional("seconds_per_layer", f.seconds_per_layer))
        c.check_at_least("seconds_per_layer", f.seconds_per_layer, 0.0);
      if (c.optional("host_seconds_per_layer", f.host_seconds_per_layer))
        c.check_at_least("host_seconds_per_layer", f.host_seconds_per_layer, 0.0);
      read_stats(c, f.stats);
      c.finish();
      p.compute.push_back(f);
    }
  for (const auto& [key, collective, out] :
       {std::tuple{"collectives", true, &p.collectives}, std::tuple{"p2p", false, &p.p2p}})
    if (const Json* v = array(key))
      for (std::size_t i = 0; i < v->size(); ++i) {
        LinkFit f;
        if (read_link_fit((*v)[i], file, index_path(key, i), collective, f, diag))
          out->push_back(f);
      }
  if (const Json* v = r.find("optimizer")) {
    ObjectReader o(*v, file, "optimizer", diag);
    if (o.valid()) {
      OptimizerFit f;
      if (o.required("overhead_s", f.overhead_s)) o.check_at_least("overhead_s", f.overhead_s, 0.0);
      if (o.required("bandwidth_bytes_per_s", f.bandwidth_bytes_per_s))
        o.check_positive("bandwidth_bytes_per_s", f.bandwidth_bytes_per_s);
      read_stats(o, f.stats);
      o.finish();
      p.optimizer = f;
    }
  }
  if (const Json* v = r.find("overlap_slowdown")) {
    ObjectReader o(*v, file, "overlap_slowdown", diag);
    if (o.valid()) {
      if (o.required("factor", p.overlap_slowdown))
        o.check_at_least("factor", p.overlap_slowdown, 1.0);
      read_stats(o, p.overlap_stats);
      o.finish();
    }
  }
  r.optional("warnings", p.warnings);
  r.finish();
  if (diag.errors().size() != before) return std::nullopt;
  return p;
}

CostParams profile_cost_params(const Profile& p, const ClusterSpec& cluster,
                               const std::string& file, Diagnostics& diag) {
  CostParams params = default_cost_params(cluster);
  if (p.cluster_kind != cluster.kind || p.device != cluster.device.name) {
    diag.error(file, "machine",
               "the profile was measured on a " + enum_name(p.cluster_kind, kClusterKinds) +
                   " cluster of \"" + p.device + "\"; the scenario's cluster \"" + cluster.name +
                   "\" is " + enum_name(cluster.kind, kClusterKinds) + " of \"" +
                   cluster.device.name + "\"");
    return params;
  }
  params.compute_fits = p.compute;
  params.collective_fits = p.collectives;
  params.p2p_fits = p.p2p;
  params.optimizer_fit = p.optimizer;
  // A profile without overlapped samples keeps the analytic default.
  if (p.overlap_stats.samples > 0) params.overlap_slowdown = p.overlap_slowdown;
  return params;
}

}  // namespace tessera

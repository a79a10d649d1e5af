#include "shared/records/profile_report.hpp"

#include <cstdio>
#include <map>

#include "shared/records/op_measure.hpp"

namespace tessera {

std::vector<std::string> profile_coverage(const CostParams& params, const Program& p,
                                          const ModelSpec& model, const ClusterSpec& cluster) {
  if (params.compute_fits.empty() && params.collective_fits.empty() && params.p2p_fits.empty())
    return {};
  // The cost model's own lookups: what it would price each op with.
  const CostModel cost(cluster, model.dtype, params, model);
  std::map<std::string, int64_t> uncovered, beyond;
  auto outside = [](const FitStats& s, double x) { return x > 2 * s.max_x || x < 0.5 * s.min_x; };
  auto check_link = [&](const LinkFit* fit, const OpClass& k, double bytes) {
    if (fit == nullptr)
      ++uncovered[class_name(k)];
    else if ((k.type == OpClass::Type::kCollective && fit->group_size != k.group_size) ||
             outside(fit->stats, bytes))
      ++beyond[class_name(k)];
  };
  auto check_collective = [&](CollectiveKind kind, int32_t group, double bytes) {
    const OpClass k = collective_class(cost, kind, p.groups[static_cast<std::size_t>(group)]);
    check_link(cost.collective_fit(kind, k.group_size, k.local), k, bytes);
  };
  for (std::size_t r = 0; r < p.ranks.size(); ++r)
    for (const Op& op : p.ranks[r]) {
      if (op.kind == OpKind::kCompute) {
        const ModuleSpec& m = model.modules[static_cast<std::size_t>(op.module)];
        OpClass c;
        c.role = m.role;
        c.phase = op.phase;
        c.size = size_class(m);
        const ComputeFit* fit = cost.compute_fit(op);
        if (fit == nullptr)
          ++uncovered[class_name(c)];
        else if (fit->size != c.size || (fit->phase == op.phase && outside(fit->stats, op.flops)))
          ++beyond[class_name(c)];
        for (const NestedCollective& n : op.nested) check_collective(n.kind, n.group, n.bytes);
      } else if (op.kind == OpKind::kCollective) {
        check_collective(op.collective, op.group, op.message_bytes);
      } else if (op.kind == OpKind::kSend) {
        OpClass k;
        k.type = OpClass::Type::kP2p;
        k.local = cost.same_node({static_cast<int64_t>(r), op.peer});
        check_link(cost.p2p_fit(k.local), k, op.message_bytes);
      }
    }
  std::vector<std::string> notes;
  for (const auto& [name, count] : uncovered)
    notes.push_back("profile: " + std::to_string(count) + " ops of class \"" + name +
                    "\" have no fit and use the analytic defaults");
  for (const auto& [name, count] : beyond)
    notes.push_back("profile: " + std::to_string(count) + " ops of class \"" + name +
                    "\" lie outside the measured sizes or group sizes (extrapolated)");
  return notes;
}

std::string format_profile(const Profile& p) {
  std::string out;
  char line[320];
  std::snprintf(line, sizeof line,
                "machine: %s, %s, %lld cores (%s); %zu runs, warm-up %lld iterations left out\n",
                enum_name(p.cluster_kind, kClusterKinds).c_str(), p.device.c_str(),
                static_cast<long long>(p.cores), p.cpu.c_str(), p.runs.size(),
                static_cast<long long>(p.warmup_iterations));
  out += line;
  auto stats = [](const FitStats& s) {
    char text[128];
    std::snprintf(text, sizeof text, "%7lld  %6.1f%%  %9.3g .. %-9.3g",
                  static_cast<long long>(s.samples), 100 * s.residual, s.min_x, s.max_x);
    return std::string(text);
  };
  out +=
      "\ncompute class        fixed (us)  rate (GFLOP/s)  token-layer (ns)  logit (ns)  "
      "call (us)  layer (us)  host/layer (us)  samples  residual  FLOPs measured\n";
  for (const ComputeFit& f : p.compute) {
    std::snprintf(
        line, sizeof line, "%-20s %10.1f  %14.3f  %16.1f  %10.2f  %9.1f  %10.1f  %15.1f  %s\n",
        (enum_name(f.role, kModuleRoles) + " " + phase_name(f.phase) + " " +
         size_class_name(f.size))
            .c_str(),
        f.overhead_s * 1e6, f.seconds_per_flop > 0 ? 1e-9 / f.seconds_per_flop : 0.0,
        f.seconds_per_token_layer * 1e9, f.seconds_per_logit * 1e9, f.seconds_per_nested_call * 1e6,
        f.seconds_per_layer * 1e6, f.host_seconds_per_layer * 1e6, stats(f.stats).c_str());
    out += line;
  }
  out +=
      "\ncommunication class        latency (us)  bandwidth (GB/s)  samples  residual  bytes "
      "measured\n";
  for (const auto* list : {&p.collectives, &p.p2p})
    for (const LinkFit& f : *list) {
      const std::string name = list == &p.p2p
                                   ? std::string("p2p ") + (f.local ? "intra_node" : "inter_node")
                                   : collective_name(f.kind) + " x" + std::to_string(f.group_size) +
                                         " " + (f.local ? "intra_node" : "inter_node");
      // A fit with no size term (every message the same size) has unbounded bandwidth.
      std::snprintf(line, sizeof line, "%-26s %12.1f  %16s  %s\n", name.c_str(), f.latency_s * 1e6,
                    f.bandwidth_bytes_per_s >= 1e17
                        ? "-"
                        : std::to_string(f.bandwidth_bytes_per_s * 1e-9).c_str(),
                    stats(f.stats).c_str());
      out += line;
    }
  if (p.optimizer) {
    std::snprintf(line, sizeof line, "%-26s %12.1f  %16.3f  %s\n", "optimizer (fixed, bytes/s)",
                  p.optimizer->overhead_s * 1e6, p.optimizer->bandwidth_bytes_per_s * 1e-9,
                  stats(p.optimizer->stats).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line,
                "\ncompute overlapping a collective: %.3fx slower (%lld samples, spread %.1f%%)\n",
                p.overlap_slowdown, static_cast<long long>(p.overlap_stats.samples),
                100 * p.overlap_stats.residual);
  out += line;
  for (const std::string& w : p.warnings) out += "warning: " + w + "\n";
  return out;
}

}  // namespace tessera

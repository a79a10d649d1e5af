#include "shared/search/scenario_report.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "shared/layout/rank_groups.hpp"
#include "shared/model/batch.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

namespace {

std::string format(const char* fmt, double a) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, fmt, a);
  return buffer;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string arch_summary(const ModuleSpec& m) {
  std::ostringstream out;
  if (m.transformer) {
    const TransformerArch& a = *m.transformer;
    out << a.layers << "L h" << a.hidden << " a" << a.heads;
    if (a.kv_heads != a.heads) out << "/kv" << a.kv_heads;
    out << " ffn" << a.ffn << (a.gated_ffn ? "g" : "");
    if (a.experts > 0) {
      out << " moe" << a.experts << "x" << a.top_k;
      // Group-limited routing: "from 4 of 8 groups".
      if (a.router_groups > 0)
        out << " from " << a.router_group_top_k << " of " << a.router_groups << " groups";
      // Which layers have them: "in 11 of 12" where some are dense.
      if (const int64_t moe = moe_layers(a, 0, a.layers); moe < a.layers)
        out << " in " << moe << " of " << a.layers;
    }
    if (a.cross_attention_layers > 0) out << " xattn" << a.cross_attention_layers;
    if (a.mtp_layers > 0) out << " +" << a.mtp_layers << " MTP";
  }
  if (m.projector) {
    const ProjectorArch& p = *m.projector;
    if (p.queries > 0) out << "resampler " << p.queries << "q a" << p.query_heads << ", ";
    out << "mlp " << (p.queries > 0 ? p.out : p.in);
    if (p.merger > 0) out << "=>" << p.merger;
    for (int64_t i = 1; i < p.layers; ++i) out << "->" << p.hidden;
    out << "->" << p.out;
    if (p.deepstack > 0) out << " +" << p.deepstack << " deepstack";
  }
  return out.str();
}

std::string list_groups(const std::vector<Group>& groups, int64_t max) {
  std::ostringstream out;
  const std::size_t size = groups.empty() ? 0 : groups.front().size();
  out << groups.size() << (groups.size() == 1 ? " group" : " groups") << " of " << size
      << (size == 1 ? " rank" : " ranks") << ": ";
  for (std::size_t i = 0; i < groups.size() && static_cast<int64_t>(i) < max; ++i) {
    out << (i ? " " : "") << "[";
    const Group& g = groups[i];
    if (g.size() <= 8) {
      for (std::size_t k = 0; k < g.size(); ++k) out << (k ? "," : "") << g[k];
    } else {
      out << g[0] << "," << g[1] << ",...," << g.back();
    }
    out << "]";
  }
  if (static_cast<int64_t>(groups.size()) > max) out << " ...";
  return out.str();
}

}  // namespace

namespace {

// n scaled to K/M/<giga>/T/P with three significant digits.
std::string with_prefix(double n, const char* giga) {
  const struct {
    double scale;
    const char* name;
  } prefixes[] = {{1e15, "P"}, {1e12, "T"}, {1e9, giga}, {1e6, "M"}, {1e3, "K"}};
  for (const auto& p : prefixes)
    if (std::fabs(n) >= p.scale) return format("%.3g ", n / p.scale) + p.name;
  return format("%.3g ", n);
}

}  // namespace

std::string human_count(double n) {
  return with_prefix(n, "B");
}
std::string human_si(double n) {
  return with_prefix(n, "G");
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return format("%.3g ", bytes) + units[u];
}

std::string memory_parts(const RankMemory& m) {
  return human_bytes(m.total()) + " (weights " + human_bytes(m.weight_bytes) + ", gradients " +
         human_bytes(m.gradient_bytes) + ", optimizer " + human_bytes(m.optimizer_bytes) +
         ", activations " + human_bytes(m.activation_bytes) + ", boundary " +
         human_bytes(m.boundary_bytes) + ")";
}

std::string model_report(const ModelSpec& model) {
  std::ostringstream out;
  out << "model " << model.name << " (" << enum_name(model.dtype, kDTypes)
      << "): " << human_count(static_cast<double>(model_parameters(model))) << " parameters, "
      << human_count(static_cast<double>(trainable_parameters(model))) << " trainable\n";
  out << "  " << pad("module", 18) << pad("role", 10) << pad("modality", 9) << pad("state", 9)
      << pad("params", 10) << pad("fwd FLOP/token @1k", 20) << "architecture\n";
  for (const ModuleSpec* m : topological_order(model)) {
    out << "  " << pad(m->name, 18) << pad(enum_name(m->role, kModuleRoles), 10)
        << pad(enum_name(m->modality, kModalities), 9) << pad(m->frozen ? "frozen" : "trains", 9)
        << pad(human_count(static_cast<double>(module_parameters(*m))), 10)
        << pad(human_si(forward_flops_per_token(*m, 1024)), 20) << arch_summary(*m);
    if (!m->inputs.empty()) {
      out << "  <- ";
      for (std::size_t i = 0; i < m->inputs.size(); ++i) out << (i ? ", " : "") << m->inputs[i];
    }
    out << "\n";
  }
  if (model.reference)
    out << "  published size " << human_count(model.reference->params) << " ("
        << model.reference->source << ")\n";
  return out.str();
}

std::string scenario_report(const Scenario& s, const ReportOptions& options) {
  std::ostringstream out;
  out << "scenario " << s.name << "\n";
  if (!s.description.empty()) out << "  " << s.description << "\n";
  out << "\n" << model_report(s.model);

  // Tokens over a few drawn batches.
  const WorkloadSpec& w = s.workload;
  out << "\nworkload: global batch " << w.global_batch << ", max sequence " << w.max_seq_len
      << (w.packing ? ", packed" : "") << ", seed " << w.seed;
  if (!w.manifest.empty())
    out << ", manifest " << w.manifest << " (" << w.manifest_samples.size() << " samples)";
  out << "\n";
  if (w.mixture()) {
    // A mixture: each source's share of the samples, and its group when batches are grouped.
    double total = 0;
    for (const SampleSource& source : w.sources) total += source.weight;
    out << "  mixture of " << w.sources.size() << " sources"
        << (w.group_batches ? ", each batch drawn from one group" : "") << ":";
    for (const SampleSource& source : w.sources) {
      char share[32];
      std::snprintf(share, sizeof share, " %.1f%%", 100 * source.weight / total);
      out << " " << source.name << share;
      if (w.group_batches) out << " (" << source.group << ")";
      out << (&source == &w.sources.back() ? "" : ",");
    }
    out << "\n";
  }
  std::vector<double> text, image, audio, video, sequence, encoder;
  int64_t truncated = 0;
  for (int64_t it = 0; it < options.batches; ++it) {
    for (const Sample& sample : draw_batch(w, it).samples) {
      const SampleTokens t = sample_tokens(s.model, sample);
      text.push_back(static_cast<double>(t.text));
      image.push_back(static_cast<double>(t.image_llm));
      audio.push_back(static_cast<double>(t.audio_llm));
      video.push_back(static_cast<double>(t.video_llm));
      sequence.push_back(static_cast<double>(t.llm_sequence));
      encoder.push_back(static_cast<double>(t.image_encoder + t.audio_encoder + t.video_encoder));
      if (t.llm_sequence > w.max_seq_len) ++truncated;
    }
  }
  out << "  tokens per sample over " << options.batches << " batches (" << text.size()
      << " samples):\n";
  out << "    " << pad("", 22) << pad("mean", 10) << pad("p50", 10) << pad("p90", 10)
      << pad("min", 10) << "max\n";
  auto row = [&](const std::string& name, std::vector<double> values) {
    const Stats st = summarize(std::move(values));
    if (st.max == 0 && name != "text") return;
    out << "    " << pad(name, 22) << pad(format("%.0f", st.mean), 10)
        << pad(format("%.0f", st.p50), 10) << pad(format("%.0f", st.p90), 10)
        << pad(format("%.0f", st.min), 10) << format("%.0f", st.max) << "\n";
  };
  row("text", text);
  row("image (to LLM)", image);
  row("audio (to LLM)", audio);
  row("video (to LLM)", video);
  row("encoder sequence", encoder);
  row("LLM sequence", sequence);
  out << "    over max sequence: " << truncated << " of " << sequence.size() << " samples\n";

  const ClusterSpec& c = s.cluster;
  out << "\ncluster " << c.name << ": ";
  if (c.kind == ClusterKind::kCpuLocal) {
    out << "this machine, " << c.cores << " cores x " << human_si(c.flops_per_core) << "FLOP/s\n";
  } else {
    out << c.nodes << " nodes x " << c.devices_per_node << " " << c.device.name << " = "
        << device_count(c) << " devices\n";
    out << "  device: " << human_si(peak_flops(c, s.model.dtype)) << "FLOP/s "
        << enum_name(s.model.dtype, kDTypes) << ", "
        << human_bytes(static_cast<double>(c.device.memory_bytes)) << ", "
        << human_si(c.device.memory_bandwidth_bytes_per_s) << "B/s HBM\n";
    out << "  intra-node " << human_si(c.intra_node.bandwidth_bytes_per_s) << "B/s, "
        << format("%.3g", c.intra_node.latency_s * 1e6) << " us";
    if (c.nodes > 1)
      out << "; inter-node " << human_si(c.inter_node.link.bandwidth_bytes_per_s)
          << "B/s per device, " << format("%.3g", c.inter_node.link.latency_s * 1e6)
          << " us, oversubscription " << c.inter_node.oversubscription;
    out << "\n";
  }

  if (s.plan) {
    const ParallelPlan& p = *s.plan;
    out << "\nplan: " << enum_name(p.placement, kPlacements) << ", " << world_size(p, s.model)
        << " ranks, schedule " << enum_name(p.schedule, kSchedules) << ", "
        << micro_batches(p, s.model, w) << " micro-batches of " << p.micro_batch_size
        << (p.micro_batch_size == 1 ? " sample" : " samples") << " per replica\n";
    for (const ModuleGroups& g : rank_groups(p, s.model)) {
      out << "  " << g.module << ": ranks [" << g.first_rank << ", " << g.first_rank + g.size
          << ")\n";
      out << "    tp: " << list_groups(g.tp, options.max_groups) << "\n";
      if (g.cp.front().size() > 1)
        out << "    cp: " << list_groups(g.cp, options.max_groups) << "\n";
      out << "    dp: " << list_groups(g.dp, options.max_groups) << "\n";
      out << "    pp: " << list_groups(g.pp, options.max_groups) << "\n";
      if (g.ep.front().size() > 1)
        out << "    ep: " << list_groups(g.ep, options.max_groups) << "\n";
    }
  } else {
    out << "\nplan: none given\n";
  }
  return out.str();
}

}  // namespace tessera

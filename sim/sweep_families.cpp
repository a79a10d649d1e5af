#include "sim/sweep_families.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace tessera::sim {

std::vector<std::vector<const SweepRow*>> family_bests(const std::vector<SweepRow>& rows) {
  std::vector<std::vector<const SweepRow*>> out;
  std::map<std::pair<std::string, int64_t>, std::size_t> group_of;
  for (const SweepRow& row : rows) {
    if (!row.ok) continue;
    const auto key = std::make_pair(row.point.dump(), row.gpus);
    const auto [at, added] = group_of.try_emplace(key, out.size());
    if (added) out.emplace_back();
    auto& group = out[at->second];
    const auto same = std::find_if(group.begin(), group.end(), [&](const SweepRow* r) {
      return r->plan.placement == row.plan.placement;
    });
    if (same == group.end()) {
      group.push_back(&row);
    } else if (row.step_s < (*same)->step_s) {
      *same = &row;
    }
  }
  for (auto& group : out)
    std::stable_sort(group.begin(), group.end(),
                     [](const SweepRow* a, const SweepRow* b) { return a->step_s < b->step_s; });
  return out;
}

std::string point_text(const Json& point) {
  std::string out;
  for (const auto& item : point.items())
    out += (out.empty() ? "" : ", ") + item.key() + "=" + item.value().dump();
  return out;
}

StepParts step_parts(const SweepRow& row) {
  StepParts p;
  p.compute_s = row.compute_s;
  p.exposed_s = row.exposed_comm_s;
  p.idle_s = std::max(0.0, row.step_s - row.compute_s - row.exposed_comm_s);
  return p;
}

std::string why_faster(const SweepRow& winner, const SweepRow& other) {
  const std::string a = enum_name(winner.plan.placement, kPlacements);
  const std::string b = enum_name(other.plan.placement, kPlacements);
  char line[512];
  const double gain = other.step_s / winner.step_s - 1;
  const StepParts w = step_parts(winner), o = step_parts(other);
  const double compute = o.compute_s - w.compute_s, exposed = o.exposed_s - w.exposed_s,
               idle = o.idle_s - w.idle_s;
  std::string because;
  char part[256];
  if (compute >= exposed && compute >= idle) {
    std::snprintf(part, sizeof part,
                  "the %s plan's ranks compute %.3g s longer per step (%.3g s vs %.3g s: more "
                  "work per rank, or slower kernels on smaller shards)",
                  b.c_str(), compute, o.compute_s, w.compute_s);
  } else if (exposed >= idle) {
    const double boundary = other.exposed_boundary_s - winner.exposed_boundary_s;
    std::snprintf(part, sizeof part,
                  "the %s plan leaves %.3g s more communication exposed per step (%.3g s vs %.3g "
                  "s%s)",
                  b.c_str(), exposed, o.exposed_s, w.exposed_s,
                  boundary > exposed / 2 ? ", most of it at the module boundary" : "");
  } else {
    std::snprintf(part, sizeof part,
                  "the %s plan's ranks sit idle %.3g s longer per step (%.3g s vs %.3g s: "
                  "pipeline bubble, load imbalance and waits)",
                  b.c_str(), idle, o.idle_s, w.idle_s);
  }
  because = part;
  std::snprintf(line, sizeof line, "%s beats %s by %.1f%% (%.4g s vs %.4g s per step): %s",
                a.c_str(), b.c_str(), 100 * gain, winner.step_s, other.step_s, because.c_str());
  return line;
}

std::vector<std::string> technique_lines(const SweepResult& result, const ModelSpec& model) {
  // Per (point, GPU count, family): the base with the least first-stage step, its gains.
  std::map<std::tuple<std::string, int64_t, Placement>, std::vector<const TechniqueGain*>> groups;
  for (const TechniqueGain& g : result.technique_gains)
    groups[{g.point.dump(), g.gpus, g.base.placement}].push_back(&g);
  std::vector<std::string> out;
  for (auto& [key, gains] : groups) {
    double best = gains.front()->base_s;
    for (const TechniqueGain* g : gains) best = std::min(best, g->base_s);
    // The gains of one base: the first one found with the least step.
    const ParallelPlan* base = &(*std::find_if(gains.begin(), gains.end(), [&](const auto* g) {
                                  return g->base_s == best;
                                }))->base;
    std::vector<const TechniqueGain*> mine;
    for (const TechniqueGain* g : gains)
      if (g->base == *base) mine.push_back(g);
    std::stable_sort(mine.begin(), mine.end(), [](const TechniqueGain* x, const TechniqueGain* y) {
      return x->base_s / x->variant_s > y->base_s / y->variant_s;
    });
    std::string line = "  " + std::to_string(std::get<1>(key)) + " GPUs " +
                       enum_name(std::get<2>(key), kPlacements) + " " +
                       describe_layout(*base, model) + ":";
    for (std::size_t i = 0; i < mine.size(); ++i) {
      char text[96];
      std::snprintf(text, sizeof text, "%s %s %.3fx", i ? "," : "", mine[i]->technique.c_str(),
                    mine[i]->base_s / mine[i]->variant_s);
      line += text;
    }
    out.push_back(line);
  }
  return out;
}

}  // namespace tessera::sim

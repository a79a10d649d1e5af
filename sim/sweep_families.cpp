#include "sim/sweep_families.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
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
  const double idle = std::max(0.0, row.step_s - row.compute_s - row.exposed_comm_s);
  // Rows written before the busiest rank was recorded read 0 there: no imbalance known.
  p.imbalance_s = std::clamp(row.compute_max_s - row.compute_s, 0.0, idle);
  p.bubble_s = idle - p.imbalance_s;
  p.boundary_s = row.exposed_boundary_s;
  p.comm_s = std::max(0.0, row.exposed_comm_s - row.exposed_boundary_s);
  // Differences of sums over thousands of ranks leave rounding residue (1e-15 s) where a part
  // is empty: a part under a nanosecond per second of step is none.
  for (double* part : {&p.compute_s, &p.imbalance_s, &p.bubble_s, &p.comm_s, &p.boundary_s})
    if (*part < 1e-9 * row.step_s) *part = 0;
  return p;
}

std::string why_faster(const SweepRow& winner, const SweepRow& other) {
  const std::string a = enum_name(winner.plan.placement, kPlacements);
  const std::string b = enum_name(other.plan.placement, kPlacements);
  char line[512];
  // A share of the slower step, never above 100%.
  const double saved = 1 - winner.step_s / other.step_s;
  const StepParts w = step_parts(winner), o = step_parts(other);
  // The part of the step that grew most names the reason.
  const double grew[] = {o.compute_s - w.compute_s, o.imbalance_s - w.imbalance_s,
                         o.bubble_s - w.bubble_s, o.comm_s - w.comm_s, o.boundary_s - w.boundary_s};
  const std::size_t most = static_cast<std::size_t>(
      std::max_element(std::begin(grew), std::end(grew)) - std::begin(grew));
  // Each part's reason: how much longer, then the two plans' figures (the loser's first).
  const char* reasons[] = {
      "the %s plan's ranks compute %.3g s longer per step (%.3g s vs %.3g s: more work per rank, "
      "or slower kernels on smaller shards)",
      "the %s plan's ranks wait %.3g s longer per step for their busiest one (%.3g s vs %.3g s: "
      "load imbalance between ranks or modules)",
      "the %s plan's ranks wait %.3g s longer per step in pipeline bubbles and on dependencies "
      "(%.3g s vs %.3g s)",
      "the %s plan leaves %.3g s more communication exposed per step (%.3g s vs %.3g s)",
      "the %s plan leaves %.3g s more module-boundary transfer exposed per step (%.3g s vs %.3g "
      "s)"};
  const double theirs[] = {o.compute_s, o.imbalance_s, o.bubble_s, o.comm_s, o.boundary_s};
  const double ours[] = {w.compute_s, w.imbalance_s, w.bubble_s, w.comm_s, w.boundary_s};
  std::string because;
  char part[256];
  std::snprintf(part, sizeof part, reasons[most], b.c_str(), grew[most], theirs[most], ours[most]);
  because = part;
  std::snprintf(line, sizeof line,
                "%s takes %.1f%% less time per step than %s (%.4g s vs %.4g s): %s", a.c_str(),
                100 * saved, b.c_str(), winner.step_s, other.step_s, because.c_str());
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

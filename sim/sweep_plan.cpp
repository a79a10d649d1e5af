#include "sim/sweep_plan.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <set>

#include "shared/base/check.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/search/scenario_report.hpp"
#include "sim/sweep_families.hpp"

namespace tessera::sim {

namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// The plan with its stage split left out: frozen-aware and uniform twins share it.
std::string split_free_key(const ParallelPlan& plan) {
  ParallelPlan p = plan;
  p.stage_split = StageSplit::kUniform;
  p.layout.stage_layers.clear();
  for (auto& [name, l] : p.modules) l.stage_layers.clear();
  return to_json(p).dump();
}

Placement placement_of(const RankedCandidate& rc) {
  return rc.candidate.plan.placement;
}

// The search's second stage (SearchSpace::refine) on one ranking: its best `refine.top` plans
// and each placement family's best, again with the costlier techniques; the variants that fit
// join the ranking, which is sorted again, and what each technique did is recorded.
template <class Report>
void refine(const Scenario& s, const SearchSpace& space, const Json& point, int64_t gpus,
            const std::string& what, const SweepOptions& options,
            std::vector<RankedCandidate>& ranked, SweepResult& result, const Report& report) {
  const int64_t top = options.refine_top >= 0 ? options.refine_top : space.refine.top;
  if (top <= 0 || ranked.empty()) return;
  std::set<std::string> known;
  for (const RankedCandidate& rc : ranked) known.insert(rc.candidate.key);
  std::vector<const Candidate*> bases;
  std::vector<double> base_s;
  for (std::size_t i : best_k_and_each_family(ranked, top, placement_of)) {
    bases.push_back(&ranked[i].candidate);
    base_s.push_back(ranked[i].estimate.metrics.step_s);
  }
  std::vector<Refinement> variants = refinements(s, space, bases, gpus, known);
  result.refined_bases += static_cast<int64_t>(bases.size());
  std::map<std::string, const Refinement*> by_key;
  std::vector<Candidate> candidates;
  for (const Refinement& v : variants) {
    by_key[v.candidate.key] = &v;
    candidates.push_back(v.candidate);
  }
  report("refined", what, 0, candidates.size(), "");
  std::map<std::string, int64_t> rejected;
  std::vector<RankedCandidate> more = rank_candidates(
      s, std::move(candidates), 0, rejected, options.jobs, options.cost ? &*options.cost : nullptr,
      options.profile_batches,
      [&](std::size_t done, std::size_t total) { report("refined", what, done, total, ""); });
  if (variants.empty()) report("refined", what, 0, 0, "");
  for (const auto& [reason, count] : rejected) result.refined_rejected += count;
  result.refined += static_cast<int64_t>(variants.size());
  for (const RankedCandidate& rc : more) {
    const Refinement& v = *by_key.at(rc.candidate.key);
    result.technique_gains.push_back({point, gpus, bases[v.base]->plan, base_s[v.base], v.technique,
                                      rc.estimate.metrics.step_s});
  }
  for (RankedCandidate& rc : more) ranked.push_back(std::move(rc));
  sort_by_estimate(ranked);
}

}  // namespace

std::vector<Json> grid_points(const std::vector<SetAxis>& axes) {
  std::vector<Json> points{Json::object()};
  for (const SetAxis& axis : axes) {
    std::vector<Json> next;
    for (const Json& point : points)
      for (const Json& value : axis.values) {
        Json p = point;
        p[axis.path] = value;
        next.push_back(p);
      }
    points = std::move(next);
  }
  return points;
}

std::vector<ChosenPlan> plan_sweep(const Scenario& base, const SweepOptions& options,
                                   SweepResult& result, const SweepProgress& progress) {
  const auto report = [&](const char* phase, const std::string& what, std::size_t done,
                          std::size_t total, const std::string& last) {
    if (progress) progress(phase, what, done, total, last, false);
  };
  // Enumerate and rank per grid point and GPU count; the best K of each get simulated.
  std::vector<ChosenPlan> chosen;
  for (const Json& point : grid_points(options.sets)) {
    Diagnostics diag;
    const auto at = scenario_at(base, point, diag);
    TESSERA_CHECK(at.has_value(), "run_sweep needs valid grid points: " + diag.format());
    auto s = std::make_shared<const Scenario>(*at);
    SearchSpace space = s->search.value_or(SearchSpace{});
    if (!options.placements.empty()) space.placements = options.placements;
    if (!options.sequence_parallel.empty()) space.sequence_parallel = options.sequence_parallel;
    std::vector<int64_t> gpus = options.gpus;
    if (gpus.empty()) gpus = space.gpus;
    if (gpus.empty()) gpus = {std::max<int64_t>(1, device_count(s->cluster))};
    const int64_t top_k = options.top_k > 0 ? options.top_k : space.top_k;
    result.top_k = top_k;
    const double encoder_share =
        options.profile_batches > 1
            ? encoder_work_share(s->model, s->workload, options.profile_batches)
            : 0;
    if (options.profile_batches > 1) result.encoder_shares.push_back({point, encoder_share});
    for (int64_t g : gpus) {
      const std::string what =
          (point.empty() ? "" : point.dump() + " ") + "at " + std::to_string(g) + " GPUs";
      // Enumerate the space's plans and rank those that fit; where none fits, `leanest` holds
      // the plan that came closest.
      std::optional<RankedCandidate> leanest;
      const auto search = [&](const SearchSpace& space_here) {
        auto phase = std::chrono::steady_clock::now();
        report("enumerated", what, 0, 1, "");
        Enumeration e = enumerate_plans(*s, space_here, g, options.cost ? &*options.cost : nullptr,
                                        encoder_share);
        if (options.shard_count > 1) {
          const std::string prefix = point.empty() ? "" : point.dump();
          std::erase_if(e.valid, [&](const Candidate& c) {
            return static_cast<int64_t>(fnv1a(prefix + c.key) %
                                        static_cast<uint64_t>(options.shard_count)) !=
                   options.shard_index - 1;
          });
        }
        if (options.shard_index == 1) {
          result.considered += e.considered;
          for (const auto& [reason, count] : e.rejected) result.rejected[reason] += count;
        }
        result.valid += static_cast<int64_t>(e.valid.size());
        result.enumerate_s += seconds_since(phase);
        const auto considered = static_cast<std::size_t>(e.considered);
        report("enumerated", what, considered, considered,
               std::to_string(e.valid.size()) +
                   (options.shard_count > 1 ? " valid in this shard" : " valid"));
        phase = std::chrono::steady_clock::now();
        std::map<std::string, int64_t> rejected_here;
        const std::size_t estimating = e.valid.size();
        report("estimated", what, 0, estimating, "");
        std::vector<RankedCandidate> out = rank_candidates(
            *s, std::move(e.valid), 0, rejected_here, options.jobs,
            options.cost ? &*options.cost : nullptr, options.profile_batches,
            [&](std::size_t done, std::size_t total) {
              report("estimated", what, done, total, "");
            },
            &leanest);
        if (estimating == 0) report("estimated", what, 0, 0, "");
        result.estimate_s += seconds_since(phase);
        for (const auto& [reason, count] : rejected_here) result.rejected[reason] += count;
        result.ranked += static_cast<int64_t>(out.size());
        return out;
      };
      std::vector<RankedCandidate> ranked = search(space);
      // Nothing fits with every media item whole on its encoder ranks: offer the encoders
      // context parallelism (an item's tokens split over cp ranks) before giving up. A shard
      // sees part of the space, so only a whole sweep decides that nothing fits.
      const bool encoders =
          std::any_of(s->model.modules.begin(), s->model.modules.end(),
                      [](const ModuleSpec& m) { return m.role == ModuleRole::kEncoder; });
      const bool whole = options.shard_count == 1;
      if (whole && ranked.empty() && encoders && space.encoder_cp == std::vector<int64_t>{1}) {
        SearchSpace wider = space;
        wider.encoder_cp = kEncoderCpFallback;
        std::erase(wider.placements, Placement::kHomogeneous);  // its encoders follow the LLM
        if (!wider.placements.empty()) {
          ranked = search(wider);
          std::string values;
          for (int64_t cp : kEncoderCpFallback)
            values += (values.empty() ? "" : ", ") + std::to_string(cp);
          result.notes.push_back(what +
                                 ": no plan fit with each media item on one encoder rank; "
                                 "encoder context parallelism (search.encoder_cp " +
                                 values + ") offered: " + std::to_string(ranked.size()) +
                                 " plans fit with it");
        }
      }
      if (whole && ranked.empty() && leanest) {
        const Estimate& e = leanest->estimate;
        result.notes.push_back(what + ": no plan fits in memory; the leanest, " +
                               enum_name(leanest->candidate.plan.placement, kPlacements) + " " +
                               describe_layout(leanest->candidate.plan, s->model) + ", needs " +
                               memory_parts(e.peak_memory) + " on a rank of " +
                               human_bytes(e.capacity_bytes));
      }
      // Second stage: the most promising plans with the costlier techniques (not in a shard,
      // which holds part of the first ranking only).
      const auto phase = std::chrono::steady_clock::now();
      if (options.shard_count == 1)
        refine(*s, space, point, g, what, options, ranked, result, report);
      result.refine_s += seconds_since(phase);
      const ModuleSpec* llm = find_llm(s->model);
      for (const RankedCandidate& rc : ranked) {
        const ParallelPlan& p = rc.candidate.plan;
        ModuleLayout l = p.layout;
        for (const auto& [name, layout] : p.modules)
          if (llm != nullptr && name == llm->name) l = layout;
        result.estimated.push_back(
            {point, g, p.placement, l.tp, l.pp, rc.estimate.metrics.tokens_per_s});
      }
      // Stage-split twins: the same plan split frozen-aware and uniformly. The three best
      // frozen-aware plans are compared with their twins by estimate; those among the chosen
      // get their twin simulated beside them.
      std::map<std::string, std::size_t> uniform_twin;  // split-free key -> index in ranked
      for (std::size_t i = 0; i < ranked.size(); ++i)
        if (ranked[i].candidate.plan.stage_split == StageSplit::kUniform)
          uniform_twin.emplace(split_free_key(ranked[i].candidate.plan), i);
      // The best K, and the best plan of each placement family even when it ranks lower.
      const std::vector<std::size_t> best = best_k_and_each_family(ranked, top_k, placement_of);
      std::set<std::size_t> picked(best.begin(), best.end());
      std::size_t compared = 0;
      for (std::size_t i = 0; i < ranked.size() && compared < 3; ++i) {
        const ParallelPlan& p = ranked[i].candidate.plan;
        if (p.stage_split != StageSplit::kFrozenAware) continue;
        const auto twin = uniform_twin.find(split_free_key(p));
        if (twin == uniform_twin.end()) continue;
        result.split_gains.push_back({g, p, ranked[i].estimate.metrics.step_s,
                                      ranked[twin->second].estimate.metrics.step_s});
        ++compared;
        if (picked.count(i) > 0) picked.insert(twin->second);
      }
      for (std::size_t i : picked) {
        if (!point.empty())
          ranked[i].candidate.key =
              Json{{"point", point}, {"candidate", Json::parse(ranked[i].candidate.key)}}.dump();
        chosen.push_back({std::move(ranked[i]), point, s});
      }
    }
  }
  return chosen;
}

}  // namespace tessera::sim

#include "shared/search/step_picture.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "shared/search/estimate.hpp"

namespace tessera {

namespace {

using Hosted = std::set<std::pair<int, int>>;  // (module, stage) pairs a rank computes

Hosted hosted(const std::vector<Op>& ops) {
  Hosted h;
  for (const Op& op : ops)
    if (op.kind == OpKind::kCompute && op.module >= 0) h.insert({op.module, op.stage});
  return h;
}

// "vision + llm s0": the modules a rank computes, with the stage where a module has several.
std::string describe(const Program& p, const Hosted& h) {
  std::string text;
  for (const auto& [module, stage] : h) {
    bool staged = false;
    for (const ChunkLayers& c : p.chunk_layers)
      staged = staged || (c.module == module && c.stage > 0);
    text += (text.empty() ? "" : " + ") + p.modules[static_cast<std::size_t>(module)] +
            (staged ? " s" + std::to_string(stage) : "");
  }
  return text.empty() ? "no compute" : text;
}

// The ops of `rank`'s representative as bars, runs of one kind merged where they follow each
// other within a thousandth of the step.
std::vector<StepBar> bars_of(const Program& p, const Timeline& t, int64_t rank) {
  const auto by = static_cast<std::size_t>(representative(p, rank));
  const std::vector<Op>& ops = p.ranks[by];
  std::vector<StepBar> bars;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const OpTime& time = t.ops[by][i];
    if (time.finish_s <= time.start_s) continue;
    const Op& op = ops[i];
    StepBar bar;
    bar.start_s = time.start_s;
    bar.finish_s = time.finish_s;
    bar.module = op.module;
    bar.phase = op.phase;
    bar.compute = op.kind == OpKind::kCompute || op.kind == OpKind::kOptimizerStep;
    bar.name = op_name(p, op);
    bars.push_back(std::move(bar));
  }
  std::sort(bars.begin(), bars.end(), [](const StepBar& a, const StepBar& b) {
    return a.compute != b.compute ? a.compute : a.start_s < b.start_s;
  });
  std::vector<StepBar> merged;
  const double close = 1e-3 * t.step_s;
  for (StepBar& bar : bars) {
    if (!merged.empty()) {
      StepBar& last = merged.back();
      if (last.compute == bar.compute && last.module == bar.module && last.phase == bar.phase &&
          bar.start_s <= last.finish_s + close) {
        last.finish_s = std::max(last.finish_s, bar.finish_s);
        ++last.ops;
        continue;
      }
    }
    merged.push_back(std::move(bar));
  }
  std::stable_sort(merged.begin(), merged.end(),
                   [](const StepBar& a, const StepBar& b) { return a.start_s < b.start_s; });
  return merged;
}

}  // namespace

StepPicture step_picture(const Program& p, const Timeline& t, std::size_t max_lanes) {
  StepPicture picture;
  picture.step_s = t.step_s;
  picture.modules = p.modules;
  // What each rank computes, read once from its representative's ops.
  std::vector<Hosted> of_representative(p.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) of_representative[r] = hosted(p.ranks[r]);
  const auto hosted_by = [&](int64_t rank) -> const Hosted& {
    return of_representative[static_cast<std::size_t>(representative(p, rank))];
  };
  std::map<Hosted, int64_t> first;  // each distinct set's first rank
  for (int64_t r = 0; r < p.world && first.size() < max_lanes; ++r) {
    const Hosted& h = hosted_by(r);
    if (first.emplace(h, r).second)
      picture.lanes.push_back({r, "rank " + std::to_string(r) + ": " + describe(p, h), {}});
  }
  // The rank that computes longest, which the others wait for (load imbalance), unless its
  // ops are already shown.
  if (!t.compute_busy_s.empty() && picture.lanes.size() < max_lanes) {
    const auto busiest =
        static_cast<int64_t>(std::max_element(t.compute_busy_s.begin(), t.compute_busy_s.end()) -
                             t.compute_busy_s.begin());
    const bool shown = std::any_of(
        picture.lanes.begin(), picture.lanes.end(),
        [&](const StepLane& l) { return representative(p, l.rank) == representative(p, busiest); });
    if (!shown)
      picture.lanes.push_back({busiest,
                               "rank " + std::to_string(busiest) + ": " +
                                   describe(p, hosted_by(busiest)) + " (computes longest)",
                               {}});
  }
  // A replica of the first lane's rank that runs its own ops: its data differ.
  if (!picture.lanes.empty() && picture.lanes.size() < max_lanes) {
    const int64_t lead = picture.lanes.front().rank;
    const Hosted& h = hosted_by(lead);
    for (int64_t r = lead + 1; r < p.world; ++r)
      if (representative(p, r) == r && representative(p, lead) != r && hosted_by(r) == h &&
          std::none_of(picture.lanes.begin(), picture.lanes.end(),
                       [&](const StepLane& l) { return representative(p, l.rank) == r; })) {
        picture.lanes.push_back(
            {r, "rank " + std::to_string(r) + ": " + describe(p, h) + " (another replica)", {}});
        break;
      }
  }
  for (StepLane& lane : picture.lanes) lane.bars = bars_of(p, t, lane.rank);
  return picture;
}

StepPicture step_picture_like(const StepPicture& lanes_of, const Program& p, const Timeline& t) {
  StepPicture picture;
  picture.step_s = t.step_s;
  picture.modules = p.modules;
  for (const StepLane& lane : lanes_of.lanes)
    if (lane.rank < p.world)
      picture.lanes.push_back({lane.rank, lane.label, bars_of(p, t, lane.rank)});
  return picture;
}

StepPicture step_picture(const Scenario& s, const ParallelPlan& plan, const CostParams& params,
                         std::size_t max_lanes) {
  const EvaluatedStep step = evaluate_step(s, plan, 0, params);
  if (!step.lowered.error.empty() || !step.timeline.error.empty()) {
    StepPicture picture;
    picture.error = step.lowered.error.empty() ? step.timeline.error : step.lowered.error;
    return picture;
  }
  return step_picture(step.lowered.program, step.timeline, max_lanes);
}

}  // namespace tessera

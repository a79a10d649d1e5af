#include "shared/search/dip_search.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "shared/cost/evaluator.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/estimate.hpp"

namespace tessera {

std::string batch_fingerprint(const Batch& batch) {
  // FNV-1a over the numbers that decide a batch's work.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](double x) {
    const auto bits = static_cast<uint64_t>(static_cast<int64_t>(x * 1000));
    for (int i = 0; i < 8; ++i) {
      h ^= (bits >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const Sample& s : batch.samples) {
    mix(static_cast<double>(s.text_tokens));
    mix(static_cast<double>(s.images.size()));
    for (const ImageItem& im : s.images) {
      mix(static_cast<double>(im.width));
      mix(static_cast<double>(im.height));
    }
    mix(static_cast<double>(s.audio_seconds.size()));
    for (double a : s.audio_seconds) mix(a);
    mix(static_cast<double>(s.videos.size()));
    for (const VideoItem& v : s.videos) {
      mix(static_cast<double>(v.frames));
      mix(static_cast<double>(v.width));
      mix(static_cast<double>(v.height));
    }
  }
  char out[32];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::string describe_dip_search(const DipSearchResult& r, const ModelSpec& model) {
  char line[200];
  std::snprintf(line, sizeof line,
                "dip schedule search: %lld scored (%lld cached) in %.3g s; step %.4g s%s "
                "(start %.4g s%s): ",
                static_cast<long long>(r.scored), static_cast<long long>(r.cached), r.seconds,
                r.step_s, r.fits ? "" : " over the memory cap", r.start_step_s,
                r.start_fits ? "" : " over the memory cap");
  return line + describe_dip_schedule(r.schedule, model);
}

DipPlanner::DipPlanner(const Scenario& scenario, const ParallelPlan& plan, const CostModel& cost)
    : scenario_(scenario), plan_(plan), cost_(cost) {}

DipPlanner::Score DipPlanner::score(const Batch& batch, const std::string& fingerprint,
                                    const DipSchedule& candidate, DipSearchResult& result,
                                    std::string* error) {
  ++result.scored;
  const auto key = std::make_pair(fingerprint, candidate);
  if (const auto it = cache_.find(key); it != cache_.end()) {
    ++result.cached;
    return it->second;
  }
  Score s;
  const Lowered l =
      lower(scenario_.model, scenario_.cluster, plan_, scenario_.workload, batch, &candidate);
  if (!l.error.empty()) {
    if (error) *error = l.error;
    return cache_[key] = s;
  }
  const Timeline t = evaluate(l.program, cost_);
  if (!t.error.empty()) {
    if (error) *error = t.error;
    return cache_[key] = s;
  }
  s.lowered = true;
  s.step_s = t.step_s;
  s.layers = l.dip_layers;
  double worst = 0;
  for (std::size_t r = 0; r < l.program.memory.size(); ++r)
    worst = std::max(worst, l.program.memory[r].total() + t.peak_activation_bytes[r]);
  s.fits = worst <= memory_capacity_bytes(scenario_.cluster, l.program.world);
  return cache_[key] = s;
}

DipSearchResult DipPlanner::search(const Batch& batch, const DipSchedule& start, bool move_layers) {
  const auto t0 = std::chrono::steady_clock::now();
  DipSearchResult r;
  const std::string fingerprint = batch_fingerprint(batch);
  DipSchedule best = start;
  Score best_score = score(batch, fingerprint, best, r, &r.error);
  r.schedule = best;
  if (!best_score.lowered) return r;
  r.start_step_s = best_score.step_s;
  r.start_fits = best_score.fits;
  // Explicit layers (the same lowering) give the layer moves something to move.
  if (best.layers.empty()) {
    best.layers = best_score.layers;
    cache_[{fingerprint, best}] = best_score;
  }
  auto consider = [&](const DipSchedule& c) {
    const Score s = score(batch, fingerprint, c, r);
    if (!s.better_than(best_score)) return false;
    best = c;
    best_score = s;
    return true;
  };

  const ModelSpec& model = scenario_.model;
  const int32_t P = static_cast<int32_t>(plan_.layout.pp);
  const int32_t V = static_cast<int32_t>(plan_.layout.vpp);
  const int32_t M = static_cast<int32_t>(micro_batches(plan_, model, scenario_.workload));

  // 1. Segment order: which encoder's ready forwards go first, and encoders or LLM first.
  std::vector<int32_t> encoders;
  for (std::size_t i = 0; i < model.modules.size(); ++i)
    if (model.modules[i].role == ModuleRole::kEncoder) encoders.push_back(static_cast<int32_t>(i));
  {
    const DipSchedule base = best;
    std::vector<int32_t> order = encoders;
    std::sort(order.begin(), order.end());
    int permutations = 0;
    do {
      for (bool first : {true, false}) {
        DipSchedule c = base;
        c.segment_order = order;
        c.encoders_first = first;
        consider(c);
      }
    } while (++permutations < 24 && std::next_permutation(order.begin(), order.end()));
  }
  // 2. Interleaving: how far encoders run ahead, how many micro-batches a stage holds.
  for (int32_t lookahead : {1, 2, P, 2 * P, M}) {
    DipSchedule c = best;
    c.lookahead = std::max(1, lookahead);
    consider(c);
  }
  for (int32_t in_flight : {P, P + 1, 2 * P, P * V + P - 1}) {
    DipSchedule c = best;
    c.in_flight = in_flight;
    consider(c);
  }
  // 3. One layer across a boundary of a segment, hill-climbing until nothing improves.
  for (int pass = 0; move_layers && pass < 4; ++pass) {
    bool improved = false;
    const auto start_layers = best.layers;
    for (const auto& [module, layers] : start_layers)
      for (std::size_t i = 0; i + 1 < layers.size(); ++i)
        for (int dir : {+1, -1}) {
          std::vector<int64_t> moved = best.layers.at(module);
          auto& from = moved[dir > 0 ? i : i + 1];
          auto& to = moved[dir > 0 ? i + 1 : i];
          if (from <= 1) continue;
          --from;
          ++to;
          DipSchedule c = best;
          c.layers[module] = moved;
          improved |= consider(c);
        }
    if (!improved) break;
  }
  r.schedule = best;
  r.step_s = best_score.step_s;
  r.fits = best_score.fits;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace tessera

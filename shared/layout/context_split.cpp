#include "shared/layout/context_split.hpp"

#include <algorithm>
#include <numeric>

#include "shared/base/check.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

std::vector<TokenTag> llm_token_tags(const ModelSpec& model, std::span<const Sample* const> samples,
                                     int64_t max_seq_len) {
  const ModuleSpec* image = encoder_for(model, Modality::kImage);
  const ModuleSpec* audio = encoder_for(model, Modality::kAudio);
  std::vector<TokenTag> tags;
  int32_t item = 0;
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const Sample& s = *samples[k];
    std::vector<int64_t> items;  // LLM tokens of each media item, images then audio
    if (image != nullptr)
      for (const ImageItem& i : s.images)
        items.push_back(llm_tokens(model, *image, image_tokens(*image, i.width, i.height)));
    if (audio != nullptr)
      for (double seconds : s.audio_seconds)
        items.push_back(llm_tokens(model, *audio, audio_tokens(*audio, seconds)));
    int64_t media = 0;
    for (int64_t tokens : items) {
      for (int64_t t = 0; t < tokens && media < max_seq_len; ++t, ++media)
        tags.push_back({static_cast<int32_t>(k), item});
      ++item;
    }
    const int64_t text = std::min<int64_t>(s.text_tokens, max_seq_len - media);
    for (int64_t t = 0; t < text; ++t) tags.push_back({static_cast<int32_t>(k), -1});
  }
  return tags;
}

std::vector<KeySpan> attended_keys(std::span<const TokenTag> tags) {
  const auto n = static_cast<int64_t>(tags.size());
  std::vector<KeySpan> spans(tags.size());
  auto at = [&](int64_t i) -> const TokenTag& { return tags[static_cast<std::size_t>(i)]; };
  int64_t sample_begin = 0;
  for (int64_t q = 0; q < n;) {
    if (q > 0 && at(q).sample != at(q - 1).sample) sample_begin = q;
    if (at(q).item < 0) {
      spans[static_cast<std::size_t>(q)] = {sample_begin, q};
      ++q;
      continue;
    }
    // A media item: its contiguous run of tokens, all attending to the whole run.
    int64_t end = q;
    while (end < n && at(end).item == at(q).item) ++end;
    for (int64_t k = q; k < end; ++k) spans[static_cast<std::size_t>(k)] = {q, end - 1};
    q = end;
  }
  return spans;
}

std::vector<std::vector<int64_t>> context_split(CpSplit policy, int64_t tokens, int64_t cp) {
  TESSERA_CHECK(cp >= 1 && tokens >= 0);
  std::vector<std::vector<int64_t>> out(static_cast<std::size_t>(cp));
  auto take = [&](int64_t rank, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) out[static_cast<std::size_t>(rank)].push_back(t);
  };
  if (policy == CpSplit::kZigzag) {
    const int64_t chunks = 2 * cp;
    auto bound = [&](int64_t c) { return c * tokens / chunks; };
    for (int64_t r = 0; r < cp; ++r) {
      take(r, bound(r), bound(r + 1));
      take(r, bound(chunks - 1 - r), bound(chunks - r));
    }
    return out;
  }
  for (int64_t r = 0; r < cp; ++r) take(r, r * tokens / cp, (r + 1) * tokens / cp);
  return out;
}

double cp_linear_tiles(const TransformerArch& a) {
  // Per block of 128 queries: 2·P FLOPs per token of linear work (P averaged over the stack's
  // layers) against 4·q FLOPs per (query, key) pair, 128·32 pairs a tile.
  const double matmul = sum_over_layers(a, 0, a.layers, [](const TransformerArch& x) {
    return static_cast<double>(active_layer_matmul_parameters(x));
  });
  return 2.0 * matmul / static_cast<double>(std::max<int64_t>(1, a.layers)) /
         layer_attention_flops(a, 32.0);
}

std::vector<std::vector<int64_t>> context_split(CpSplit policy, std::span<const TokenTag> tags,
                                                int64_t cp, double linear_tiles) {
  constexpr int64_t kBlock = 128, kTile = 32;
  const auto n = static_cast<int64_t>(tags.size());
  if (policy != CpSplit::kMakespan || n < kBlock * cp)
    return context_split(policy == CpSplit::kMakespan ? CpSplit::kUniform : policy, n, cp);
  const std::vector<KeySpan> keys = attended_keys(tags);
  // Cost of each query block: its non-empty key tiles (attention) plus its linear work.
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> cost(static_cast<std::size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    std::vector<std::pair<int64_t, int64_t>> tiles;  // per row: [first tile, last tile]
    for (int64_t q = b * kBlock; q < std::min(n, (b + 1) * kBlock); ++q)
      tiles.emplace_back(keys[static_cast<std::size_t>(q)].first / kTile,
                         keys[static_cast<std::size_t>(q)].last / kTile);
    std::sort(tiles.begin(), tiles.end());
    int64_t covered = 0, end = -1;
    for (const auto& [lo, hi] : tiles) {
      if (hi <= end) continue;
      covered += hi - std::max(lo, end + 1) + 1;
      end = hi;
    }
    const int64_t rows = std::min(n, (b + 1) * kBlock) - b * kBlock;
    cost[static_cast<std::size_t>(b)] =
        static_cast<double>(covered) + linear_tiles * static_cast<double>(rows) / kBlock;
  }
  const std::vector<std::vector<int64_t>> owned = lpt_assign(cost, cp);
  std::vector<std::vector<int64_t>> out(static_cast<std::size_t>(cp));
  for (std::size_t r = 0; r < owned.size(); ++r) {
    for (int64_t b : owned[r])
      for (int64_t q = b * kBlock; q < std::min(n, (b + 1) * kBlock); ++q) out[r].push_back(q);
  }
  // Blocks are coarse when each rank gets only a few: keep whichever of LPT, zigzag and uniform
  // leaves the most loaded rank least work, token by token (linear work plus attended keys).
  const double per_token = linear_tiles / kBlock, per_key = 1.0 / (kBlock * kTile);
  auto most = [&](const std::vector<std::vector<int64_t>>& split) {
    double worst = 0;
    for (const auto& part : split) {
      double w = 0;
      for (int64_t q : part)
        w += per_token + per_key * static_cast<double>(keys[static_cast<std::size_t>(q)].last -
                                                       keys[static_cast<std::size_t>(q)].first + 1);
      worst = std::max(worst, w);
    }
    return worst;
  };
  double best = most(out);
  for (CpSplit other : {CpSplit::kZigzag, CpSplit::kUniform}) {
    auto candidate = context_split(other, n, cp);
    if (const double w = most(candidate); w < best * (1 - 1e-12)) {
      best = w;
      out = std::move(candidate);
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> lpt_assign(const std::vector<double>& costs, int64_t bins) {
  TESSERA_CHECK(bins >= 1);
  std::vector<int64_t> order(costs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return costs[static_cast<std::size_t>(a)] > costs[static_cast<std::size_t>(b)];
  });
  std::vector<double> load(static_cast<std::size_t>(bins), 0);
  std::vector<std::vector<int64_t>> owned(static_cast<std::size_t>(bins));
  for (int64_t i : order) {
    const auto r =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += costs[static_cast<std::size_t>(i)];
    owned[r].push_back(i);
  }
  for (auto& items : owned) std::sort(items.begin(), items.end());
  return owned;
}

std::vector<double> cp_attention_work(std::span<const TokenTag> tags,
                                      const std::vector<std::vector<int64_t>>& split) {
  const std::vector<KeySpan> keys = attended_keys(tags);
  std::vector<double> work;
  for (const auto& part : split) {
    double pairs = 0;
    for (int64_t q : part)
      pairs += static_cast<double>(keys[static_cast<std::size_t>(q)].last -
                                   keys[static_cast<std::size_t>(q)].first + 1);
    work.push_back(pairs);
  }
  return work;
}

}  // namespace tessera

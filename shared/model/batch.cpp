#include "shared/model/batch.hpp"

#include <algorithm>
#include <numeric>

#include "shared/base/check.hpp"
#include "shared/base/random.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

namespace {

Sample draw_sample(const SampleSource& w, Rng& rng) {
  Sample s;
  s.text_tokens = sample_int(w.text_tokens, rng, kMaxTextTokens);
  if (w.image) {
    const int64_t n = sample_int(w.image->count, rng, kMaxMediaItems);
    for (int64_t i = 0; i < n; ++i)
      s.images.push_back({sample_int(w.image->width, rng, kMaxMediaSide),
                          sample_int(w.image->height, rng, kMaxMediaSide)});
  }
  if (w.audio) {
    const int64_t n = sample_int(w.audio->count, rng, kMaxMediaItems);
    for (int64_t i = 0; i < n; ++i)
      s.audio_seconds.push_back(sample(w.audio->seconds, rng, kMaxAudioSeconds));
  }
  if (w.video) {
    const int64_t n = sample_int(w.video->count, rng, kMaxMediaItems);
    for (int64_t i = 0; i < n; ++i)
      s.videos.push_back({sample_int(w.video->frames, rng, kMaxFrames),
                          sample_int(w.video->width, rng, kMaxMediaSide),
                          sample_int(w.video->height, rng, kMaxMediaSide)});
  }
  return s;
}

// Which of `sources` (indices into `all`) a uniform draw `u` in [0, 1) picks, in proportion to
// their weights.
std::size_t pick_source(const std::vector<SampleSource>& all,
                        const std::vector<std::size_t>& sources, double u) {
  double total = 0;
  for (std::size_t i : sources) total += all[i].weight;
  double at = u * total;
  for (std::size_t k = 0; k + 1 < sources.size(); ++k) {
    if (at < all[sources[k]].weight) return sources[k];
    at -= all[sources[k]].weight;
  }
  return sources.back();
}

// The sources a batch of `iteration` draws from: every one, or with group_batches those of one
// group, chosen by the group's total weight with the iteration's own stream.
std::vector<std::size_t> batch_sources(const WorkloadSpec& w, int64_t iteration) {
  std::vector<std::size_t> all(w.sources.size());
  std::iota(all.begin(), all.end(), std::size_t{0});
  if (!w.group_batches || w.sources.size() < 2) return all;
  Rng rng(mix64(w.seed ^ mix64(static_cast<uint64_t>(iteration) + 0x6a09e667ULL)));
  const std::string& group = w.sources[pick_source(w.sources, all, rng.uniform())].group;
  std::vector<std::size_t> members;
  for (std::size_t i : all)
    if (w.sources[i].group == group) members.push_back(i);
  return members;
}

}  // namespace

Batch draw_batch(const WorkloadSpec& w, int64_t iteration) {
  TESSERA_CHECK(w.global_batch > 0 && iteration >= 0);
  Batch batch;
  batch.iteration = iteration;
  batch.samples.reserve(static_cast<std::size_t>(w.global_batch));
  if (!w.manifest_samples.empty()) {
    const int64_t n = static_cast<int64_t>(w.manifest_samples.size());
    int64_t cached_epoch = -1;
    std::vector<int64_t> order(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < w.global_batch; ++i) {
      const int64_t position = iteration * w.global_batch + i;
      const int64_t epoch = position / n;
      if (epoch != cached_epoch) {  // Fisher-Yates shuffle of this epoch
        std::iota(order.begin(), order.end(), 0);
        Rng rng(mix64(w.seed ^ mix64(static_cast<uint64_t>(epoch) + 0x5eedULL)));
        for (int64_t k = n - 1; k > 0; --k) std::swap(order[k], order[rng.uniform_int(0, k)]);
        cached_epoch = epoch;
      }
      batch.samples.push_back(w.manifest_samples[order[position % n]]);
    }
    return batch;
  }
  TESSERA_CHECK(!w.sources.empty());
  const std::vector<std::size_t> sources = batch_sources(w, iteration);
  for (int64_t i = 0; i < w.global_batch; ++i) {
    // One stream per sample: a sample does not change when the batch size does. A mixture's
    // sample first picks its source from it (one source: nothing drawn, so nothing changes).
    Rng rng(mix64(w.seed) ^
            mix64(static_cast<uint64_t>(iteration) * 0x100000001b3ULL + static_cast<uint64_t>(i)));
    const std::size_t source =
        sources.size() > 1 ? pick_source(w.sources, sources, rng.uniform()) : sources[0];
    batch.samples.push_back(draw_sample(w.sources[source], rng));
  }
  return batch;
}

SampleTokens sample_tokens(const ModelSpec& model, const Sample& s) {
  SampleTokens t;
  t.text = s.text_tokens;
  if (!s.images.empty()) {
    const ModuleSpec* enc = encoder_for(model, Modality::kImage);
    TESSERA_CHECK(enc != nullptr, "model has no image encoder");
    for (const ImageItem& i : s.images) {
      const MediaTokens m = image_tokens(*enc, i.width, i.height);
      t.image_llm += llm_tokens(model, *enc, m);
      t.image_encoder += m.encoder_tokens;
    }
  }
  if (!s.audio_seconds.empty()) {
    const ModuleSpec* enc = encoder_for(model, Modality::kAudio);
    TESSERA_CHECK(enc != nullptr, "model has no audio encoder");
    for (double seconds : s.audio_seconds) {
      const MediaTokens m = audio_tokens(*enc, seconds);
      t.audio_llm += llm_tokens(model, *enc, m);
      t.audio_encoder += m.encoder_tokens;
    }
  }
  if (!s.videos.empty()) {
    const ModuleSpec* enc = encoder_for(model, Modality::kVideo);
    TESSERA_CHECK(enc != nullptr, "model has no video encoder");
    for (const VideoItem& v : s.videos) {
      const MediaTokens m = video_tokens(*enc, v.frames, v.width, v.height);
      t.video_llm += llm_tokens(model, *enc, m);
      t.video_encoder += m.encoder_tokens;
    }
  }
  const ModuleSpec* llm = find_llm(model);
  const int64_t media = t.image_llm + t.audio_llm + t.video_llm;
  if (llm != nullptr && llm->transformer && llm->transformer->cross_attention_layers > 0) {
    t.cross_attention = media;
    t.llm_sequence = t.text;
  } else {
    t.llm_sequence = t.text + media;
  }
  return t;
}

Stats summarize(std::vector<double> values) {
  Stats s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  auto quantile = [&](double q) {
    const std::size_t k =
        static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
    return values[std::min(k, values.size() - 1)];
  };
  s.p50 = quantile(0.5);
  s.p90 = quantile(0.9);
  return s;
}

}  // namespace tessera

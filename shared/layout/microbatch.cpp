#include "shared/layout/microbatch.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "shared/base/check.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

const ModuleSpec* source_encoder(const ModelSpec& model, const ModuleSpec& m) {
  if (m.role == ModuleRole::kEncoder) return &m;
  if (m.role == ModuleRole::kProjector && !m.inputs.empty()) {
    const ModuleSpec* in = find_module(model, m.inputs.front());
    return in == nullptr ? nullptr : source_encoder(model, *in);
  }
  return nullptr;
}

std::vector<MediaItem> media_items(const ModelSpec& model, const ModuleSpec& encoder,
                                   const Sample& s) {
  std::vector<MediaItem> items;
  const auto item = [&](int64_t piece_tokens, int64_t pieces, const MediaTokens& t) {
    items.push_back({piece_tokens, pieces, llm_tokens(model, encoder, t), t.llm_tokens});
  };
  if (encoder_for(model, Modality::kImage) == &encoder)
    for (const ImageItem& i : s.images) {
      const MediaTokens t = image_tokens(encoder, i.width, i.height);
      item(t.encoder_tokens / t.pieces, t.pieces, t);
    }
  if (encoder_for(model, Modality::kVideo) == &encoder)
    for (const VideoItem& v : s.videos) {
      const MediaTokens t = video_tokens(encoder, v.frames, v.width, v.height);
      // Native-resolution encoders attend over the whole clip; fixed/tiled ones per frame.
      const bool whole = encoder.patching->resize == ResizeMode::kDynamic;
      item(whole ? t.encoder_tokens : t.encoder_tokens / t.pieces, whole ? 1 : t.pieces, t);
    }
  if (encoder_for(model, Modality::kAudio) == &encoder)
    for (double seconds : s.audio_seconds) {
      const MediaTokens t = audio_tokens(encoder, seconds);
      item(t.encoder_tokens / t.pieces, t.pieces, t);
    }
  return items;
}

std::vector<const ModuleSpec*> media_encoders(const ModelSpec& model) {
  std::vector<const ModuleSpec*> encoders;
  for (Modality modality : {Modality::kImage, Modality::kVideo, Modality::kAudio}) {
    const ModuleSpec* enc = encoder_for(model, modality);
    if (enc != nullptr && std::find(encoders.begin(), encoders.end(), enc) == encoders.end())
      encoders.push_back(enc);
  }
  return encoders;
}

ModuleWork module_work(const ModelSpec& model, const ModuleSpec& m,
                       std::span<const Sample* const> samples, int64_t max_seq_len,
                       bool pad_to_longest) {
  ModuleWork w;
  w.samples = static_cast<int64_t>(samples.size());
  const ModuleSpec* encoder = source_encoder(model, m);
  const ModuleSpec* llm = find_llm(model);
  const bool cross =
      llm != nullptr && llm->transformer && llm->transformer->cross_attention_layers > 0;
  int64_t longest = 0;
  for (const Sample* s : samples) {
    if (encoder != nullptr) {
      for (const MediaItem& item : media_items(model, *encoder, *s)) {
        // An encoder hands on its merged tokens; a projector takes them and hands on the LLM's.
        if (m.role == ModuleRole::kEncoder) {
          w.tokens += item.piece_tokens * item.pieces;
          w.attention_pairs += static_cast<double>(item.pieces) *
                               static_cast<double>(item.piece_tokens) *
                               static_cast<double>(item.piece_tokens);
          w.output_tokens += item.merged_tokens;
        } else {
          w.tokens += item.merged_tokens;
          w.output_tokens += item.llm_tokens;
        }
      }
      continue;
    }
    // LLM or generator: the sample's sequence, media first, truncated at max_seq_len.
    const SampleTokens t = sample_tokens(model, *s);
    const int64_t media =
        (m.role == ModuleRole::kLlm && !cross) ? std::min(t.llm_sequence - t.text, max_seq_len) : 0;
    const int64_t text = std::min(t.text, max_seq_len - media);
    w.tokens += media + text;
    longest = std::max(longest, media + text);
    w.text_tokens += text;
    w.output_tokens += media + text;
    double media_pairs = 0;
    if (media > 0) {
      // Each image/clip attends within itself (bidirectional), clamped to what fits.
      int64_t left = media;
      for (const ModuleSpec* enc : media_encoders(model))
        for (const MediaItem& item : media_items(model, *enc, *s)) {
          const double n = static_cast<double>(std::min(item.llm_tokens, left));
          media_pairs += n * n;
          left -= static_cast<int64_t>(n);
        }
    }
    const double tx = static_cast<double>(text);
    w.attention_pairs += media_pairs + tx * static_cast<double>(media) + tx * (tx + 1) / 2;
  }
  if (pad_to_longest && m.role == ModuleRole::kLlm) {
    const int64_t pads = longest * w.samples - w.tokens;
    w.tokens += pads;
    w.attention_pairs += static_cast<double>(pads);
  }
  return w;
}

MicrobatchAssignment assign_microbatches(const Batch& batch, const ModelSpec& model,
                                         int64_t replicas, int64_t microbatches,
                                         MicrobatchPolicy policy, int64_t max_seq_len) {
  TESSERA_CHECK(replicas >= 1 && microbatches >= 1);
  TESSERA_CHECK(policy != MicrobatchPolicy::kEntrain,
                "entrain has two levels of micro-batches: use entrain_assignment()");
  const int64_t n = static_cast<int64_t>(batch.samples.size());
  MicrobatchAssignment out(static_cast<std::size_t>(replicas));
  for (int64_t d = 0; d < replicas; ++d) {
    // Contiguous, nearly even blocks (exactly even for a validated plan).
    const int64_t begin = d * n / replicas, end = (d + 1) * n / replicas;
    std::vector<int32_t> block(static_cast<std::size_t>(end - begin));
    std::iota(block.begin(), block.end(), static_cast<int32_t>(begin));
    if (policy == MicrobatchPolicy::kSorted) {
      std::vector<int64_t> length(static_cast<std::size_t>(n));
      for (int32_t i : block)
        length[static_cast<std::size_t>(i)] =
            std::min(sample_tokens(model, batch.samples[static_cast<std::size_t>(i)]).llm_sequence,
                     max_seq_len);
      std::stable_sort(block.begin(), block.end(), [&](int32_t a, int32_t b) {
        return length[static_cast<std::size_t>(a)] < length[static_cast<std::size_t>(b)];
      });
    }
    auto& replica = out[static_cast<std::size_t>(d)];
    replica.resize(static_cast<std::size_t>(microbatches));
    const int64_t size = static_cast<int64_t>(block.size());
    for (int64_t mb = 0; mb < microbatches; ++mb)
      for (int64_t k = mb * size / microbatches; k < (mb + 1) * size / microbatches; ++k)
        replica[static_cast<std::size_t>(mb)].push_back(block[static_cast<std::size_t>(k)]);
  }
  return out;
}

std::vector<int32_t> replica_samples(const MicrobatchAssignment& llm, int64_t dp, int64_t replica,
                                     int32_t mb) {
  const auto dp_llm = static_cast<int64_t>(llm.size());
  TESSERA_CHECK(dp >= 1 && dp_llm >= 1 && (dp % dp_llm == 0 || dp_llm % dp == 0));
  std::vector<int32_t> out;
  // Sample j of an LLM replica's local batch (counting through its micro-batches in order)
  // belongs to part j mod parts: with fewer samples per micro-batch than parts, consecutive
  // micro-batches still land on different replicas.
  auto take = [&](int64_t llm_replica, int64_t part, int64_t parts) {
    const auto& replica_mbs = llm[static_cast<std::size_t>(llm_replica)];
    int64_t position = 0;
    for (int32_t b = 0; b < static_cast<int32_t>(replica_mbs.size()); ++b) {
      const bool wanted = mb < 0 || b == mb;
      for (int32_t id : replica_mbs[static_cast<std::size_t>(b)]) {
        if (wanted && position % parts == part) out.push_back(id);
        ++position;
      }
      if (mb >= 0 && b >= mb) break;
    }
  };
  if (dp >= dp_llm) {
    const int64_t k = dp / dp_llm;
    take(replica / k, replica % k, k);
  } else {
    const int64_t k = dp_llm / dp;
    for (int64_t d = replica * k; d < (replica + 1) * k; ++d) take(d, 0, 1);
  }
  return out;
}

MediaAssignment assign_media(const Batch& batch, const ModelSpec& model, const ModuleSpec& encoder,
                             const MicrobatchAssignment& llm, int64_t dp) {
  const auto dp_llm = static_cast<int64_t>(llm.size());
  TESSERA_CHECK(dp_llm >= 1 && dp >= dp_llm && dp % dp_llm == 0);
  const int64_t k = dp / dp_llm;
  MediaAssignment out(static_cast<std::size_t>(dp));
  struct Item {
    MediaPiece piece;
    int64_t position = 0;  // of its sample in the LLM replica's order
    double work = 0;
  };
  for (int64_t r = 0; r < dp_llm; ++r) {
    std::vector<double> load(static_cast<std::size_t>(k), 0.0);
    int64_t position = 0;
    for (const std::vector<int32_t>& mb : llm[static_cast<std::size_t>(r)]) {
      std::vector<Item> items;
      for (int32_t sample : mb) {
        const std::vector<MediaItem> media =
            media_items(model, encoder, batch.samples[static_cast<std::size_t>(sample)]);
        for (std::size_t j = 0; j < media.size(); ++j) {
          const double tokens = static_cast<double>(media[j].piece_tokens * media[j].pieces);
          const double per_token =
              forward_flops_per_token(encoder, static_cast<double>(media[j].piece_tokens));
          items.push_back({{sample, static_cast<int32_t>(j)}, position, tokens * per_token});
        }
        ++position;
      }
      std::stable_sort(items.begin(), items.end(),
                       [](const Item& a, const Item& b) { return a.work > b.work; });
      std::vector<std::vector<Item>> dealt(static_cast<std::size_t>(k));
      for (const Item& item : items) {
        const auto least =
            static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        load[least] += item.work;
        dealt[least].push_back(item);
      }
      for (int64_t j = 0; j < k; ++j) {
        auto& mine = dealt[static_cast<std::size_t>(j)];
        std::sort(mine.begin(), mine.end(), [](const Item& a, const Item& b) {
          return std::tie(a.position, a.piece.item) < std::tie(b.position, b.piece.item);
        });
        for (const Item& item : mine)
          out[static_cast<std::size_t>(r * k + j)].push_back(item.piece);
      }
    }
  }
  return out;
}

Sample media_subset(const ModelSpec& model, const ModuleSpec& encoder, const Sample& sample,
                    std::span<const int32_t> items) {
  Sample out;
  int32_t j = 0;
  auto wanted = [&] { return std::find(items.begin(), items.end(), j++) != items.end(); };
  // The order of media_items().
  if (encoder_for(model, Modality::kImage) == &encoder)
    for (const ImageItem& i : sample.images)
      if (wanted()) out.images.push_back(i);
  if (encoder_for(model, Modality::kVideo) == &encoder)
    for (const VideoItem& v : sample.videos)
      if (wanted()) out.videos.push_back(v);
  if (encoder_for(model, Modality::kAudio) == &encoder)
    for (double seconds : sample.audio_seconds)
      if (wanted()) out.audio_seconds.push_back(seconds);
  return out;
}

}  // namespace tessera

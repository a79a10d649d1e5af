#include "exec/data.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "exec/device.hpp"
#include "exec/weights.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

namespace {

const ModuleSpec* image_encoder(const ModelSpec& model) {
  return encoder_for(model, Modality::kImage);
}

// A clip's frames in pieces of `t` frames, each (C·t, S, S) with a frame's channels for each time
// step (a 3-D patch's layout: channel, then time); the last frame repeats to fill the last piece.
std::vector<torch::Tensor> temporal_pieces(const torch::Tensor& frames, int64_t t) {
  std::vector<torch::Tensor> pieces;
  const int64_t f = frames.size(0);
  for (int64_t first = 0; first < f; first += t) {
    std::vector<torch::Tensor> step;
    for (int64_t k = 0; k < t; ++k) step.push_back(frames[std::min(first + k, f - 1)]);
    // (t, C, S, S) -> (C, t, S, S) -> (C·t, S, S)
    pieces.push_back(torch::stack(step).transpose(0, 1).reshape(
        {frames.size(1) * t, frames.size(2), frames.size(3)}));
  }
  return pieces;
}

// Caption vocabulary of the shapes data set.
constexpr int64_t kBos = 1, kA = 2, kOn = 3, kBackground = 4, kEos = 5;
constexpr int64_t kColorBase = 10, kShapeBase = 20, kBackdropBase = 30;
constexpr float kColors[6][3] = {{1, -1, -1}, {-1, 1, -1}, {-1, -1, 1},
                                 {1, 1, -1},  {1, -1, 1},  {-1, 1, 1}};
constexpr float kBackdrops[3][3] = {{-1, -1, -1}, {1, 1, 1}, {0, 0, 0}};

torch::Tensor shape_image(int64_t size, int color, int shape, int backdrop, double cx, double cy,
                          double radius) {
  torch::Tensor img = torch::empty({3, size, size});
  auto a = img.accessor<float, 3>();
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      const double dx = static_cast<double>(x) + 0.5 - cx, dy = static_cast<double>(y) + 0.5 - cy;
      bool in = false;
      if (shape == 0) in = dx * dx + dy * dy <= radius * radius;                          // circle
      if (shape == 1) in = std::abs(dx) <= radius * 0.8 && std::abs(dy) <= radius * 0.8;  // square
      if (shape == 2)
        in = dy <= radius * 0.8 && dy >= -radius && std::abs(dx) <= (dy + radius) * 0.6;
      const float* c = in ? kColors[color] : kBackdrops[backdrop];
      for (int ch = 0; ch < 3; ++ch) a[ch][y][x] = c[ch];
    }
  return img;
}

}  // namespace

std::string executor_support(const ModelSpec& model) {
  const ModuleSpec* llm = find_llm(model);
  if (llm == nullptr || !llm->transformer || llm->transformer->vocab <= 0)
    return "the executor needs a decoder LLM with a vocabulary";
  if (model.dtype != DType::kFp32 && model.dtype != DType::kBf16)
    return "dtype " + enum_name(model.dtype, kDTypes) +
           ": the executor trains fp32, or bf16 with fp32 master weights (fp16 would need loss "
           "scaling, fp8 Transformer Engine's scaling recipes)";
  if (llm->transformer->cross_attention_layers > 0)
    return "cross-attention LLMs (Mllama) are not in the executor yet";
  for (const std::string& input : llm->inputs) {
    const ModuleSpec* in = find_module(model, input);
    if (in == nullptr || in->role != ModuleRole::kProjector)
      return "the LLM's inputs must be projectors (" + input + " is not)";
  }
  for (const ModuleSpec& m : model.modules) {
    if (m.role == ModuleRole::kGenerator)
      return m.name + ": generators are not in the executor yet";
    if (m.transformer && m.transformer->gated_layers > 0)
      return m.name + ": gated layers (Mllama's) are not in the executor yet";
    if (m.transformer && m.transformer->extra_embeddings > 0)
      return m.name + ": embedding rows beyond the vocabulary are not in the executor yet";
    if (m.transformer && m.transformer->experts > 0 && m.transformer->capacity_factor > 0)
      return m.name +
             ": token dropping (capacity_factor) is not in the executor: which tokens an expert "
             "drops depends on how the batch is grouped, so a run has no single-rank reference; "
             "it runs dropless";
    if (m.transformer && m.transformer->mtp_layers > 0)
      return m.name + ": multi-token-prediction layers (mtp_layers) are not in the executor yet";
    if (m.transformer && m.transformer->experts > 0 &&
        (m.transformer->linear_bias || m.transformer->mlp_bias))
      return m.name + ": experts with biases are not in the executor yet";
    if (m.projector && m.projector->input_norm_width > 0 &&
        m.projector->input_norm_width != m.projector->in)
      return m.name + ": a norm before the token merge is not in the executor yet";
    if (m.projector && m.projector->merger > 0)
      return m.name + ": a projector's patch merger is not in the executor yet";
    if (m.projector && m.projector->queries > 0)
      return m.name + ": a resampler projector (queries) is not in the executor yet";
    if (m.projector && m.projector->deepstack > 0)
      return m.name + ": DeepStack projector copies are not in the executor yet";
    if (m.projector && (m.projector->separators > 0 || m.projector->output_embeddings > 0))
      return m.name +
             ": learned separators and newlines between image pieces are not in the executor "
             "yet (they mark tiles, which it does not cut)";
    if (m.role != ModuleRole::kEncoder || m.modality == Modality::kAudio) continue;
    if (m.patching->resize != ResizeMode::kFixed)
      return m.name +
             ": only fixed-size image and video encoders are in the executor so far (it resizes "
             "every image and frame to image_size; tiles and native resolutions are not cut)";
    if (m.patching->merge_padding &&
        (m.patching->image_size / m.patching->patch_size) % m.patching->spatial_merge != 0)
      return m.name + ": a padded token merge is not in the executor yet";
    if (m.patching->video_pool != 1)
      return m.name + ": pooling video frames' tokens is not in the executor yet";
  }
  return "";
}

std::string executor_plan_support(const ParallelPlan& plan, const ModelSpec& model) {
  const std::string next = " is not in the executor yet";
  if (plan.layout.expert_tp() != plan.layout.tp)
    return "plan.layout.etp: routed experts whole on each TP rank (expert TP 1 below TP)" + next;
  for (const auto& [module, l] : plan.modules)
    if (l.expert_tp() != l.tp)
      return "plan.modules." + module +
             ".etp: routed experts whole on each TP rank (expert TP 1 below TP)" + next;
  for (const ModuleSpec& m : model.modules) {
    if (!m.transformer) continue;
    int64_t tp = plan.layout.tp;
    std::string field = "plan.layout.tp";
    for (const auto& [module, l] : plan.modules)
      if (module == m.name) {
        tp = l.tp;
        field = "plan.modules." + module + ".tp";
      }
    // Heads TP does not divide run padded (multi-head attention), or whole on every TP rank.
    const TransformerArch& a = *m.transformer;
    const bool pad = plan.indivisible_heads == IndivisibleHeads::kPad && !accepts_tp(a, tp);
    if (pad && (a.kv_lora_rank > 0 || (a.kv_heads != 0 && a.kv_heads != a.heads)))
      return field + ": " + m.name +
             "'s heads padded to a multiple of TP with grouped-query or latent attention" + next;
    if (replicated_over_tp(plan, model, m)) continue;
    // Sequence parallelism (the LLM's layers only: sequence_parallel_for) runs dense and
    // grouped-query layers; what else it would split is refused by name (with
    // sequence_parallel false the same TP plan runs).
    if (sequence_parallel_for(plan, m) && tp > 1) {
      const std::string sp =
          "plan.sequence_parallel: sequence parallelism (activations split over the TP ranks "
          "along the sequence between the layers) ";
      const std::string instead =
          next +
          "; with sequence_parallel false it runs tensor parallelism with all-reduces "
          "(--set plan.sequence_parallel=false)";
      if (m.role != ModuleRole::kLlm)
        return "plan.encoder_sequence_parallel: sequence parallelism of " + m.name +
               "'s layers (an encoder's)" + next +
               "; with encoder_sequence_parallel false the LLM's runs (--set "
               "plan.encoder_sequence_parallel=false)";
      if (a.experts > 0) return sp + "with " + m.name + "'s MoE layers" + instead;
      if (a.kv_lora_rank > 0) return sp + "with " + m.name + "'s latent attention" + instead;
      if (plan.fully_sharded) return sp + "with fully sharded data parallelism" + instead;
    }
    if (const std::string why = tp_refusal(pad ? pad_heads(a, tp) : a, m.name, tp); !why.empty())
      return field + ": " + why + next;
    if (m.transformer->qk_norm && tp > 1)
      return field + ": " + m.name +
             "'s query/key norms under tensor parallelism (the norm weights' gradient would "
             "need a sum over TP)" +
             next;
  }
  if (plan.fp8 != Fp8Recipe::kNone)
    return "plan.fp8: FP8 GEMMs (Transformer Engine's recipes)" + next;
  if (plan.recompute_layers > 0)
    return "plan.recompute_layers: full recomputation of part of each chunk" + next;
  if (plan.recompute == Recompute::kPerOp)
    return "plan.recompute: per-op selective checkpointing (torchtitan's policy)" + next;
  if (plan.recompute == Recompute::kSelective && (plan.recompute_modules & ~kRecomputeCoreAttn))
    return "plan.recompute_modules: recomputation of submodules other than the attention core "
           "(Megatron-LM's layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts)" +
           next;
  if (plan.moe_dispatcher != MoeDispatcher::kAllToAll)
    return "plan.moe_dispatcher: DeepEP's and HybridEP's node-deduplicated dispatch" + next;
  if (plan.moe_fp8_dispatch) return "plan.moe_fp8_dispatch: FP8 expert dispatch" + next;
  if (plan.moe_a2a_overlap)
    return "plan.moe_a2a_overlap: expert all-to-alls beside another micro-batch's compute" + next;
  const ModuleSpec* llm = find_llm(model);
  for (const auto& [module, l] : plan.modules)
    if (l.cp > 1 && module != llm->name)
      return "plan.modules." + module + ".cp: context parallelism of a module beside the LLM (" +
             module + ")" + next;
  return "";
}

TrainBatch make_batch(const Scenario& s, DatasetKind kind, int64_t iteration) {
  TrainBatch out;
  const ModuleSpec* encoder = image_encoder(s.model);
  const int64_t vocab = find_llm(s.model)->transformer->vocab;
  const uint64_t seed = s.workload.seed;
  if (kind == DatasetKind::kShapes) {
    TESSERA_CHECK(encoder != nullptr, "the shapes data set needs an image encoder");
    TESSERA_CHECK(vocab > kBackdropBase + 3,
                  "the shapes data set needs a vocabulary of 34 or more");
    const int64_t size = encoder->patching->image_size;
    out.batch.iteration = iteration;
    for (int64_t i = 0; i < s.workload.global_batch; ++i) {
      const uint64_t key =
          mix_seed(seed, 0x5aa9e5, static_cast<uint64_t>(iteration), static_cast<uint64_t>(i));
      const int color = static_cast<int>(stream_uniform(key, 0) * 6);
      const int shape = static_cast<int>(stream_uniform(key, 1) * 3);
      const int backdrop = static_cast<int>(stream_uniform(key, 2) * 3);
      const double radius = static_cast<double>(size) * (0.2 + 0.1 * stream_uniform(key, 3));
      const double cx = radius + (static_cast<double>(size) - 2 * radius) * stream_uniform(key, 4);
      const double cy = radius + (static_cast<double>(size) - 2 * radius) * stream_uniform(key, 5);
      SampleData d;
      d.text = {
          kBos,        kA,  kColorBase + color, kShapeBase + shape, kOn, kBackdropBase + backdrop,
          kBackground, kEos};
      d.images.push_back(shape_image(size, color, shape, backdrop, cx, cy, radius));
      Sample sample;
      sample.text_tokens = static_cast<int64_t>(d.text.size());
      sample.images.push_back({size, size});
      out.batch.samples.push_back(sample);
      out.data.push_back(std::move(d));
    }
  } else {
    out.batch = draw_batch(s.workload, iteration);
    for (std::size_t i = 0; i < out.batch.samples.size(); ++i) {
      const Sample& sample = out.batch.samples[i];
      const uint64_t key = mix_seed(seed, 0x7e47, static_cast<uint64_t>(iteration), i);
      SampleData d;
      for (int64_t t = 0; t < sample.text_tokens; ++t)
        d.text.push_back(static_cast<int64_t>(stream_uniform(key, static_cast<uint64_t>(t)) *
                                              static_cast<double>(vocab)));
      if (encoder != nullptr) {
        const int64_t size = encoder->patching->image_size;
        const int64_t channels = encoder->patching->in_channels;
        for (std::size_t k = 0; k < sample.images.size(); ++k)
          d.images.push_back(
              seeded_uniform(key, "image" + std::to_string(k), {channels, size, size}, 0.5));
      }
      if (const ModuleSpec* video = encoder_for(s.model, Modality::kVideo); video != nullptr) {
        const int64_t size = video->patching->image_size;
        const int64_t channels = video->patching->in_channels;
        for (std::size_t k = 0; k < sample.videos.size(); ++k)
          d.videos.push_back(seeded_uniform(key, "video" + std::to_string(k),
                                            {sample.videos[k].frames, channels, size, size}, 0.5));
      }
      if (const ModuleSpec* audio = encoder_for(s.model, Modality::kAudio); audio != nullptr) {
        const AudioFrontEnd& a = *audio->audio;
        for (std::size_t k = 0; k < sample.audio_seconds.size(); ++k) {
          // The windows audio_tokens() counts: max_seconds each, the last one shorter unless
          // padded.
          std::vector<torch::Tensor> windows;
          double left = sample.audio_seconds[k];
          const int64_t count = audio_tokens(*audio, left).pieces;
          for (int64_t w = 0; w < count; ++w) {
            const double span = a.pad_to_max ? a.max_seconds : std::min(left, a.max_seconds);
            left -= a.max_seconds;
            const auto frames =
                static_cast<int64_t>(std::ceil(span * static_cast<double>(a.frames_per_second)));
            windows.push_back(seeded_uniform(key,
                                             "audio" + std::to_string(k) + "." + std::to_string(w),
                                             {a.mel_bins, frames}, 0.5));
          }
          d.audio.push_back(std::move(windows));
        }
      }
      out.data.push_back(std::move(d));
    }
  }
  std::vector<int32_t> all(out.batch.samples.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  // Count predicted tokens sample by sample (the same rule as llm_layout).
  for (int32_t i : all) {
    const LlmLayout one = llm_layout(s.model, out, {i}, s.workload.max_seq_len);
    out.targets += (one.targets >= 0).sum().item<int64_t>();
  }
  return out;
}

void move_to_device(LlmLayout& l) {
  for (torch::Tensor* t :
       {&l.ids, &l.positions, &l.targets, &l.text_slots, &l.media_slots, &l.media_rows})
    if (t->defined()) *t = upload(*t);
}

LlmLayout llm_layout(const ModelSpec& model, const TrainBatch& batch,
                     const std::vector<int32_t>& samples, int64_t max_seq_len,
                     bool pad_to_longest) {
  LlmLayout l;
  std::vector<int64_t> ids, positions, targets, text_slots, media_slots, media_rows;
  // Each media item in the LLM sequence in module_work()'s order (media_encoders(), each
  // encoder's media_items()), with its LLM token count.
  auto items = [&](const Sample& s, const ModuleSpec* encoder) {
    std::vector<int64_t> tokens;
    for (const MediaItem& item : media_items(model, *encoder, s)) tokens.push_back(item.llm_tokens);
    return tokens;
  };
  // Rows of the media tensor: the LLM's inputs in order, each holding its encoder's rows.
  const ModuleSpec* llm = find_llm(model);
  std::map<const ModuleSpec*, int64_t> first_row;
  int64_t rows = 0;
  for (const std::string& input : llm->inputs) {
    const ModuleSpec* source = source_encoder(model, *find_module(model, input));
    first_row[source] = rows;
    for (int32_t i : samples)
      for (int64_t t : items(batch.batch.samples[static_cast<std::size_t>(i)], source)) rows += t;
  }
  std::map<const ModuleSpec*, int64_t> next_row = first_row;
  const std::vector<const ModuleSpec*> encoders = media_encoders(model);
  int32_t item = 0;     // media items of this micro-batch
  int64_t longest = 0;  // the longest sample's tokens
  for (std::size_t k = 0; k < samples.size(); ++k) {
    const auto index = static_cast<std::size_t>(samples[k]);
    const Sample& sample = batch.batch.samples[index];
    const SampleData& data = batch.data[index];
    const int64_t begin = static_cast<int64_t>(ids.size());
    int64_t media_left = max_seq_len;
    for (const ModuleSpec* encoder : encoders) {
      for (int64_t tokens : items(sample, encoder)) {
        const int64_t row = next_row[encoder];
        for (int64_t t = 0; t < tokens && media_left > 0; ++t, --media_left) {
          media_slots.push_back(static_cast<int64_t>(ids.size()));
          media_rows.push_back(row + t);
          ids.push_back(0);
          l.sample.push_back(static_cast<int32_t>(k));
          l.item.push_back(item);
        }
        next_row[encoder] += tokens;
        ++item;
      }
    }
    const int64_t media = static_cast<int64_t>(ids.size()) - begin;
    const int64_t text = std::min<int64_t>(sample.text_tokens, max_seq_len - media);
    for (int64_t t = 0; t < text; ++t) {
      text_slots.push_back(static_cast<int64_t>(ids.size()));
      ids.push_back(data.text[static_cast<std::size_t>(t)]);
      l.sample.push_back(static_cast<int32_t>(k));
      l.item.push_back(-1);
    }
    const int64_t end = static_cast<int64_t>(ids.size());
    longest = std::max(longest, end - begin);
    for (int64_t p = begin; p < end; ++p) {
      positions.push_back(p - begin);
      const bool next_is_text = p + 1 < end && l.item[static_cast<std::size_t>(p + 1)] < 0;
      targets.push_back(next_is_text ? ids[static_cast<std::size_t>(p + 1)] : -1);
    }
  }
  if (pad_to_longest) {
    // Every sample padded to the longest, the pads placed at the end (where they sit changes
    // nothing): each is its own one-token "sample" that attends to itself alone and predicts
    // nothing, so the samples' tokens compute what they would unpadded.
    const int64_t pads =
        longest * static_cast<int64_t>(samples.size()) - static_cast<int64_t>(ids.size());
    for (int64_t p = 0; p < pads; ++p) {
      ids.push_back(0);
      positions.push_back(0);
      targets.push_back(-1);
      l.sample.push_back(static_cast<int32_t>(samples.size() + static_cast<std::size_t>(p)));
      l.item.push_back(item++);
    }
  }
  l.tokens = static_cast<int64_t>(ids.size());
  auto tensor = [](const std::vector<int64_t>& v) {
    return torch::tensor(v, torch::kInt64).view({static_cast<int64_t>(v.size())});
  };
  l.ids = tensor(ids);
  l.positions = tensor(positions);
  l.targets = tensor(targets);
  l.text_slots = tensor(text_slots);
  l.media_slots = tensor(media_slots);
  l.media_rows = tensor(media_rows);
  return l;
}

int64_t llm_media_tokens(const ModelSpec& model, const ModuleSpec& encoder, const Sample& sample) {
  int64_t tokens = 0;
  for (const MediaItem& item : media_items(model, encoder, sample)) tokens += item.llm_tokens;
  return tokens;
}

namespace {

// Each position's sample and media item (-1: text) on this process's device: what the masks
// compare, copied once per layout.
struct PositionTags {
  torch::Tensor sample, item;
  explicit PositionTags(const LlmLayout& l) {
    const auto on = [](const std::vector<int32_t>& v) {
      return upload(torch::tensor(at::ArrayRef<int32_t>(v), torch::kInt32));
    };
    sample = on(l.sample);
    item = on(l.item);
  }
};

// The mask of query positions `q` against key positions `k`, broadcast against each other.
torch::Tensor mask_between(const PositionTags& tags, const torch::Tensor& q,
                           const torch::Tensor& k) {
  const torch::Tensor item_q = tags.item.take(q);
  const torch::Tensor allowed = (tags.sample.take(q) == tags.sample.take(k)) &
                                torch::where(item_q < 0, k <= q, tags.item.take(k) == item_q);
  return torch::zeros(allowed.sizes(), activation_options())
      .masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
}

}  // namespace

torch::Tensor attention_bias(const LlmLayout& l, const std::vector<int64_t>& queries,
                             const std::vector<int64_t>& keys) {
  const auto on = [](const std::vector<int64_t>& v) {
    return upload(torch::tensor(v, torch::kInt64));
  };
  return mask_between(PositionTags(l), on(queries).view({-1, 1}), on(keys).view({1, -1}));
}

namespace {

// The spans of the sample at [begin, end): runs of text and media items in order; empty when a
// media item's tokens are not contiguous (then only a mask can say who attends to whom).
std::vector<AttentionSpan> sample_spans(const LlmLayout& l, int64_t begin, int64_t end) {
  std::vector<AttentionSpan> spans;
  std::set<int32_t> seen;
  for (int64_t t = begin; t < end;) {
    const int32_t item = l.item[static_cast<std::size_t>(t)];
    int64_t next = t + 1;
    while (next < end && l.item[static_cast<std::size_t>(next)] == item) ++next;
    if (item >= 0 && !seen.insert(item).second) return {};
    spans.push_back({t - begin, next - t, item >= 0});
    t = next;
  }
  return spans;
}

bool same_spans(const std::vector<AttentionSpan>& a, const std::vector<AttentionSpan>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const AttentionSpan& x, const AttentionSpan& y) {
                      return x.offset == y.offset && x.length == y.length && x.media == y.media;
                    });
}

}  // namespace

std::vector<AttentionBlocks> attention_blocks(const LlmLayout& l) {
  // TESSERA_MASKED_ATTENTION=1: every block under its mask (to measure what the spans gain).
  static const bool masked = [] {
    const char* v = std::getenv("TESSERA_MASKED_ATTENTION");
    return v != nullptr && std::string(v) == "1";
  }();
  std::vector<AttentionBlocks> runs;
  const auto n = static_cast<int64_t>(l.sample.size());
  for (int64_t begin = 0; begin < n;) {
    int64_t end = begin;
    while (end < n &&
           l.sample[static_cast<std::size_t>(end)] == l.sample[static_cast<std::size_t>(begin)])
      ++end;
    const int64_t length = end - begin;
    std::vector<AttentionSpan> spans =
        masked ? std::vector<AttentionSpan>{} : sample_spans(l, begin, end);
    if (!runs.empty() && runs.back().length == length &&
        runs.back().begin + runs.back().count * length == begin &&
        same_spans(runs.back().spans, spans))
      ++runs.back().count;
    else
      runs.push_back({begin, length, 1, std::move(spans), {}});
    begin = end;
  }
  std::optional<PositionTags> tags;
  for (AttentionBlocks& run : runs) {
    if (!run.spans.empty()) continue;
    if (!tags) tags.emplace(l);
    const torch::Tensor at =
        torch::arange(run.begin, run.begin + run.count * run.length,
                      torch::TensorOptions().dtype(torch::kInt64).device(device_setting().device))
            .view({run.count, 1, run.length});
    run.bias = mask_between(*tags, at.unsqueeze(3), at.unsqueeze(2));
  }
  return runs;
}

// The pieces of the listed items (item -1: every item of the sample), in order.
torch::Tensor media_item_pieces(const ModelSpec& model, const ModuleSpec& encoder,
                                const TrainBatch& batch, const std::vector<MediaPiece>& items) {
  const Patching& p = *encoder.patching;
  const bool images = encoder_for(model, Modality::kImage) == &encoder;
  const bool videos = encoder_for(model, Modality::kVideo) == &encoder;
  std::vector<torch::Tensor> pieces;
  for (const MediaPiece& wanted : items) {
    const SampleData& d = batch.data[static_cast<std::size_t>(wanted.sample)];
    int32_t item = 0;  // media_items()' numbering: images, then videos
    auto take = [&] { return wanted.item < 0 || wanted.item == item++; };
    if (images)
      for (const torch::Tensor& img : d.images)
        if (take()) pieces.push_back(temporal_pieces(img.unsqueeze(0), p.temporal_patch).front());
    if (videos)
      for (const torch::Tensor& clip : d.videos)
        if (take())
          for (torch::Tensor& piece : temporal_pieces(clip, p.temporal_patch))
            pieces.push_back(std::move(piece));
  }
  if (pieces.empty())
    return torch::zeros({0, p.in_channels * p.temporal_patch, p.image_size, p.image_size});
  return torch::stack(pieces);
}

torch::Tensor micro_batch_pieces(const ModelSpec& model, const ModuleSpec& encoder,
                                 const TrainBatch& batch, const std::vector<int32_t>& samples) {
  std::vector<MediaPiece> items;
  for (int32_t s : samples) items.push_back({s, -1});
  return media_item_pieces(model, encoder, batch, items);
}

std::vector<torch::Tensor> media_item_audio(const TrainBatch& batch,
                                            const std::vector<MediaPiece>& items) {
  std::vector<torch::Tensor> windows;
  for (const MediaPiece& wanted : items) {
    const auto& clips = batch.data[static_cast<std::size_t>(wanted.sample)].audio;
    for (std::size_t c = 0; c < clips.size(); ++c)
      if (wanted.item < 0 || wanted.item == static_cast<int32_t>(c))
        windows.insert(windows.end(), clips[c].begin(), clips[c].end());
  }
  return windows;
}

std::vector<torch::Tensor> micro_batch_audio(const TrainBatch& batch,
                                             const std::vector<int32_t>& samples) {
  std::vector<MediaPiece> items;
  for (int32_t s : samples) items.push_back({s, -1});
  return media_item_audio(batch, items);
}

}  // namespace tessera::exec

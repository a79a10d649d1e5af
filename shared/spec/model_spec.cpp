#include "shared/spec/model_spec.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "shared/base/check.hpp"

namespace tessera {

bool moe_layer(const TransformerArch& a, int64_t layer) {
  if (a.experts == 0 || layer < a.dense_layers) return false;
  return layer >= a.layers || (layer - a.dense_layers + 1) % a.moe_every == 0;
}

int64_t moe_layers(const TransformerArch& a, int64_t first, int64_t end) {
  if (a.experts == 0) return 0;
  // MoE layers of the stack in [0, n): every moe_every-th of those past the dense ones.
  auto below = [&](int64_t n) {
    return std::max<int64_t>(0, std::min(n, a.layers) - a.dense_layers) / a.moe_every;
  };
  return std::max<int64_t>(0, below(end) - below(first)) + mtp_layers_in(a, first, end);
}

const EnumTable<ModuleRole> kModuleRoles = {{"encoder", ModuleRole::kEncoder},
                                            {"projector", ModuleRole::kProjector},
                                            {"llm", ModuleRole::kLlm},
                                            {"generator", ModuleRole::kGenerator}};
const EnumTable<Modality> kModalities = {{"image", Modality::kImage},
                                         {"audio", Modality::kAudio},
                                         {"video", Modality::kVideo},
                                         {"text", Modality::kText}};
const EnumTable<DType> kDTypes = {
    {"bf16", DType::kBf16}, {"fp16", DType::kFp16}, {"fp32", DType::kFp32}, {"fp8", DType::kFp8}};

namespace {

const EnumTable<NormKind> kNorms = {{"rmsnorm", NormKind::kRmsNorm},
                                    {"layernorm", NormKind::kLayerNorm}};
const EnumTable<ResizeMode> kResizeModes = {{"fixed", ResizeMode::kFixed},
                                            {"dynamic", ResizeMode::kDynamic},
                                            {"tiles", ResizeMode::kTiles}};

// Limits of the architecture integers: several times today's largest models, and small enough
// that parameter counts and FLOPs, products of them summed over up to kMaxModules modules, stay
// inside int64 (docs/FORMATS.md).
constexpr int64_t kMaxLayers = 1024, kMaxHeads = 4096, kMaxHidden = int64_t{1} << 17,
                  kMaxFfn = int64_t{1} << 18, kMaxVocab = int64_t{1} << 22, kMaxExperts = 512,
                  kMaxPositions = int64_t{1} << 24, kMaxPatch = 1024, kMaxSide = int64_t{1} << 16,
                  kMaxPixels = int64_t{1} << 32, kMaxAudio = 4096;
constexpr std::size_t kMaxModules = 64;

bool at_most(ObjectReader& r, std::string_view key, int64_t value, int64_t limit) {
  if (value <= limit) return true;
  r.error(key, std::to_string(value) + " is over the limit of " + std::to_string(limit));
  return false;
}

// Reads an integer that must be in 1..limit when present.
bool positive(ObjectReader& r, std::string_view key, int64_t& out, bool required, int64_t limit) {
  const bool present = required ? r.required(key, out) : r.optional(key, out);
  return present && r.check_positive(key, out) && at_most(r, key, out, limit);
}

// An optional count: 0 or more, at most `limit`.
bool count(ObjectReader& r, std::string_view key, int64_t& out, int64_t limit) {
  return r.optional(key, out) && r.check_at_least<int64_t>(key, out, 0) &&
         at_most(r, key, out, limit);
}

TransformerArch read_transformer(ObjectReader& r) {
  TransformerArch a;
  positive(r, "layers", a.layers, true, kMaxLayers);
  positive(r, "hidden", a.hidden, true, kMaxHidden);
  positive(r, "heads", a.heads, true, kMaxHeads);
  positive(r, "kv_heads", a.kv_heads, false, kMaxHeads);
  positive(r, "head_dim", a.head_dim, false, kMaxHeads);
  positive(r, "kv_lora_rank", a.kv_lora_rank, false, kMaxHidden);
  positive(r, "q_lora_rank", a.q_lora_rank, false, kMaxHidden);
  positive(r, "rope_head_dim", a.rope_head_dim, false, kMaxHeads);
  positive(r, "v_head_dim", a.v_head_dim, false, kMaxHeads);
  r.optional("router_bias", a.router_bias);
  positive(r, "router_groups", a.router_groups, false, kMaxExperts);
  positive(r, "router_group_top_k", a.router_group_top_k, false, kMaxExperts);
  positive(r, "ffn", a.ffn, true, kMaxFfn);
  r.optional("gated_ffn", a.gated_ffn);
  count(r, "vocab", a.vocab, kMaxVocab);
  r.optional("tied_embeddings", a.tied_embeddings);
  r.optional("linear_bias", a.linear_bias);
  r.optional("qkv_bias", a.qkv_bias);
  r.optional("key_bias", a.key_bias);
  r.optional("mlp_bias", a.mlp_bias);
  r.optional("out_bias", a.out_bias);
  r.optional_enum("norm", a.norm, kNorms);
  r.optional("qk_norm", a.qk_norm);
  r.optional("post_norms", a.post_norms);
  r.optional("layer_scale", a.layer_scale);
  r.optional("final_norm", a.final_norm);
  count(r, "experts", a.experts, kMaxExperts);
  count(r, "top_k", a.top_k, kMaxExperts);
  positive(r, "moe_ffn", a.moe_ffn, false, kMaxFfn);
  count(r, "mtp_layers", a.mtp_layers, kMaxLayers);
  positive(r, "shared_expert_ffn", a.shared_expert_ffn, false, kMaxFfn);
  if (r.optional("capacity_factor", a.capacity_factor) &&
      (!(a.capacity_factor == 0 || a.capacity_factor >= 1) || a.capacity_factor > 1024))
    r.error("capacity_factor",
            "must be 0 (dropless) or in [1, 1024], got " + std::to_string(a.capacity_factor));
  count(r, "dense_layers", a.dense_layers, kMaxLayers);
  positive(r, "moe_every", a.moe_every, false, kMaxLayers);
  count(r, "cross_attention_layers", a.cross_attention_layers, kMaxLayers);
  count(r, "gated_layers", a.gated_layers, kMaxLayers);
  count(r, "extra_embeddings", a.extra_embeddings, kMaxVocab);
  count(r, "positions", a.positions, kMaxPositions);

  // Semantic checks that need several fields.
  if (a.kv_heads == 0) a.kv_heads = a.heads;
  if (a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads != 0)
    r.error("kv_heads",
            std::to_string(a.kv_heads) + " does not divide heads=" + std::to_string(a.heads));
  if (a.head_dim == 0 && a.heads > 0 && a.hidden > 0) {
    if (a.hidden % a.heads != 0)
      r.error("heads", std::to_string(a.heads) + " does not divide hidden=" +
                           std::to_string(a.hidden) + "; give head_dim explicitly");
    a.head_dim = a.hidden / a.heads;
  }
  if (a.v_head_dim == 0) a.v_head_dim = a.head_dim;
  if (a.kv_lora_rank > 0) {
    if (a.kv_heads != a.heads)
      r.error("kv_heads", "multi-head latent attention has as many key/value heads as heads");
    if (a.rope_head_dim % 2 != 0)
      r.error("rope_head_dim",
              std::to_string(a.rope_head_dim) + " is odd: rotary embeddings turn pairs of values");
    else if (a.rope_head_dim >= a.head_dim)
      r.error("rope_head_dim",
              std::to_string(a.rope_head_dim) +
                  " leaves no non-rotary part of head_dim=" + std::to_string(a.head_dim));
    if (a.linear_bias || a.qkv_bias || a.qk_norm)
      r.error("kv_lora_rank",
              "multi-head latent attention with attention biases or query/key norms is not in "
              "the IR");
  } else {
    for (const auto& [key, value] :
         {std::pair{"q_lora_rank", a.q_lora_rank}, std::pair{"rope_head_dim", a.rope_head_dim}})
      if (value != 0) r.error(key, "given without kv_lora_rank (multi-head latent attention)");
    if (a.v_head_dim != a.head_dim)
      r.error("v_head_dim", "differs from head_dim without kv_lora_rank");
  }
  if (a.mtp_layers > 0 && a.vocab == 0)
    r.error("mtp_layers", "given without vocab (a multi-token-prediction layer predicts tokens)");
  if (a.router_bias && a.experts == 0) r.error("router_bias", "given without experts");
  if ((a.router_groups > 0) != (a.router_group_top_k > 0)) {
    r.error(a.router_groups > 0 ? "router_group_top_k" : "router_groups",
            "router_groups and router_group_top_k are given together");
  } else if (a.router_groups > 0) {
    if (a.experts == 0)
      r.error("router_groups", "given without experts");
    else if (a.experts % a.router_groups != 0)
      r.error("router_groups", std::to_string(a.router_groups) +
                                   " does not divide experts=" + std::to_string(a.experts));
    else if (a.router_group_top_k > a.router_groups)
      r.error("router_group_top_k",
              std::to_string(a.router_group_top_k) +
                  " is more than router_groups=" + std::to_string(a.router_groups));
    else if (a.router_group_top_k * (a.experts / a.router_groups) < a.top_k)
      r.error("router_group_top_k",
              std::to_string(a.router_group_top_k) + " groups of " +
                  std::to_string(a.experts / a.router_groups) +
                  " experts hold fewer than top_k=" + std::to_string(a.top_k));
  }
  if (a.experts > 0) {
    if (a.top_k < 1 || a.top_k > a.experts)
      r.error("top_k", "must be in [1, experts=" + std::to_string(a.experts) + "], got " +
                           std::to_string(a.top_k));
    if (a.moe_ffn == 0) a.moe_ffn = a.ffn;
    if (a.dense_layers >= a.layers && a.layers > 0)
      r.error("dense_layers",
              std::to_string(a.dense_layers) +
                  " leaves no layer with experts of layers=" + std::to_string(a.layers));
    else if (a.moe_every > a.layers - a.dense_layers && a.layers > 0)
      r.error("moe_every", std::to_string(a.moe_every) + " leaves no layer with experts after " +
                               std::to_string(a.dense_layers) +
                               " dense of layers=" + std::to_string(a.layers));
  } else {
    if (a.top_k != 0) r.error("top_k", "given without experts");
    if (a.shared_expert_ffn != 0) r.error("shared_expert_ffn", "given without experts");
    if (a.capacity_factor != 0) r.error("capacity_factor", "given without experts");
    if (a.dense_layers != 0) r.error("dense_layers", "given without experts");
    if (a.moe_every != 1) r.error("moe_every", "given without experts");
  }
  if (a.cross_attention_layers > a.layers)
    r.error("cross_attention_layers", "exceeds layers=" + std::to_string(a.layers));
  if (a.gated_layers > a.layers)
    r.error("gated_layers", "exceeds layers=" + std::to_string(a.layers));
  if (a.extra_embeddings > 0 && a.vocab == 0) r.error("extra_embeddings", "given without a vocab");
  r.finish();
  return a;
}

Patching read_patching(ObjectReader& r) {
  Patching p;
  positive(r, "patch_size", p.patch_size, false, kMaxPatch);
  positive(r, "in_channels", p.in_channels, false, kMaxPatch);
  positive(r, "spatial_merge", p.spatial_merge, false, kMaxPatch);
  positive(r, "temporal_patch", p.temporal_patch, false, kMaxPatch);
  positive(r, "video_pool", p.video_pool, false, kMaxPatch);
  r.optional("merge_padding", p.merge_padding);
  r.optional("class_token", p.class_token);
  r.optional("conv_bias", p.conv_bias);
  r.optional("pre_norm", p.pre_norm);
  r.required_enum("resize", p.resize, kResizeModes);
  count(r, "aspect_ratios", p.aspect_ratios, kMaxHeads);
  switch (p.resize) {
    case ResizeMode::kFixed:
      // Not necessarily a multiple of patch_size: the patch convolution floors (SigLIP 384/14).
      if (positive(r, "image_size", p.image_size, true, kMaxSide) && p.image_size < p.patch_size)
        r.error("image_size", "smaller than patch_size=" + std::to_string(p.patch_size));
      break;
    case ResizeMode::kDynamic:
      positive(r, "min_pixels", p.min_pixels, true, kMaxPixels);
      positive(r, "max_pixels", p.max_pixels, true, kMaxPixels);
      if (p.max_pixels < p.min_pixels) r.error("max_pixels", "must be >= min_pixels");
      if (p.video_pool != 1)
        r.error("video_pool", "pools square frames: needs resize fixed or tiles, not dynamic");
      break;
    case ResizeMode::kTiles:
      if (positive(r, "tile_size", p.tile_size, true, kMaxSide) && p.tile_size < p.patch_size)
        r.error("tile_size", "smaller than patch_size=" + std::to_string(p.patch_size));
      positive(r, "max_tiles", p.max_tiles, true, kMaxHeads);
      r.optional("thumbnail", p.thumbnail);
      break;
  }
  // Fields of the other resize modes get a targeted message instead of "unknown key".
  const std::string mode = enum_name(p.resize, kResizeModes);
  for (const char* key : {"image_size", "min_pixels", "max_pixels", "tile_size", "max_tiles",
                          "thumbnail", "aspect_ratios"}) {
    const bool used =
        (p.resize == ResizeMode::kFixed && key == std::string_view("image_size")) ||
        (p.resize == ResizeMode::kDynamic && std::string_view(key).ends_with("_pixels")) ||
        (p.resize == ResizeMode::kTiles &&
         (std::string_view(key).starts_with("tile") || key == std::string_view("max_tiles") ||
          key == std::string_view("thumbnail") || key == std::string_view("aspect_ratios")));
    if (!used && r.has(key)) r.error(key, "not used with resize=" + mode);
  }
  const int64_t side = p.resize == ResizeMode::kFixed ? p.image_size : p.tile_size;
  if (side > 0 && p.patch_size > 0 && p.spatial_merge > 0 && !p.merge_padding &&
      (side / p.patch_size) % p.spatial_merge != 0)
    r.error("spatial_merge", std::to_string(p.spatial_merge) + " does not divide the patch grid " +
                                 std::to_string(side / p.patch_size));
  r.finish();
  return p;
}

AudioFrontEnd read_audio(ObjectReader& r) {
  AudioFrontEnd a;
  positive(r, "mel_bins", a.mel_bins, false, kMaxAudio);
  positive(r, "frames_per_second", a.frames_per_second, false, kMaxAudio);
  positive(r, "downsampling", a.downsampling, false, kMaxAudio);
  positive(r, "pooling", a.pooling, false, kMaxAudio);
  if (r.optional("max_seconds", a.max_seconds) && r.check_positive("max_seconds", a.max_seconds) &&
      a.max_seconds > 86400)
    r.error("max_seconds", "is over the limit of 86400");
  r.optional("pad_to_max", a.pad_to_max);
  r.finish();
  return a;
}

ProjectorArch read_projector(ObjectReader& r) {
  ProjectorArch p;
  positive(r, "in", p.in, true, kMaxHidden * 8);
  positive(r, "hidden", p.hidden, false, kMaxHidden * 8);
  positive(r, "out", p.out, true, kMaxHidden);
  if (r.optional("layers", p.layers) && (p.layers < 1 || p.layers > 8))
    r.error("layers", "must be in [1, 8], got " + std::to_string(p.layers));
  r.optional("bias", p.bias);
  r.optional("input_norm", p.input_norm);
  positive(r, "input_norm_width", p.input_norm_width, false, kMaxHidden);
  r.optional_enum("norm", p.norm, kNorms);
  count(r, "separators", p.separators, kMaxLayers);
  count(r, "deepstack", p.deepstack, kMaxLayers);
  count(r, "output_embeddings", p.output_embeddings, kMaxLayers);
  if (positive(r, "merger", p.merger, false, kMaxHidden * 8) && p.in > 0 && p.merger >= p.in)
    r.error("merger", "must be below in=" + std::to_string(p.in) + ": it merges down");
  if (positive(r, "queries", p.queries, false, kMaxHidden)) {
    positive(r, "query_heads", p.query_heads, false, kMaxHeads);
    if (p.query_heads == 0) p.query_heads = std::max<int64_t>(1, p.out / 128);
    if (p.out > 0 && p.out % p.query_heads != 0)
      r.error("query_heads",
              std::to_string(p.query_heads) + " does not divide out=" + std::to_string(p.out));
    r.optional("query_positions", p.query_positions);
    if (p.merger > 0) r.error("merger", "a resampler (queries) takes the encoder's tokens whole");
    if (p.deepstack > 0)
      r.error("deepstack", "a resampler (queries) takes the encoder's last layer only");
  } else {
    for (const char* key : {"query_heads", "query_positions"})
      if (r.has(key)) r.error(key, "needs queries > 0 (a resampler)");
  }
  if (p.hidden == 0) p.hidden = p.out;
  r.finish();
  return p;
}

ModuleSpec read_module(const Json& json, const std::string& file, const std::string& path,
                       Diagnostics& diag) {
  ModuleSpec m;
  ObjectReader r(json, file, path, diag);
  if (r.required("name", m.name) && m.name.empty()) r.error("name", "must not be empty");
  r.required_enum("role", m.role, kModuleRoles);
  if (!r.optional_enum("modality", m.modality, kModalities)) {
    m.modality = Modality::kText;
  }
  r.optional("inputs", m.inputs);
  r.optional("frozen", m.frozen);
  if (const Json* j = r.find("transformer")) {
    ObjectReader sub(*j, file, r.path_of("transformer"), diag);
    if (sub.valid()) m.transformer = read_transformer(sub);
  }
  if (const Json* j = r.find("patching")) {
    ObjectReader sub(*j, file, r.path_of("patching"), diag);
    if (sub.valid()) m.patching = read_patching(sub);
  }
  if (const Json* j = r.find("audio")) {
    ObjectReader sub(*j, file, r.path_of("audio"), diag);
    if (sub.valid()) m.audio = read_audio(sub);
  }
  if (const Json* j = r.find("projector")) {
    ObjectReader sub(*j, file, r.path_of("projector"), diag);
    if (sub.valid()) m.projector = read_projector(sub);
  }
  r.finish();
  return m;
}

Json to_json(const TransformerArch& a) {
  Json j;
  j["layers"] = a.layers;
  j["hidden"] = a.hidden;
  j["heads"] = a.heads;
  j["kv_heads"] = a.kv_heads;
  j["head_dim"] = a.head_dim;
  if (a.kv_lora_rank > 0) {
    j["kv_lora_rank"] = a.kv_lora_rank;
    if (a.q_lora_rank > 0) j["q_lora_rank"] = a.q_lora_rank;
    j["rope_head_dim"] = a.rope_head_dim;
    j["v_head_dim"] = a.v_head_dim;
  }
  j["ffn"] = a.ffn;
  j["gated_ffn"] = a.gated_ffn;
  j["vocab"] = a.vocab;
  j["tied_embeddings"] = a.tied_embeddings;
  j["linear_bias"] = a.linear_bias;
  j["qkv_bias"] = a.qkv_bias;
  if (!a.key_bias) j["key_bias"] = false;
  if (a.mlp_bias) j["mlp_bias"] = true;
  if (a.out_bias) j["out_bias"] = true;
  j["norm"] = enum_name(a.norm, kNorms);
  if (a.qk_norm) j["qk_norm"] = true;
  if (a.post_norms) j["post_norms"] = true;
  if (a.layer_scale) j["layer_scale"] = true;
  if (!a.final_norm) j["final_norm"] = false;
  if (a.experts > 0) {
    j["experts"] = a.experts;
    j["top_k"] = a.top_k;
    j["moe_ffn"] = a.moe_ffn;
    if (a.shared_expert_ffn > 0) j["shared_expert_ffn"] = a.shared_expert_ffn;
    if (a.capacity_factor > 0) j["capacity_factor"] = a.capacity_factor;
    if (a.dense_layers > 0) j["dense_layers"] = a.dense_layers;
    if (a.router_bias) j["router_bias"] = true;
    if (a.router_groups > 0) {
      j["router_groups"] = a.router_groups;
      j["router_group_top_k"] = a.router_group_top_k;
    }
    if (a.moe_every > 1) j["moe_every"] = a.moe_every;
  }
  if (a.mtp_layers > 0) j["mtp_layers"] = a.mtp_layers;
  if (a.cross_attention_layers > 0) j["cross_attention_layers"] = a.cross_attention_layers;
  if (a.gated_layers > 0) j["gated_layers"] = a.gated_layers;
  if (a.extra_embeddings > 0) j["extra_embeddings"] = a.extra_embeddings;
  if (a.positions > 0) j["positions"] = a.positions;
  return j;
}

Json to_json(const Patching& p) {
  Json j;
  j["patch_size"] = p.patch_size;
  j["in_channels"] = p.in_channels;
  j["spatial_merge"] = p.spatial_merge;
  if (p.merge_padding) j["merge_padding"] = true;
  j["temporal_patch"] = p.temporal_patch;
  if (p.video_pool != 1) j["video_pool"] = p.video_pool;
  j["class_token"] = p.class_token;
  if (!p.conv_bias) j["conv_bias"] = false;
  if (p.pre_norm) j["pre_norm"] = true;
  j["resize"] = enum_name(p.resize, kResizeModes);
  switch (p.resize) {
    case ResizeMode::kFixed:
      j["image_size"] = p.image_size;
      break;
    case ResizeMode::kDynamic:
      j["min_pixels"] = p.min_pixels;
      j["max_pixels"] = p.max_pixels;
      break;
    case ResizeMode::kTiles:
      j["tile_size"] = p.tile_size;
      j["max_tiles"] = p.max_tiles;
      j["thumbnail"] = p.thumbnail;
      if (p.aspect_ratios > 0) j["aspect_ratios"] = p.aspect_ratios;
      break;
  }
  return j;
}

Json to_json(const AudioFrontEnd& a) {
  return Json{{"mel_bins", a.mel_bins},         {"frames_per_second", a.frames_per_second},
              {"downsampling", a.downsampling}, {"pooling", a.pooling},
              {"max_seconds", a.max_seconds},   {"pad_to_max", a.pad_to_max}};
}

Json to_json(const ProjectorArch& p) {
  Json j{{"in", p.in},         {"hidden", p.hidden}, {"out", p.out},
         {"layers", p.layers}, {"bias", p.bias},     {"input_norm", p.input_norm}};
  if (p.input_norm && p.norm != NormKind::kLayerNorm) j["norm"] = enum_name(p.norm, kNorms);
  if (p.input_norm_width > 0) j["input_norm_width"] = p.input_norm_width;
  if (p.merger > 0) j["merger"] = p.merger;
  if (p.separators > 0) j["separators"] = p.separators;
  if (p.output_embeddings > 0) j["output_embeddings"] = p.output_embeddings;
  if (p.deepstack > 0) j["deepstack"] = p.deepstack;
  if (p.queries > 0) {
    j["queries"] = p.queries;
    j["query_heads"] = p.query_heads;
    if (p.query_positions) j["query_positions"] = true;
  }
  return j;
}

}  // namespace

int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
    case DType::kFp16:
      return 2;
    case DType::kFp32:
      return 4;
    case DType::kFp8:
      return 1;
  }
  return 2;
}

ModelSpec read_model(const Json& json, const std::string& file, const std::string& path,
                     Diagnostics& diag) {
  ModelSpec model;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return model;
  r.required("name", model.name);
  r.optional_enum("dtype", model.dtype, kDTypes);
  if (const Json* modules = r.find("modules")) {
    if (!modules->is_array() || modules->empty()) {
      r.error("modules", "expected a non-empty array of modules");
    } else if (modules->size() > kMaxModules) {
      r.error("modules", std::to_string(modules->size()) + " modules; at most " +
                             std::to_string(kMaxModules) + " are taken");
    } else {
      for (std::size_t i = 0; i < modules->size(); ++i)
        model.modules.push_back(
            read_module((*modules)[i], file, index_path(r.path_of("modules"), i), diag));
    }
  } else {
    r.missing("modules");
  }
  if (const Json* ref = r.find("reference")) {
    ObjectReader sub(*ref, file, r.path_of("reference"), diag);
    ReferenceSize size;
    if (sub.required("params", size.params)) sub.check_positive("params", size.params);
    sub.optional("source", size.source);
    sub.finish();
    model.reference = size;
  }
  r.finish();
  validate_model(model, file, path, diag);
  return model;
}

Json to_json(const ModelSpec& model) {
  Json j;
  j["name"] = model.name;
  j["dtype"] = enum_name(model.dtype, kDTypes);
  Json modules = Json::array();
  for (const ModuleSpec& m : model.modules) {
    Json jm;
    jm["name"] = m.name;
    jm["role"] = enum_name(m.role, kModuleRoles);
    jm["modality"] = enum_name(m.modality, kModalities);
    jm["inputs"] = m.inputs;
    jm["frozen"] = m.frozen;
    if (m.transformer) jm["transformer"] = to_json(*m.transformer);
    if (m.patching) jm["patching"] = to_json(*m.patching);
    if (m.audio) jm["audio"] = to_json(*m.audio);
    if (m.projector) jm["projector"] = to_json(*m.projector);
    modules.push_back(jm);
  }
  j["modules"] = modules;
  if (model.reference)
    j["reference"] = Json{{"params", model.reference->params}, {"source", model.reference->source}};
  return j;
}

void validate_model(const ModelSpec& model, const std::string& file, const std::string& path,
                    Diagnostics& diag) {
  std::map<std::string, std::size_t> index;
  auto module_path = [&](std::size_t i, std::string_view key = {}) {
    const std::string base = index_path(join_path(path, "modules"), i);
    return key.empty() ? base : join_path(base, key);
  };
  int llms = 0;
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const ModuleSpec& m = model.modules[i];
    if (m.name.empty()) continue;  // already reported
    if (!index.emplace(m.name, i).second)
      diag.error(file, module_path(i, "name"), "duplicate module name '" + m.name + "'");
    if (m.role == ModuleRole::kLlm) ++llms;
  }
  if (llms > 1) diag.error(file, join_path(path, "modules"), "more than one module has role llm");

  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const ModuleSpec& m = model.modules[i];
    const std::string role = enum_name(m.role, kModuleRoles);
    for (std::size_t k = 0; k < m.inputs.size(); ++k) {
      const std::string& in = m.inputs[k];
      if (in == m.name) {
        diag.error(file, index_path(module_path(i, "inputs"), k), "module lists itself as input");
      } else if (!index.contains(in)) {
        std::vector<std::string> names;
        for (const auto& entry : index) names.push_back(entry.first);
        std::string message = "unknown module '" + in + "'";
        const std::string guess = closest_match(in, names);
        if (!guess.empty()) message += " (did you mean '" + guess + "'?)";
        diag.error(file, index_path(module_path(i, "inputs"), k), message);
      }
    }
    switch (m.role) {
      case ModuleRole::kEncoder:
        if (!m.transformer) diag.error(file, module_path(i), "an encoder needs a transformer");
        if (!m.inputs.empty())
          diag.error(file, module_path(i, "inputs"), "an encoder takes raw media, not modules");
        if (m.modality == Modality::kText)
          diag.error(file, module_path(i, "modality"), "an encoder needs image, audio or video");
        if ((m.modality == Modality::kImage || m.modality == Modality::kVideo) && !m.patching)
          diag.error(file, module_path(i), "an image/video encoder needs patching");
        if (m.modality == Modality::kAudio && !m.audio)
          diag.error(file, module_path(i), "an audio encoder needs an audio front end");
        break;
      case ModuleRole::kProjector:
        if (!m.projector && !m.transformer)
          diag.error(file, module_path(i), "a projector needs a projector MLP or a transformer");
        if (m.inputs.empty())
          diag.error(file, module_path(i, "inputs"), "a projector needs an input module");
        break;
      case ModuleRole::kLlm:
      case ModuleRole::kGenerator:
        if (!m.transformer) {
          diag.error(file, module_path(i), "an " + role + " needs a transformer");
        } else if (m.role == ModuleRole::kLlm && m.transformer->vocab <= 0) {
          diag.error(file, module_path(i, "transformer.vocab"), "an llm needs vocab > 0");
        }
        break;
    }
    if (m.patching && m.role != ModuleRole::kEncoder)
      diag.error(file, module_path(i, "patching"), "only encoders have patching");
    if (m.audio && m.role != ModuleRole::kEncoder)
      diag.error(file, module_path(i, "audio"), "only encoders have an audio front end");
    if (m.projector && m.role != ModuleRole::kProjector)
      diag.error(file, module_path(i, "projector"), "only projectors have a projector MLP");

    // Shapes must chain: a projector reads (a multiple of) its producer's width, since merged
    // or concatenated features are allowed, and writes its consumer's width.
    if (m.projector && m.projector->queries > 0) {
      // It resamples each piece of one encoder's media.
      const auto it = m.inputs.size() == 1 ? index.find(m.inputs.front()) : index.end();
      if (it == index.end() || model.modules[it->second].role != ModuleRole::kEncoder)
        diag.error(file, module_path(i, "projector.queries"),
                   "a resampler takes the tokens of one encoder as its only input");
    }
    if (m.projector) {
      for (const std::string& in : m.inputs) {
        const auto it = index.find(in);
        if (it == index.end()) continue;
        const ModuleSpec& producer = model.modules[it->second];
        if (producer.transformer && producer.transformer->hidden > 0 &&
            m.projector->in % producer.transformer->hidden != 0)
          diag.error(file, module_path(i, "projector.in"),
                     std::to_string(m.projector->in) + " is not a multiple of " + in +
                         ".hidden=" + std::to_string(producer.transformer->hidden));
      }
    }
    for (const std::string& in : m.inputs) {
      const auto it = index.find(in);
      if (it == index.end()) continue;
      const ModuleSpec& producer = model.modules[it->second];
      if (producer.projector && m.transformer && producer.projector->out != m.transformer->hidden)
        diag.error(file, module_path(it->second, "projector.out"),
                   std::to_string(producer.projector->out) + " does not match " + m.name +
                       ".hidden=" + std::to_string(m.transformer->hidden));
    }
  }

  // Cycles: depth-first search with colours.
  std::vector<int> colour(model.modules.size(), 0);
  std::function<bool(std::size_t)> visit = [&](std::size_t i) {
    if (colour[i] == 1) return false;
    if (colour[i] == 2) return true;
    colour[i] = 1;
    for (const std::string& in : model.modules[i].inputs) {
      const auto it = index.find(in);
      if (it != index.end() && it->second != i && !visit(it->second)) return false;
    }
    colour[i] = 2;
    return true;
  };
  for (std::size_t i = 0; i < model.modules.size(); ++i)
    if (colour[i] == 0 && !visit(i)) {
      diag.error(file, join_path(path, "modules"),
                 "module inputs form a cycle through '" + model.modules[i].name + "'");
      break;
    }
}

const ModuleSpec* find_module(const ModelSpec& model, std::string_view name) {
  for (const ModuleSpec& m : model.modules)
    if (m.name == name) return &m;
  return nullptr;
}

const ModuleSpec* find_llm(const ModelSpec& model) {
  for (const ModuleSpec& m : model.modules)
    if (m.role == ModuleRole::kLlm) return &m;
  return nullptr;
}

const ModuleSpec* encoder_for(const ModelSpec& model, Modality modality) {
  for (const ModuleSpec& m : model.modules)
    if (m.role == ModuleRole::kEncoder && m.modality == modality) return &m;
  if (modality == Modality::kVideo) return encoder_for(model, Modality::kImage);
  return nullptr;
}

const ProjectorArch* resampler_of(const ModelSpec& model, const ModuleSpec& encoder) {
  for (const ModuleSpec& m : model.modules)
    if (m.projector && m.projector->queries > 0 && m.inputs.size() == 1 &&
        m.inputs.front() == encoder.name)
      return &*m.projector;
  return nullptr;
}

std::vector<const ModuleSpec*> topological_order(const ModelSpec& model) {
  std::vector<const ModuleSpec*> order;
  std::set<std::string> placed;
  while (order.size() < model.modules.size()) {
    const std::size_t before = order.size();
    for (const ModuleSpec& m : model.modules) {
      if (placed.contains(m.name)) continue;
      if (std::all_of(m.inputs.begin(), m.inputs.end(),
                      [&](const std::string& in) { return placed.contains(in); })) {
        order.push_back(&m);
        placed.insert(m.name);
      }
    }
    TESSERA_CHECK(order.size() > before, "module graph has a cycle; validate first");
  }
  return order;
}

}  // namespace tessera

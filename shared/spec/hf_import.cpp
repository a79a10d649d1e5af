#include "shared/spec/hf_import.hpp"

#include <cmath>
#include <filesystem>

namespace tessera {

namespace {

// Reads HF keys, which are many and mostly ignored (no unknown-key check), with defaults.
class HfReader {
 public:
  HfReader(const Json* json, std::string file, std::string path, Diagnostics& diag)
      : json_(json), file_(std::move(file)), path_(std::move(path)), diag_(&diag) {}

  bool has(std::string_view key) const {
    return json_ != nullptr && json_->contains(key) && !(*json_)[std::string(key)].is_null();
  }
  const Json* raw(std::string_view key) const {
    return has(key) ? &(*json_)[std::string(key)] : nullptr;
  }

  // An integer (or a [n, n] pair, as newer configs write image sizes) with a default.
  int64_t get(std::string_view key, int64_t fallback) const {
    const Json* v = raw(key);
    if (v == nullptr) return fallback;
    if (v->is_array() && !v->empty()) v = &(*v)[0];
    int64_t out = fallback;
    if (!read_value(*v, file_, join_path(path_, key), out, *diag_)) return fallback;
    // No config field comes near; derived sizes (a patch grid squared) would overflow int64.
    constexpr int64_t kLimit = int64_t{1} << 31;
    if (out > kLimit || out < -kLimit) {
      diag_->error(file_, join_path(path_, key),
                   std::to_string(out) + " is out of range (at most 2^31 in magnitude)");
      return fallback;
    }
    return out;
  }
  int64_t need(std::string_view key) const {
    if (!has(key)) {
      diag_->error(file_, join_path(path_, key), "required key is missing");
      return 0;
    }
    return get(key, 0);
  }
  double get_double(std::string_view key, double fallback) const {
    const Json* v = raw(key);
    double out = fallback;
    if (v != nullptr) read_value(*v, file_, join_path(path_, key), out, *diag_);
    return out;
  }
  bool get_bool(std::string_view key, bool fallback) const {
    const Json* v = raw(key);
    bool out = fallback;
    if (v != nullptr) read_value(*v, file_, join_path(path_, key), out, *diag_);
    return out;
  }
  std::string get_string(std::string_view key, std::string fallback) const {
    const Json* v = raw(key);
    std::string out = std::move(fallback);
    if (v != nullptr) read_value(*v, file_, join_path(path_, key), out, *diag_);
    return out;
  }
  // A nested config; absent gives a reader that answers defaults.
  HfReader sub(std::string_view key) const {
    const Json* v = raw(key);
    if (v != nullptr && !v->is_object()) {
      diag_->error(file_, join_path(path_, key), "expected an object, got " + json_type_name(*v));
      v = nullptr;
    }
    return HfReader(v, file_, join_path(path_, key), *diag_);
  }
  void error(std::string_view key, const std::string& message) const {
    diag_->error(file_, join_path(path_, key), message);
  }

 private:
  const Json* json_;
  std::string file_;
  std::string path_;
  Diagnostics* diag_;
};

// Decoder-only LLM defaults of HF's config classes, for sparse text_config blocks (llava-hf).
struct LlmDefaults {
  int64_t hidden, ffn, layers, heads, kv_heads, vocab;
  bool qkv_bias;
};
LlmDefaults llm_defaults(const std::string& model_type) {
  if (model_type == "mistral") return {4096, 14336, 32, 32, 8, 32000, false};
  if (model_type == "qwen2") return {4096, 22016, 32, 32, 32, 151936, true};
  if (model_type == "internlm2") return {4096, 11008, 32, 32, 32, 103168, false};
  return {4096, 11008, 32, 32, 32, 32000, false};  // llama (Vicuna, Llama 2)
}

ModuleSpec llm_module(const HfReader& r, const std::string& model_type) {
  const LlmDefaults d = llm_defaults(model_type);
  TransformerArch a;
  a.hidden = r.get("hidden_size", d.hidden);
  a.ffn = r.get("intermediate_size", d.ffn);
  a.layers = r.get("num_hidden_layers", d.layers);
  a.heads = r.get("num_attention_heads", d.heads);
  a.kv_heads = r.get("num_key_value_heads", a.heads == d.heads ? d.kv_heads : a.heads);
  a.head_dim = r.get("head_dim", a.heads > 0 ? a.hidden / a.heads : 0);
  a.vocab = r.get("vocab_size", d.vocab);
  a.gated_ffn = true;
  a.tied_embeddings = r.get_bool("tie_word_embeddings", false);
  a.qkv_bias = model_type == "qwen2" || model_type == "qwen2_vl" || model_type == "qwen2_5_vl" ||
               r.get_bool("attention_bias", false) || d.qkv_bias;
  a.norm = NormKind::kRmsNorm;
  if (r.has("num_local_experts") || r.has("num_experts")) {
    a.experts =
        r.has("num_local_experts") ? r.get("num_local_experts", 0) : r.get("num_experts", 0);
    a.top_k = r.get("num_experts_per_tok", 2);
    a.moe_ffn = r.get("moe_intermediate_size", a.ffn);
  }
  ModuleSpec m;
  m.name = "llm";
  m.role = ModuleRole::kLlm;
  m.modality = Modality::kText;
  m.transformer = a;
  return m;
}

// The bias-everywhere encoder stack shared by ViT, InternViT and Whisper towers.
TransformerArch encoder_arch(int64_t layers, int64_t hidden, int64_t heads, int64_t ffn,
                             NormKind norm) {
  TransformerArch a;
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.kv_heads = heads;
  a.head_dim = heads > 0 ? hidden / heads : 0;
  a.ffn = ffn;
  a.linear_bias = true;
  a.norm = norm;
  return a;
}

ModuleSpec encoder_module(const std::string& name, Modality modality, const TransformerArch& arch) {
  ModuleSpec m;
  m.name = name;
  m.role = ModuleRole::kEncoder;
  m.modality = modality;
  m.transformer = arch;
  return m;
}

// CLIP / SigLIP vision towers (fixed square input).
ModuleSpec vit_module(const HfReader& v, bool siglip) {
  TransformerArch a = encoder_arch(v.get("num_hidden_layers", 12), v.get("hidden_size", 768),
                                   v.get("num_attention_heads", 12),
                                   v.get("intermediate_size", 3072), NormKind::kLayerNorm);
  Patching p;
  p.patch_size = v.get("patch_size", siglip ? 16 : 32);
  p.in_channels = v.get("num_channels", 3);
  p.image_size = v.get("image_size", 224);
  p.resize = ResizeMode::kFixed;
  p.class_token = !siglip;
  // CLIP: a patch convolution without bias, and a norm (pre_layrnorm) before the first layer.
  p.conv_bias = siglip;
  p.pre_norm = !siglip;
  const int64_t grid = p.patch_size > 0 ? p.image_size / p.patch_size : 0;
  a.positions = grid * grid + (p.class_token ? 1 : 0);
  ModuleSpec m = encoder_module("vision", Modality::kImage, a);
  m.patching = p;
  return m;
}

ModuleSpec projector_module(const std::string& name, const std::string& input, int64_t in,
                            int64_t hidden, int64_t out, int64_t layers, bool input_norm) {
  ModuleSpec m;
  m.name = name;
  m.role = ModuleRole::kProjector;
  m.modality = Modality::kText;
  m.inputs = {input};
  ProjectorArch p;
  p.in = in;
  p.hidden = hidden;
  p.out = out;
  p.layers = layers;
  p.input_norm = input_norm;
  m.projector = p;
  return m;
}

ModelSpec vlm(ModuleSpec vision, ModuleSpec projector, ModuleSpec llm) {
  llm.inputs = {projector.name};
  ModelSpec model;
  model.modules = {std::move(vision), std::move(projector), std::move(llm)};
  return model;
}

ModelSpec import_qwen_vl(const HfReader& root, bool qwen25) {
  // Flat shape: LLM keys at top level. Newer exports nest them in text_config.
  const HfReader text = root.has("text_config") ? root.sub("text_config") : root;
  ModuleSpec llm = llm_module(text, qwen25 ? "qwen2_5_vl" : "qwen2_vl");
  const HfReader v = root.sub("vision_config");
  const int64_t layers = v.get("depth", 32);
  const int64_t heads = v.get("num_heads", 16);
  TransformerArch a;
  if (qwen25) {
    // Qwen2.5-VL: hidden_size is the encoder width, out_hidden_size the LLM width.
    a = encoder_arch(layers, v.get("hidden_size", 1280), heads, v.get("intermediate_size", 3420),
                     NormKind::kRmsNorm);
    a.gated_ffn = true;
  } else {
    // Qwen2-VL trap: vision_config.hidden_size is the LLM width; the encoder width is embed_dim.
    const int64_t width = v.get("embed_dim", 1280);
    const double ratio = v.get_double("mlp_ratio", 4.0);
    a = encoder_arch(layers, width, heads,
                     static_cast<int64_t>(std::llround(static_cast<double>(width) * ratio)),
                     NormKind::kLayerNorm);
  }
  Patching p;
  p.patch_size = v.get("patch_size", 14);
  p.in_channels = v.has("in_chans") ? v.get("in_chans", 3) : v.get("in_channels", 3);
  p.spatial_merge = v.get("spatial_merge_size", 2);
  p.temporal_patch = v.get("temporal_patch_size", 2);
  p.conv_bias = false;
  p.resize = ResizeMode::kDynamic;
  p.min_pixels = 56 * 56;  // preprocessor_config.json defaults
  p.max_pixels = 28 * 28 * 16384;
  ModuleSpec vision = encoder_module("vision", Modality::kImage, a);
  vision.patching = p;
  const int64_t out =
      qwen25 ? v.get("out_hidden_size", llm.transformer->hidden) : llm.transformer->hidden;
  if (out != llm.transformer->hidden)
    v.error(qwen25 ? "out_hidden_size" : "hidden_size",
            std::to_string(out) + " does not match the LLM hidden_size " +
                std::to_string(llm.transformer->hidden));
  // The merger's norm (ln_q) normalizes each encoder token before the merge: it is the encoder's
  // final norm, so the projector has none of its own.
  const int64_t merged = a.hidden * p.spatial_merge * p.spatial_merge;
  return vlm(vision, projector_module("vision_projector", "vision", merged, merged, out, 2, false),
             llm);
}

ModelSpec import_llava(const HfReader& root, bool next) {
  const HfReader text = root.sub("text_config");
  const HfReader v = root.sub("vision_config");
  ModuleSpec llm = llm_module(text, text.get_string("model_type", "llama"));
  const bool siglip = v.get_string("model_type", "clip_vision_model").starts_with("siglip");
  ModuleSpec vision = vit_module(v, siglip);
  if (next) {
    // LLaVA-NeXT "anyres": tiles of the base resolution from image_grid_pinpoints plus the
    // downscaled base image.
    Patching& p = *vision.patching;
    p.tile_size = p.image_size;
    p.resize = ResizeMode::kTiles;
    p.thumbnail = true;
    int64_t max_tiles = 4;
    if (const Json* pins = root.raw("image_grid_pinpoints"); pins != nullptr && pins->is_array()) {
      for (const Json& pin : *pins)
        if (pin.is_array() && pin.size() == 2 && pin[0].is_number_integer() &&
            pin[1].is_number_integer() && p.tile_size > 0)
          // In double: a pinpoint of absurd size must not overflow (validation refuses the count).
          max_tiles = static_cast<int64_t>(std::min(
              1e15, std::max<double>(
                        static_cast<double>(max_tiles),
                        std::floor(pin[0].get<double>() / static_cast<double>(p.tile_size)) *
                            std::floor(pin[1].get<double>() / static_cast<double>(p.tile_size)))));
    }
    p.max_tiles = max_tiles;
    p.image_size = 0;
  }
  const int64_t h = llm.transformer->hidden;
  return vlm(
      vision,
      projector_module("vision_projector", "vision", vision.transformer->hidden, h, h, 2, false),
      llm);
}

ModelSpec import_internvl(const HfReader& root, bool remote_code) {
  const HfReader text = root.sub(remote_code ? "llm_config" : "text_config");
  std::string llm_type = text.get_string("model_type", "qwen2");
  ModuleSpec llm = llm_module(text, llm_type);
  const HfReader v = root.sub("vision_config");
  TransformerArch a =
      encoder_arch(v.get("num_hidden_layers", 24), v.get("hidden_size", 1024),
                   v.get("num_attention_heads", 16), v.get("intermediate_size", 4096),
                   v.get_string("norm_type", "layer_norm") == "rms_norm" ? NormKind::kRmsNorm
                                                                         : NormKind::kLayerNorm);
  Patching p;
  p.patch_size = v.get("patch_size", 14);
  p.tile_size =
      root.has("force_image_size") ? root.get("force_image_size", 448) : v.get("image_size", 448);
  p.resize = ResizeMode::kTiles;
  p.max_tiles = root.get("max_dynamic_patch", 12);
  p.thumbnail = root.get_bool("use_thumbnail", true);
  p.class_token = true;
  const double ratio = root.get_double("downsample_ratio", 0.5);
  p.spatial_merge = ratio > 0 ? static_cast<int64_t>(std::llround(1.0 / ratio)) : 0;
  if (p.spatial_merge < 1) root.error("downsample_ratio", "must be in (0, 1]");
  const int64_t grid = p.patch_size > 0 ? p.tile_size / p.patch_size : 0;
  a.positions = grid * grid + 1;
  ModuleSpec vision = encoder_module("vision", Modality::kImage, a);
  vision.patching = p;
  const int64_t h = llm.transformer->hidden;
  const int64_t merged = a.hidden * p.spatial_merge * p.spatial_merge;
  return vlm(vision, projector_module("vision_projector", "vision", merged, h, h, 2, true), llm);
}

ModelSpec import_mllama(const HfReader& root) {
  const HfReader text = root.sub("text_config");
  ModuleSpec llm = llm_module(text, "llama");
  if (const Json* cross = text.raw("cross_attention_layers"); cross != nullptr) {
    if (cross->is_array())
      llm.transformer->cross_attention_layers = static_cast<int64_t>(cross->size());
    else
      text.error("cross_attention_layers", "expected an array of layer indices");
  }
  // The token embedding has 8 rows beyond vocab_size, for the image tokens (Hugging Face's
  // MllamaTextModel: vocab_size + 8).
  llm.transformer->extra_embeddings = 8;
  const HfReader v = root.sub("vision_config");
  // Mllama's vision tower: a local transformer plus a global one of the same width whose layers
  // are gated; its head count is `attention_heads`, not num_attention_heads. Its attention and
  // patch convolution have no biases; its MLP has.
  const int64_t global = v.get("num_global_layers", 8);
  TransformerArch a = encoder_arch(v.get("num_hidden_layers", 32) + global,
                                   v.get("hidden_size", 1280), v.get("attention_heads", 16),
                                   v.get("intermediate_size", 5120), NormKind::kLayerNorm);
  a.linear_bias = false;
  a.mlp_bias = true;
  a.gated_layers = global;
  Patching p;
  p.patch_size = v.get("patch_size", 14);
  p.tile_size = v.get("image_size", 560);
  p.max_tiles = v.get("max_num_tiles", 4);
  p.resize = ResizeMode::kTiles;
  p.class_token = true;
  p.pre_norm = true;
  // Tile arrangements: `supported_aspect_ratios`, by default every w x h tiles with w·h at most
  // max_num_tiles (8 for 4 tiles).
  if (const Json* ratios = v.raw("supported_aspect_ratios"); ratios != nullptr) {
    if (ratios->is_array())
      p.aspect_ratios = static_cast<int64_t>(ratios->size());
    else
      v.error("supported_aspect_ratios", "expected an array of [width, height] tile counts");
  } else {
    for (int64_t w = 1; w <= p.max_tiles; ++w) p.aspect_ratios += p.max_tiles / w;
  }
  const int64_t grid = p.patch_size > 0 ? p.tile_size / p.patch_size : 0;
  a.positions = grid * grid + 1;
  ModuleSpec vision = encoder_module("vision", Modality::kImage, a);
  vision.patching = p;
  const int64_t out = v.get("vision_output_dim", 7680);
  return vlm(vision,
             projector_module("vision_projector", "vision", out, llm.transformer->hidden,
                              llm.transformer->hidden, 1, false),
             llm);
}

ModelSpec import_whisper(const HfReader& r) {
  TransformerArch a = encoder_arch(r.get("encoder_layers", 32), r.get("d_model", 1280),
                                   r.get("encoder_attention_heads", 20),
                                   r.get("encoder_ffn_dim", 5120), NormKind::kLayerNorm);
  a.positions = r.get("max_source_positions", 1500);
  a.key_bias = false;  // Whisper's k_proj has no bias
  AudioFrontEnd fe;
  fe.mel_bins = r.get("num_mel_bins", 80);
  fe.max_seconds = static_cast<double>(a.positions * fe.downsampling) /
                   static_cast<double>(fe.frames_per_second);
  ModuleSpec audio = encoder_module("audio", Modality::kAudio, a);
  audio.audio = fe;
  ModelSpec model;
  model.modules = {audio};
  return model;
}

}  // namespace

const std::vector<std::string>& supported_hf_model_types() {
  static const std::vector<std::string> types = {
      "qwen2_vl", "qwen2_5_vl",       "llava",   "llava_next", "internvl_chat",
      "internvl", "mllama",           "whisper", "siglip",     "siglip_vision_model",
      "clip",     "clip_vision_model"};
  return types;
}

std::optional<ModelSpec> import_hf_config(const Json& config, const std::string& file,
                                          const HfImportOptions& options, Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  if (!config.is_object()) {
    diag.error(file, "", "expected a JSON object, got " + json_type_name(config));
    return std::nullopt;
  }
  const HfReader root(&config, file, "", diag);
  const std::string type = root.get_string("model_type", "");
  ModelSpec model;
  if (type == "qwen2_vl" || type == "qwen2_5_vl") {
    model = import_qwen_vl(root, type == "qwen2_5_vl");
  } else if (type == "llava" || type == "llava_next") {
    model = import_llava(root, type == "llava_next");
  } else if (type == "internvl_chat" || type == "internvl") {
    model = import_internvl(root, type == "internvl_chat");
  } else if (type == "mllama") {
    model = import_mllama(root);
  } else if (type == "whisper") {
    model = import_whisper(root);
  } else if (type == "siglip" || type == "clip") {
    model.modules = {vit_module(root.sub("vision_config"), type == "siglip")};
  } else if (type == "siglip_vision_model" || type == "clip_vision_model") {
    model.modules = {vit_module(root, type == "siglip_vision_model")};
  } else {
    std::string message = type.empty() ? "no model_type" : "unsupported model_type '" + type + "'";
    message += "; supported: ";
    const auto& types = supported_hf_model_types();
    for (std::size_t i = 0; i < types.size(); ++i) message += (i ? ", " : "") + types[i];
    diag.error(file, "model_type", message);
    return std::nullopt;
  }
  // Name: the checkpoint's _name_or_path when present, else the file's folder.
  std::string name = root.get_string("_name_or_path", "");
  if (name.empty()) name = std::filesystem::path(file).parent_path().filename().string();
  if (name.empty()) name = type;
  model.name = name;
  for (const std::string& frozen : options.freeze) {
    bool found = false;
    for (ModuleSpec& m : model.modules)
      if (m.name == frozen) {
        m.frozen = true;
        found = true;
      }
    if (!found) {
      std::string message = "--freeze " + frozen + ": no such module; modules are";
      for (const ModuleSpec& m : model.modules) message += " " + m.name;
      diag.error(file, "", message);
    }
  }
  if (diag.errors().size() != before) return std::nullopt;
  // Re-read through JSON: the result is validated exactly like a model file, so a config
  // with impossible shapes fails here, naming the config file.
  Diagnostics reread;
  ModelSpec checked = read_model(to_json(model), file, "", reread);
  diag.append(reread);
  if (diag.errors().size() != before) return std::nullopt;
  return checked;
}

}  // namespace tessera

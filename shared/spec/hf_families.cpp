#include "shared/spec/hf_families.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "shared/spec/hf_modules.hpp"

namespace tessera::hf {

namespace {

enum class QwenVit { k2, k25, k3 };

// The native-resolution ViT of Qwen2-VL / Qwen2.5-VL (and Qwen2.5-Omni) / Qwen3-VL and its
// merger into an LLM of width `llm_hidden`.
std::pair<ModuleSpec, ModuleSpec> qwen_vision(const Reader& v, QwenVit generation,
                                              int64_t llm_hidden) {
  const bool qwen25 = generation == QwenVit::k25;
  const int64_t layers = v.get("depth", 32);
  const int64_t heads = v.get("num_heads", 16);
  // Qwen2.5-VL attends within windows of window_size pixels in most layers; the cost model
  // prices every encoder layer as full attention over the image (an upper bound).
  v.known({"window_size"});
  TransformerArch a;
  if (generation == QwenVit::k3) {
    // Qwen3-VL: a SigLIP-like tower (LayerNorm, plain MLP) with a learned position table,
    // interpolated to each image's grid, beside its 2D rotary positions.
    a = encoder_arch(layers, v.get("hidden_size", 1152), heads, v.get("intermediate_size", 4304),
                     NormKind::kLayerNorm);
    a.positions = v.get("num_position_embeddings", 2304);
  } else if (qwen25) {
    // Qwen2.5-VL: hidden_size is the encoder width, out_hidden_size the LLM width.
    a = encoder_arch(layers, v.get("hidden_size", 1280), heads, v.get("intermediate_size", 3420),
                     NormKind::kRmsNorm);
    a.gated_ffn = true;
    // Qwen2.5-Omni's copy repeats the width as embed_dim; its full-attention layers and video
    // time steps change no parameter.
    v.known({"embed_dim", "fullatt_block_indexes", "tokens_per_second"});
  } else {
    // Qwen2-VL trap: vision_config.hidden_size is the LLM width (checked below); the encoder
    // width is embed_dim.
    const int64_t width = v.get("embed_dim", 1280);
    const double ratio = v.get_double("mlp_ratio", 4.0);
    a = encoder_arch(layers, width, heads,
                     static_cast<int64_t>(std::llround(static_cast<double>(width) * ratio)),
                     NormKind::kLayerNorm);
  }
  Patching p;
  p.patch_size = v.get("patch_size", 14);
  v.alias("spatial_patch_size", p.patch_size, "patch_size");  // Qwen2-VL repeats it
  p.in_channels = v.has("in_chans") ? v.get("in_chans", 3) : v.get("in_channels", 3);
  v.alias("in_channels", p.in_channels, "in_chans");  // Qwen2.5-Omni writes both
  p.spatial_merge = v.get("spatial_merge_size", 2);
  p.temporal_patch = v.get("temporal_patch_size", 2);
  p.conv_bias = generation == QwenVit::k3;
  p.resize = ResizeMode::kDynamic;
  p.min_pixels = 56 * 56;  // preprocessor_config.json defaults
  p.max_pixels = 28 * 28 * 16384;
  ModuleSpec vision = encoder_module("vision", Modality::kImage, a);
  vision.patching = p;
  const char* out_key = generation == QwenVit::k2 ? "hidden_size" : "out_hidden_size";
  const int64_t out = v.get(out_key, llm_hidden);
  if (out != llm_hidden)
    v.error(out_key, std::to_string(out) + " does not match the LLM hidden_size " +
                         std::to_string(llm_hidden));
  // The merger's norm (ln_q) normalizes each encoder token before the merge: it is the encoder's
  // final norm, so the projector has none of its own.
  const int64_t merged = a.hidden * p.spatial_merge * p.spatial_merge;
  ModuleSpec projector =
      projector_module("vision_projector", "vision", merged, merged, out, 2, false);
  if (generation == QwenVit::k3) {
    // DeepStack: a merger per listed encoder layer (normalizing the merged tokens), whose
    // outputs add into the visual tokens after the LLM's first layers.
    if (const Json* taps = v.raw("deepstack_visual_indexes"); taps != nullptr) {
      bool inside = taps->is_array();
      for (const Json& t : inside ? *taps : Json::array())
        inside =
            inside && t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < layers;
      if (inside)
        projector.projector->deepstack = static_cast<int64_t>(taps->size());
      else
        v.error("deepstack_visual_indexes",
                "expected a list of encoder layers in [0, depth=" + std::to_string(layers) + ")");
    }
  }
  return {std::move(vision), std::move(projector)};
}

// The s of the s x s merge (average pooling, or concatenation) that turns a grid x grid patch
// grid into the number of tokens `key` gives; 1, and an error, when no s does.
int64_t merge_to_tokens(const Reader& r, std::string_view key, int64_t fallback, int64_t grid) {
  const int64_t tokens = r.get(key, fallback);
  const int64_t side =
      tokens >= 1 ? std::llround(std::sqrt(static_cast<double>(tokens))) : int64_t{0};
  if (side >= 1 && side * side == tokens && side <= grid && grid % side == 0) return grid / side;
  r.error(key, std::to_string(tokens) + " tokens do not merge the " + std::to_string(grid) + "x" +
                   std::to_string(grid) + " patch grid evenly");
  return 1;
}

// The most tiles of `tile` pixels among a list of [width, height] resolutions (LLaVA-NeXT's
// image_grid_pinpoints, DeepSeek-VL2's candidate_resolutions), and at least `fewest`. In double:
// a resolution of absurd size must not overflow (validation refuses the count).
int64_t most_tiles(const Json* resolutions, int64_t tile, int64_t fewest) {
  double most = static_cast<double>(fewest);
  if (resolutions != nullptr && resolutions->is_array() && tile > 0)
    for (const Json& r : *resolutions)
      if (r.is_array() && r.size() == 2 && r[0].is_number_integer() && r[1].is_number_integer())
        most = std::max(most, std::floor(r[0].get<double>() / static_cast<double>(tile)) *
                                  std::floor(r[1].get<double>() / static_cast<double>(tile)));
  return static_cast<int64_t>(std::min(1e15, most));
}

// The step of an MoE stack's expert layers (every n-th layer has experts), read from `key` into
// moe_every; outside [1, layers] an error, and 1.
void read_moe_step(const Reader& text, std::string_view key, TransformerArch& a) {
  a.moe_every = text.get(key, 1);
  if (a.moe_every < 1 || a.moe_every > a.layers) {
    text.error(key, std::to_string(a.moe_every) +
                        " must be in [1, num_hidden_layers=" + std::to_string(a.layers) + "]");
    a.moe_every = 1;
  }
}

// Which layers of a Qwen MoE language model (Qwen3-VL's 30B-A3B and 235B-A22B) have experts:
// every decoder_sparse_step-th layer (counting from 1) outside mlp_only_layers. The IR expresses
// a dense prefix and a step; a list of dense layers elsewhere is refused.
void qwen_moe_pattern(const Reader& text, TransformerArch& a) {
  read_moe_step(text, "decoder_sparse_step", a);
  if (const Json* dense = text.raw("mlp_only_layers"); dense != nullptr) {
    bool prefix = dense->is_array();
    for (std::size_t i = 0; prefix && i < dense->size(); ++i)
      prefix = (*dense)[i].is_number_integer() && (*dense)[i].get<int64_t>() == int64_t(i);
    if (prefix && (dense->empty() || a.moe_every == 1))
      a.dense_layers = static_cast<int64_t>(dense->size());
    else
      text.error("mlp_only_layers",
                 "only a prefix of dense layers (0, 1, ..., k-1) with experts in every later "
                 "layer is in the IR");
  }
  // Renormalized top-k weights and the balancing loss: no parameter, no FLOP to speak of.
  text.known({"norm_topk_prob", "router_aux_loss_coef", "output_router_logits"});
}

// Older exports keep the output tying at the top level only: read there when the text block has
// none; otherwise the text model's own switch decides.
void top_level_tying(const Reader& root, const Reader& text, TransformerArch& a) {
  if (!text.has("tie_word_embeddings") && root.has("tie_word_embeddings"))
    a.tied_embeddings = root.get_bool("tie_word_embeddings", false);
  else
    root.known({"tie_word_embeddings"});
}

// Pixtral's vision encoder (Pixtral-12B, Mistral 3): a ViT without biases, with RMSNorm, gated
// SiLU MLPs, 2-D rotary positions, a norm over the patch embeddings (ln_pre) and none after the
// last layer.
ModuleSpec pixtral_vision(const Reader& v) {
  TransformerArch a = encoder_arch(v.get("num_hidden_layers", 24), v.get("hidden_size", 1024),
                                   v.get("num_attention_heads", 16),
                                   v.get("intermediate_size", 4096), NormKind::kRmsNorm);
  a.head_dim = v.get("head_dim", a.head_dim);
  a.linear_bias = false;
  a.gated_ffn = true;
  a.final_norm = false;
  v.known({"rope_theta", "rope_parameters"});  // the 2-D rotary base: no parameter
  Patching p;
  p.patch_size = v.get("patch_size", 16);
  p.in_channels = v.get("num_channels", 3);
  p.conv_bias = false;
  p.pre_norm = true;
  // Images keep their aspect ratio, scaled down until neither side exceeds image_size. The IR's
  // native-resolution mode bounds the area to image_size² instead: the same tokens for square
  // images, more than Pixtral cuts for an image longer than image_size on one side. The [IMG_BREAK]
  // token after each row of patches is a vocabulary token the IR does not count.
  const int64_t side = v.get("image_size", 1024);
  p.resize = ResizeMode::kDynamic;
  p.min_pixels = p.patch_size * p.patch_size;
  p.max_pixels = side * side;
  ModuleSpec vision = encoder_module("vision", Modality::kImage, a);
  vision.patching = p;
  return vision;
}

}  // namespace

ModelSpec import_qwen_vl(const Reader& root, bool qwen25) {
  // Flat shape: LLM keys at top level. Newer exports nest them in text_config.
  const Reader text = root.has("text_config") ? root.sub("text_config") : root;
  ModuleSpec llm = llm_module(text, qwen25 ? "qwen2_5_vl" : "qwen2_vl");
  if (root.has("text_config")) root.repeated_in(text);
  auto [vision, projector] = qwen_vision(
      root.sub("vision_config"), qwen25 ? QwenVit::k25 : QwenVit::k2, llm.transformer->hidden);
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_qwen3_vl(const Reader& root) {
  const Reader text = root.sub("text_config");
  ModuleSpec llm = llm_module(text, "qwen3");
  if (llm.transformer->experts > 0) qwen_moe_pattern(text, *llm.transformer);
  if (!text.has("tie_word_embeddings"))
    llm.transformer->tied_embeddings = root.get_bool("tie_word_embeddings", false);
  auto [vision, projector] =
      qwen_vision(root.sub("vision_config"), QwenVit::k3, llm.transformer->hidden);
  if (projector.projector->deepstack > llm.transformer->layers)
    root.sub("vision_config")
        .error("deepstack_visual_indexes", "more DeepStack levels than LLM layers");
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_qwen_omni(const Reader& root) {
  // The thinker (encoders and the LLM) trains; the talker and the waveform generator turn its
  // output into speech and are trained apart.
  root.leave_out("talker_config",
                 "the talker, which turns the thinker's output into speech "
                 "tokens; a thinker training run does not hold it");
  root.leave_out("token2wav_config",
                 "the waveform generator (DiT and BigVGAN), which a thinker "
                 "training run does not hold");
  root.known({"enable_audio_output", "enable_talker"});
  const Reader thinker = root.sub("thinker_config");
  ModuleSpec llm = llm_module(thinker.sub("text_config"), "qwen2");
  const int64_t h = llm.transformer->hidden;
  auto [vision, vision_projector] = qwen_vision(thinker.sub("vision_config"), QwenVit::k25, h);
  // Audio: Whisper's encoder with sinusoidal positions, attending within windows of
  // 2 * n_window mel frames (2 s) of the clip's real length, pooled 2:1, normalized (ln_post,
  // the encoder's final norm) and projected to the LLM width inside the encoder (`proj`).
  const Reader a = thinker.sub("audio_config");
  ModuleSpec audio = whisper_encoder(a, 128);
  audio.transformer->positions = 0;
  AudioFrontEnd& fe = *audio.audio;
  fe.pooling = 2;
  fe.max_seconds =
      static_cast<double>(2 * a.get("n_window", 100)) / static_cast<double>(fe.frames_per_second);
  fe.pad_to_max = false;
  if (const int64_t out = a.get("output_dim", h); out != h)
    a.error("output_dim",
            std::to_string(out) + " does not match the LLM hidden_size " + std::to_string(h));
  ModuleSpec audio_projector =
      projector_module("audio_projector", "audio", audio.transformer->hidden, h, h, 1, false);
  // The audio's begin and end embeddings (audio_bos_eos_token), rows of the LLM's width.
  llm.transformer->extra_embeddings = 2;
  thinker.known({"position_id_per_seconds", "seconds_per_chunk"});
  llm.inputs = {vision_projector.name, audio_projector.name};
  ModelSpec model;
  model.modules = {std::move(vision), std::move(vision_projector), std::move(audio),
                   std::move(audio_projector), std::move(llm)};
  return model;
}

ModelSpec import_llava(const Reader& root, bool next) {
  // The original LLaVA repository saves its checkpoints with model_type "llava" too, in a shape
  // of its own: the LLM's keys at the top level and the vision tower by name alone (Video-LLaVA's
  // fork names an image and a video tower).
  for (const char* tower : {"mm_vision_tower", "mm_image_tower", "mm_video_tower"})
    if (root.has(tower)) {
      root.refuse(tower,
                  "the original LLaVA repository's format, which names its vision tower without "
                  "its sizes; import the Hugging Face conversion of the checkpoint (llava-hf/...)");
      return {};
    }
  const Reader text = root.sub("text_config");
  const Reader v = root.sub("vision_config");
  ModuleSpec llm = llm_module(text, text.get_string("model_type", "llama"));
  // Older llava-hf exports keep the vocabulary size and embedding tying at the top level.
  if (const int64_t vocab = root.get("vocab_size", 0); vocab > 0 && !text.has("vocab_size"))
    llm.transformer->vocab = vocab;
  top_level_tying(root, text, *llm.transformer);
  const std::string tower = v.get_string("model_type", "clip_vision_model");
  const bool siglip = tower.starts_with("siglip");
  const bool pixtral = tower == "pixtral" && !next;  // Pixtral-12B's llava-hf conversion
  if (!siglip && !pixtral && tower != "clip_vision_model")
    v.refuse("model_type", "'" + tower +
                               "': the import reads CLIP, SigLIP and (LLaVA-1.5's shape) Pixtral "
                               "vision towers");
  ModuleSpec vision = pixtral ? pixtral_vision(v) : vit_module(v, siglip);
  if (next) {
    // LLaVA-NeXT "anyres": tiles of the base resolution from image_grid_pinpoints plus the
    // downscaled base image.
    Patching& p = *vision.patching;
    p.tile_size = p.image_size;
    p.resize = ResizeMode::kTiles;
    p.thumbnail = true;
    p.max_tiles = most_tiles(root.raw("image_grid_pinpoints"), p.tile_size, 4);
    p.image_size = 0;
  }
  const int64_t h = llm.transformer->hidden;
  ModuleSpec projector =
      projector_module("vision_projector", "vision", vision.transformer->hidden, h, h, 2, false);
  projector.projector->bias = root.get_bool("multimodal_projector_bias", true);
  // LLaVA-NeXT: a learned image_newline after each row of tiles, unless the config turns it off.
  // LLaVA-1.5's model (LlavaForConditionalGeneration) has none whatever the switch says: configs
  // merged from LLaVA-NeXT checkpoints carry it over.
  if (next) {
    if (root.get_bool("use_image_newline_parameter", true))
      projector.projector->output_embeddings = 1;
  } else {
    root.unused({"use_image_newline_parameter"},
                "LLaVA-1.5's model builds no image newline whatever this says (a LLaVA-NeXT "
                "setting carried over)");
  }
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_mistral3(const Reader& root) {
  const Reader text = root.sub("text_config");
  ModuleSpec llm = llm_module(text, text.get_string("model_type", "mistral"));
  top_level_tying(root, text, *llm.transformer);
  const Reader v = root.sub("vision_config");
  if (const std::string tower = v.get_string("model_type", "pixtral"); tower != "pixtral") {
    v.refuse("model_type", "'" + tower + "': Mistral 3 is imported with its Pixtral tower");
    return {};
  }
  ModuleSpec vision = pixtral_vision(v);
  const int64_t s = root.get("spatial_merge_size", 2);
  if (s < 1 || s > 8) {
    root.error("spatial_merge_size", std::to_string(s) + " must be in [1, 8]");
    return {};
  }
  vision.patching->spatial_merge = s;
  // The projector normalizes each patch (RMSNorm), concatenates s x s neighbours, merges them
  // back to one patch's width without a bias (the patch merger), and maps that to the LLM's
  // width in a two-layer GELU MLP.
  const int64_t w = vision.transformer->hidden;
  const int64_t h = llm.transformer->hidden;
  ModuleSpec projector = projector_module("vision_projector", "vision", w * s * s, h, h, 2, true);
  ProjectorArch& pr = *projector.projector;
  pr.merger = w;
  pr.input_norm_width = w;
  pr.norm = NormKind::kRmsNorm;
  pr.bias = root.get_bool("multimodal_projector_bias", false);
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_llava_next_video(const Reader& root) {
  ModelSpec m = import_llava(root, true);
  if (m.modules.empty()) return m;
  // Each video frame runs through the tower at the base resolution (one tile), and its token
  // grid is pooled before the projector: average or max pooling has no parameters; the conv
  // mode's learned pooling is not imported.
  const std::string mode = root.get_string("spatial_pool_mode", "average");
  if (mode != "average" && mode != "max")
    root.error("spatial_pool_mode", "'" + mode +
                                        "': a learned (conv) pooling of video frames is not in "
                                        "the IR; average and max are");
  // The conv mode's output width; the parameter-free modes keep the tower's.
  if (mode != "conv") root.known({"spatial_pool_out_channels"});
  const int64_t stride = root.get("spatial_pool_stride", 2);
  if (stride < 1)
    root.error("spatial_pool_stride", std::to_string(stride) + " must be at least 1");
  else
    m.modules[0].patching->video_pool = stride;
  // The processor's token count of a default clip: the IR counts each clip's own frames.
  root.known({"video_seq_length"});
  return m;
}

ModelSpec import_llava_onevision(const Reader& root) {
  ModelSpec m = import_llava(root, true);
  // anyres_max_N: the tiles of the best pinpoint grid (up to 6 x 6 of them) run through the
  // tower, and their features are scaled down to at most N tiles' worth before the LLM. The IR
  // ties an image's encoder and LLM tokens to one tile count: it takes N, right for the LLM's
  // sequence and low for the tower on the largest images.
  const std::string ratio = root.get_string("vision_aspect_ratio", "anyres_max_9");
  const std::string prefix = "anyres_max_";
  int64_t tiles = 0;
  if (ratio.starts_with(prefix) && ratio.size() > prefix.size() &&
      ratio.size() < prefix.size() + 4 &&
      std::all_of(ratio.begin() + static_cast<std::ptrdiff_t>(prefix.size()), ratio.end(),
                  [](char c) { return c >= '0' && c <= '9'; }))
    tiles = std::stoll(ratio.substr(prefix.size()));
  if (tiles < 1)
    root.error("vision_aspect_ratio", "'" + ratio + "': expected anyres_max_N");
  else
    m.modules[0].patching->max_tiles = std::min(m.modules[0].patching->max_tiles, tiles);
  return m;
}

// InternVL's switches of parts the import does not build, each accepted at the value that leaves
// the part out, and its settings that change no parameter or token count.
void internvl_switches(const Reader& root, const Reader& v, bool remote_code) {
  if (remote_code) {
    root.require("select_layer", -1, "the projector would read an earlier layer's output");
    root.require("use_backbone_lora", 0, "LoRA adapters on the vision tower");
    root.require("use_llm_lora", 0, "LoRA adapters on the language model");
    v.require("qk_normalization", false, "InternViT-6B's query/key norms over the full width");
    // The fewest tiles an image is cut into: the import prices images up to max_dynamic_patch.
    root.unused({"min_dynamic_patch"}, "the fewest tiles per image, a setting of preprocessing");
  } else {
    v.require("use_qk_norm", false, "InternViT-6B's query/key norms over the full width");
    v.require("use_mask_token", false, "a mask-token embedding, used only in pre-training");
    v.require("use_mean_pooling", true, "a norm after the last layer");
    v.require("use_absolute_position_embeddings", true,
              "the import builds a learned position table");
  }
}

ModelSpec import_internvl(const Reader& root, bool remote_code) {
  const Reader text = root.sub(remote_code ? "llm_config" : "text_config");
  std::string llm_type = text.get_string("model_type", "qwen2");
  ModuleSpec llm = llm_module(text, llm_type);
  // InternLM2 (InternVL2-2B, -8B, -26B): one switch for the biases of its fused qkv and output
  // projections.
  if (llm_type == "internlm2" && text.get_bool("bias", false)) {
    llm.transformer->qkv_bias = true;
    llm.transformer->out_bias = true;
  }
  const Reader v = root.sub("vision_config");
  internvl_switches(root, v, remote_code);
  TransformerArch a =
      encoder_arch(v.get("num_hidden_layers", 24), v.get("hidden_size", 1024),
                   v.get("num_attention_heads", 16), v.get("intermediate_size", 4096),
                   v.get_string("norm_type", "layer_norm") == "rms_norm" ? NormKind::kRmsNorm
                                                                         : NormKind::kLayerNorm);
  // qkv_bias in the remote-code shape, attention_bias in the hf one.
  if (!v.get_bool(remote_code ? "qkv_bias" : "attention_bias", true)) {
    // InternViT-6B: q, k and v without biases; the attention's output projection and the MLP
    // keep theirs.
    a.linear_bias = false;
    a.out_bias = true;
    a.mlp_bias = true;
  }
  // InternViT scales both residual branches per channel and ends without a norm: the
  // projector normalizes the merged tokens itself.
  a.layer_scale = true;
  a.final_norm = false;
  Patching p;
  p.patch_size = v.get("patch_size", 14);
  p.in_channels = v.get("num_channels", 3);
  const int64_t tile = v.get("image_size", 448);
  p.tile_size = root.has("force_image_size") ? root.get("force_image_size", tile) : tile;
  p.resize = ResizeMode::kTiles;
  // Without dynamic_image_size every image is one tile.
  p.max_tiles = root.get_bool("dynamic_image_size", true) ? root.get("max_dynamic_patch", 12) : 1;
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

ModelSpec import_mllama(const Reader& root) {
  const Reader text = root.sub("text_config");
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
  const Reader v = root.sub("vision_config");
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
  p.in_channels = v.get("num_channels", 3);
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
  // The projector reads the last layer's output and those of intermediate_layers_indices,
  // concatenated: vision_output_dim wide.
  v.known({"intermediate_layers_indices"});
  const int64_t out = v.get("vision_output_dim", 7680);
  return vlm(vision,
             projector_module("vision_projector", "vision", out, llm.transformer->hidden,
                              llm.transformer->hidden, 1, false),
             llm);
}

ModelSpec import_whisper(const Reader& root) {
  ModuleSpec audio = whisper_encoder(root, 80);
  root.leave_out({"decoder_layers", "decoder_attention_heads", "decoder_ffn_dim", "vocab_size"},
                 "Whisper's text decoder, which a speech-LLM does not run (the encoder alone is "
                 "imported)");
  ModelSpec model;
  model.modules = {std::move(audio)};
  return model;
}

ModelSpec import_qwen2_audio(const Reader& root) {
  ModuleSpec llm = llm_module(root.sub("text_config"), "qwen2");
  root.known({"vocab_size"});  // the LLM's, repeated
  ModuleSpec audio = whisper_encoder(root.sub("audio_config"), 128);
  // An average pool of stride 2 after the encoder: 25 LLM tokens per second of audio.
  audio.audio->pooling = 2;
  const int64_t h = llm.transformer->hidden;
  ModuleSpec projector =
      projector_module("audio_projector", "audio", audio.transformer->hidden, h, h, 1, false);
  return vlm(std::move(audio), std::move(projector), std::move(llm));
}

ModelSpec import_gemma3(const Reader& root) {
  ModuleSpec llm = llm_module(root.sub("text_config"), "gemma3_text");
  ModuleSpec vision = vit_module(root.sub("vision_config"), true);
  // The patch grid is average-pooled to mm_tokens_per_image tokens (64 x 64 -> 16 x 16 at 896
  // pixels), then normalized and projected by one bias-free matrix.
  Patching& p = *vision.patching;
  const int64_t grid = p.patch_size > 0 ? p.image_size / p.patch_size : 0;
  p.spatial_merge = merge_to_tokens(root, "mm_tokens_per_image", 256, grid);
  const int64_t h = llm.transformer->hidden;
  ModuleSpec projector =
      projector_module("vision_projector", "vision", vision.transformer->hidden, h, h, 1, true);
  projector.projector->bias = false;
  projector.projector->norm = NormKind::kRmsNorm;
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_llama4(const Reader& root) {
  const Reader text = root.sub("text_config");
  ModuleSpec llm = llm_module(text, "llama4_text");
  TransformerArch& a = *llm.transformer;
  // An MoE layer's MLP is `num_local_experts` routed experts of width intermediate_size and one
  // shared expert as wide; every interleave_moe_layer_step-th layer has experts (layers 1, 3,
  // 5, ... for Maverick's 2), the others a dense MLP of width intermediate_size_mlp.
  a.shared_expert_ffn = a.moe_ffn;
  a.ffn = text.get("intermediate_size_mlp", a.ffn);
  read_moe_step(text, "interleave_moe_layer_step", a);
  // An explicit list of MoE layers must be the one the step gives.
  if (const Json* listed = text.raw("moe_layers"); listed != nullptr) {
    std::vector<int64_t> expected;
    for (int64_t l = 0; l < a.layers; ++l)
      if (moe_layer(a, l)) expected.push_back(l);
    if (!listed->is_array() || *listed != Json(expected))
      text.error("moe_layers", "must list every interleave_moe_layer_step-th layer (" +
                                   std::to_string(a.moe_every) + "), the only pattern imported");
  }
  // Query/key L2 norms without weights, rotary on 3 of 4 layers, chunked local attention,
  // attention temperature tuning, router training terms: no parameter, FLOPs to speak of none
  // (chunked attention is priced as full attention, an upper bound).
  text.known({"use_qk_norm", "no_rope_layers", "attention_chunk_size", "attn_scale",
              "attn_temperature_tuning", "floor_scale", "router_aux_loss_coef",
              "router_jitter_noise", "output_router_logits"});
  const Reader v = root.sub("vision_config");
  ModuleSpec vision = vit_module(v, false);  // CLIP-like: class token, bias-free patches, pre-norm
  // The patch grid is pixel-shuffled (2 x 2 patches into one token of 4 x the channels), then an
  // adapter MLP (intermediate_size -> projector_input_dim -> projector_output_dim, both with
  // GELU) and the projector (vision_output_dim -> LLM width) map it: one three-layer projector.
  Patching& p = *vision.patching;
  const double ratio = v.get_double("pixel_shuffle_ratio", 0.5);
  p.spatial_merge = ratio > 0 ? std::lround(1.0 / ratio) : 0;
  if (p.spatial_merge < 1 || std::abs(1.0 / static_cast<double>(p.spatial_merge) - ratio) > 1e-9)
    v.error("pixel_shuffle_ratio", "expected 1/n for a whole n, got " + std::to_string(ratio));
  const int64_t shuffled = vision.transformer->hidden * p.spatial_merge * p.spatial_merge;
  const int64_t adapter_in = v.get("intermediate_size", shuffled);
  if (adapter_in != shuffled)
    v.error("intermediate_size", std::to_string(adapter_in) + " is not the pixel-shuffled width " +
                                     std::to_string(shuffled));
  const int64_t width = v.get("projector_input_dim", 4096);
  for (const char* key : {"projector_output_dim", "vision_output_dim"})
    if (const int64_t w = v.get(key, width); w != width)
      v.error(key, std::to_string(w) + " differs from projector_input_dim " +
                       std::to_string(width) + " (the adapter's layers chain these widths)");
  ModuleSpec projector =
      projector_module("vision_projector", "vision", shuffled, width, a.hidden, 3, false);
  projector.projector->bias = false;  // the adapter's linears have none
  if (v.get_bool("multi_modal_projector_bias", false))
    v.error("multi_modal_projector_bias",
            "a bias on the projector's last linear alone is not in the IR yet");
  // Images are cut into tiles of image_size, up to 16 and a downscaled whole image beside them
  // (the image processor's max_patches default; config.json does not say).
  p.tile_size = p.image_size;
  p.image_size = 0;
  p.resize = ResizeMode::kTiles;
  p.max_tiles = 16;
  p.thumbnail = true;
  v.known({"projector_dropout", "vision_feature_layer", "vision_feature_select_strategy",
           "rope_theta", "norm_eps"});
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_paligemma(const Reader& root) {
  const Reader text = root.sub("text_config");
  ModuleSpec llm = llm_module(text, text.get_string("model_type", "gemma"));
  // Stale copies of the text model's sizes, which the transformers code ignores.
  root.known({"hidden_size", "num_hidden_layers", "_vocab_size", "projection_dim"});
  // Older exports repeat the vocabulary at the top level; the language model is built from
  // text_config's (tiny test models show the two apart).
  root.unused({"vocab_size"},
              "a top-level copy: the language model is built from "
              "text_config.vocab_size");
  text.known({"num_image_tokens"});
  const Reader v = root.sub("vision_config");
  // PaliGemma's projection_dim is its projector's output: the LLM width.
  const int64_t h = llm.transformer->hidden;
  if (const int64_t out = v.get("projection_dim", h); out != h)
    v.error("projection_dim",
            std::to_string(out) + " does not match the LLM hidden_size " + std::to_string(h));
  ModuleSpec vision = vit_module(v, true);
  // The position table has a row per patch whatever num_positions says.
  v.known({"num_image_tokens", "num_positions"});
  ModuleSpec projector =
      projector_module("vision_projector", "vision", vision.transformer->hidden, h, h, 1, false);
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_phi3_vision(const Reader& root) {
  ModuleSpec llm = llm_module(root, "phi3");  // flat: the LLM's keys at the top level
  const Reader tower = root.sub("img_processor");
  // config.json names its vision tower without its sizes; the remote code hard-codes them.
  const std::string name = tower.get_string("model_name", "openai/clip-vit-large-patch14-336");
  if (name != "openai/clip-vit-large-patch14-336")
    tower.error("model_name", "'" + name +
                                  "': the config does not give this vision tower's sizes, and "
                                  "the import knows only openai/clip-vit-large-patch14-336's");
  Json clip{{"hidden_size", 1024},       {"num_hidden_layers", 24}, {"num_attention_heads", 16},
            {"intermediate_size", 4096}, {"patch_size", 14},        {"image_size", 336}};
  Diagnostics none;
  ModuleSpec vision = vit_module(Reader(clip, "", none), false);
  const int64_t width = vision.transformer->hidden;
  if (const int64_t out = tower.get("image_dim_out", width); out != width)
    tower.error("image_dim_out",
                std::to_string(out) + " is not the tower's width " + std::to_string(width));
  tower.known({"name"});
  // HD transform: crops of 336 pixels and the whole image downscaled, each 24 x 24 patches
  // merged 2 x 2 into 144 tokens of 4 x 1024 channels.
  Patching& p = *vision.patching;
  p.tile_size = p.image_size;
  p.image_size = 0;
  p.resize = ResizeMode::kTiles;
  p.max_tiles = 16;  // the processor's num_crops for single images (not in config.json)
  p.thumbnail = true;
  const int64_t grid = p.tile_size / p.patch_size;
  p.spatial_merge = merge_to_tokens(tower, "num_img_tokens", 144, grid);
  const Reader embed = root.sub("embd_layer");
  // The remote code asserts both; the separators are learned embeddings of the merged width.
  if (!embed.get_bool("use_hd_transform", false) ||
      !embed.get_bool("with_learnable_separator", false))
    embed.error("use_hd_transform",
                "Phi-3-vision runs the HD transform with learned separators "
                "only (use_hd_transform and with_learnable_separator true)");
  embed.known({"hd_transform_order", "embedding_cls"});
  const std::string projection = embed.get_string("projection_cls", "mlp");
  if (projection != "mlp" && projection != "linear")
    embed.error("projection_cls", "'" + projection + "': expected mlp or linear");
  const int64_t h = llm.transformer->hidden;
  const int64_t merged = width * p.spatial_merge * p.spatial_merge;
  ModuleSpec projector = projector_module("vision_projector", "vision", merged, h, h,
                                          projection == "mlp" ? 2 : 1, false);
  projector.projector->separators = 2;  // glb_GN and sub_GN
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_idefics3(const Reader& root) {
  const Reader text = root.sub("text_config");
  ModuleSpec llm = llm_module(text, text.get_string("model_type", "llama"));
  if (!text.has("tie_word_embeddings"))
    llm.transformer->tied_embeddings = root.get_bool("tie_word_embeddings", false);
  root.known({"vocab_size", "use_reentrant_checkpointing"});  // the LLM's; a training switch
  // Keys of the training code the checkpoints came from; transformers reads the top-level
  // scale_factor instead.
  text.known({"pixel_shuffle_factor", "qk_layer_norms", "use_resampler", "is_llama_config",
              "neftune_noise_alpha", "rope_interleaved"});
  // SmolVLM's Llama text_config carries Idefics2's resampler settings, which the Llama model
  // never reads (Idefics3 has no resampler), and LlamaConfig's MLP-bias switch.
  text.unused({"perceiver_config"},
              "Idefics2's resampler settings, which Idefics3 and SmolVLM do not build");
  text.require("mlp_bias", false, "biases on the language model's MLP linears");
  const Reader v = root.sub("vision_config");
  // Idefics3VisionConfig's defaults fill what SmolVLM2 configs leave out (12 layers, 3072 wide).
  Json tower{{"hidden_size", v.get("hidden_size", 1152)},
             {"num_hidden_layers", v.get("num_hidden_layers", 12)},
             {"num_attention_heads", v.get("num_attention_heads", 16)},
             {"intermediate_size", v.get("intermediate_size", 3072)},
             {"patch_size", v.get("patch_size", 32)},
             {"image_size", v.get("image_size", 224)},
             {"num_channels", v.get("num_channels", 3)}};
  v.known({"use_base_siglip", "tie_word_embeddings"});
  Diagnostics none;
  ModuleSpec vision = vit_module(Reader(tower, "", none), true);
  // Images are resized to size.longest_edge and cut into tiles of max_image_size.longest_edge
  // (plus the whole image downscaled); each tile's patches are pixel-shuffled scale_factor^2
  // into one token.
  Patching& p = *vision.patching;
  const int64_t tile = v.sub("max_image_size").get("longest_edge", p.image_size);
  const int64_t longest = v.sub("size").get("longest_edge", 4 * tile);
  if (tile != p.image_size)
    v.error("max_image_size", "tiles of " + std::to_string(tile) +
                                  " pixels for an encoder of image_size " +
                                  std::to_string(p.image_size));
  p.tile_size = tile;
  p.image_size = 0;
  p.resize = ResizeMode::kTiles;
  const int64_t across = tile > 0 ? (longest + tile - 1) / tile : 0;
  p.max_tiles = across * across;
  p.thumbnail = true;
  p.spatial_merge = root.get("scale_factor", 2);
  const int64_t grid = p.patch_size > 0 ? tile / p.patch_size : 0;
  if (p.spatial_merge < 1 || grid % p.spatial_merge != 0)
    root.error("scale_factor", std::to_string(p.spatial_merge) + " does not divide the " +
                                   std::to_string(grid) + "-patch side of a tile");
  const int64_t h = llm.transformer->hidden;
  const int64_t merged = vision.transformer->hidden * p.spatial_merge * p.spatial_merge;
  ModuleSpec projector = projector_module("vision_projector", "vision", merged, h, h, 1, false);
  projector.projector->bias = false;
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

namespace {

// A DeepSeek-V2/V3 language model (DeepSeek-VL2's language_config, Kimi-VL's text_config):
// DeepseekV2Config's defaults for what the block leaves out; multi-head latent attention unless
// use_mla is false (V3 always has it); MoE with shared experts after the first dense layers.
ModuleSpec deepseek_llm(const Reader& text) {
  Json sizes{{"hidden_size", text.get("hidden_size", 5120)},
             {"intermediate_size", text.get("intermediate_size", 12288)},
             {"num_hidden_layers", text.get("num_hidden_layers", 30)},
             {"num_attention_heads", text.get("num_attention_heads", 32)},
             {"vocab_size", text.get("vocab_size", 102400)},
             {"attention_bias", text.get_bool("attention_bias", false)}};
  sizes["num_key_value_heads"] = text.get("num_key_value_heads", sizes["num_attention_heads"]);
  Diagnostics none;
  ModuleSpec llm = llm_module(Reader(sizes, "", none), "deepseek_v2");
  TransformerArch& a = *llm.transformer;
  a.tied_embeddings = text.get_bool("tie_word_embeddings", false);
  if (text.get_bool("use_mla", true)) {
    // Keys and values of every head come up from the latent; num_key_value_heads is unused.
    a.kv_heads = a.heads;
    a.kv_lora_rank = text.get("kv_lora_rank", 512);
    a.q_lora_rank = text.get("q_lora_rank", 0);  // null: queries projected directly
    a.rope_head_dim = text.get("qk_rope_head_dim", 64);
    a.head_dim = text.get("qk_nope_head_dim", 128) + a.rope_head_dim;
    a.v_head_dim = text.get("v_head_dim", 128);
    if (a.kv_lora_rank < 1 || a.rope_head_dim < 1)
      text.error("kv_lora_rank",
                 "multi-head latent attention needs kv_lora_rank and "
                 "qk_rope_head_dim above 0");
  } else {
    // Without MLA, the latent ranks and head splits are unused (Tiny writes them null or 0).
    text.known(
        {"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"});
  }
  a.experts = text.get("n_routed_experts", 0);
  if (a.experts > 0) {
    a.top_k = text.get("num_experts_per_tok", 6);
    a.moe_ffn = text.get("moe_intermediate_size", 1407);
    a.shared_expert_ffn = a.moe_ffn * text.get("n_shared_experts", 0);
    a.dense_layers = text.get("first_k_dense_replace", 0);
    if (const int64_t every = text.get("moe_layer_freq", 1); every != 1)
      text.error("moe_layer_freq", std::to_string(every) +
                                       ": DeepSeek's experts in every n-th layer counted from "
                                       "layer 0 are not the IR's pattern (moe_every counts after "
                                       "the dense layers); only 1 is imported");
    // noaux_tc (V3, Kimi) adds a learned bias per expert to the router's scores.
    const std::string method = text.get_string("topk_method", "greedy");
    a.router_bias = method == "noaux_tc";
    if (method != "greedy" && method != "group_limited_greedy" && method != "noaux_tc")
      text.error("topk_method",
                 "'" + method + "': expected greedy, group_limited_greedy or noaux_tc");
    // Both group methods pick a token's experts from its topk_group best of n_group groups
    // (node-limited routing); greedy ignores the groups.
    const int64_t groups = text.get("n_group", 1), group_top_k = text.get("topk_group", groups);
    if (method != "greedy" && groups > 1 && group_top_k < groups) {
      if (a.experts % groups != 0)
        text.error("n_group", std::to_string(groups) +
                                  " does not divide n_routed_experts=" + std::to_string(a.experts));
      else if (group_top_k < 1 || group_top_k * (a.experts / groups) < a.top_k)
        text.error("topk_group",
                   std::to_string(group_top_k) + " groups of " +
                       std::to_string(a.experts / groups) +
                       " experts hold fewer than num_experts_per_tok=" + std::to_string(a.top_k));
      a.router_groups = groups;
      a.router_group_top_k = group_top_k;
    }
  }
  // DeepSeek-V3's multi-token-prediction modules (its checkpoint holds their weights).
  a.mtp_layers = text.get("num_nextn_predict_layers", 0);
  if (a.mtp_layers < 0) text.error("num_nextn_predict_layers", "must be 0 or more");
  // Routing details without parameters; the inert head switches (the LM head is always built,
  // untied unless tie_word_embeddings).
  text.known({"n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
              "aux_loss_alpha", "seq_aux", "ep_size", "lm_head", "rm_head", "rope_scaling"});
  return llm;
}

}  // namespace

ModelSpec import_deepseek_vl2(const Reader& root) {
  // DeepSeek-OCR shares the model_type with encoders of its own: one width per encoder.
  if (const Json* w = root.sub("vision_config").raw("width"); w != nullptr && w->is_object()) {
    std::string encoders;
    for (const auto& [name, _] : w->items()) encoders += (encoders.empty() ? "" : ", ") + name;
    root.refuse("vision_config.width", "DeepSeek-OCR's encoders (" + encoders +
                                           "): a SAM encoder feeding a second one is not imported");
    return {};
  }
  ModuleSpec llm = deepseek_llm(root.sub("language_config"));
  const TransformerArch& a = *llm.transformer;
  // The vision tower: a timm SigLIP ViT (config: layers, width, mlp_ratio; heads and image size
  // from VisionEncoderConfig's defaults), all of its layers kept.
  const Reader v = root.sub("vision_config");
  const int64_t width = v.get("width", 1024);
  const double ratio = v.get_double("mlp_ratio", 3.7362);
  Json tower{{"hidden_size", width},
             {"num_hidden_layers", v.get("layers", 24)},
             {"num_attention_heads", v.get("heads", 16)},
             {"intermediate_size",
              static_cast<int64_t>(static_cast<double>(width) * ratio)},  // timm truncates
             {"patch_size", v.get("patch_size", 16)},
             {"image_size", v.get("image_size", 384)}};
  Diagnostics none;
  ModuleSpec vision = vit_module(Reader(tower, "", none), true);
  // The tower builds SigLIP's attention-pooling head (global_pool "map") and never runs it
  // (ignore_head); its class token is off.
  v.leave_out("model_name",
              "the vision tower's attention-pooling head, built but not run (ignore_head)");
  v.known({"select_layer", "ignore_head", "global_pool", "weight_init", "deterministic",
           "num_recomputing_layers"});
  if (v.get_bool("class_token", false))
    v.error("class_token", "a class token in DeepSeek-VL2's tower is not imported");
  // Images: the best of candidate_resolutions (grids of up to 3 x 3 tiles and 1 x 9 of 384
  // pixels) cut into tiles, with a downscaled global view; each tile's 27 x 27 patches padded to
  // 28 x 28 and merged 2 x 2 (196 tokens).
  Patching& p = *vision.patching;
  p.tile_size = p.image_size;
  p.image_size = 0;
  p.resize = ResizeMode::kTiles;
  p.thumbnail = true;
  p.max_tiles = most_tiles(root.raw("candidate_resolutions"), p.tile_size, 1);
  root.known({"global_view_pos"});  // where the global view goes: no parameter
  const Reader pc = root.sub("projector_config");
  if (const std::string type = pc.get_string("projector_type", "downsample_mlp_gelu");
      type != "downsample_mlp_gelu")
    pc.error("projector_type", "'" + type + "': only downsample_mlp_gelu is imported");
  if (pc.get_bool("token_pooling", false))
    pc.error("token_pooling", "the token-pooling projector is not imported");
  p.spatial_merge = pc.get("downsample_ratio", 2);
  p.merge_padding = true;
  const int64_t in = pc.get("input_dim", width) * p.spatial_merge * p.spatial_merge;
  const int64_t h = a.hidden;
  if (const int64_t n = pc.get("n_embed", h); n != h)
    pc.error("n_embed", std::to_string(n) + " is not the LLM's hidden_size " + std::to_string(h));
  const int64_t depth = pc.get("depth", 2);
  if (pc.get("mlp_ratio", 1) != 1)
    pc.error("mlp_ratio", "a projector wider than the LLM is not imported");
  ModuleSpec projector = projector_module("vision_projector", "vision", in, h, h, depth, false);
  // "2D" tiles: a learned newline after each row of tokens and a view separator between the
  // global view and the tiles; "1D": one learned indicator per tile position.
  const std::string tag = root.get_string("tile_tag", "2D");
  if (tag == "2D") {
    projector.projector->output_embeddings = 2;
  } else if (tag == "1D") {
    const Json* res = root.raw("candidate_resolutions");
    projector.projector->output_embeddings =
        (res != nullptr && res->is_array() ? static_cast<int64_t>(res->size()) : 0) + 1;
  } else {
    root.error("tile_tag", "'" + tag + "': expected 2D or 1D");
  }
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

ModelSpec import_kimi_vl(const Reader& root) {
  ModuleSpec llm = deepseek_llm(root.sub("text_config"));
  root.alias("vocab_size", llm.transformer->vocab, "text_config.vocab_size");
  // MoonViT: a SigLIP-like tower at native resolution, a learned 2-D position table (scaled to
  // each image's grid) beside 2-D rotary positions; its patches merged merge_kernel_size.
  const Reader v = root.sub("vision_config");
  const int64_t width = v.get("hidden_size", 1152);
  TransformerArch a =
      encoder_arch(v.get("num_hidden_layers", 27), width, v.get("num_attention_heads", 16),
                   v.get("intermediate_size", 4304), NormKind::kLayerNorm);
  a.positions = v.get("init_pos_emb_height", 64) * v.get("init_pos_emb_width", 64);
  Patching p;
  p.patch_size = v.get("patch_size", 14);
  p.resize = ResizeMode::kDynamic;
  int64_t merge = 2;
  if (const Json* k = v.raw("merge_kernel_size"); k != nullptr) {
    if (k->is_array() && k->size() == 2 && (*k)[0].is_number_integer() && (*k)[0] == (*k)[1] &&
        (*k)[0].get<int64_t>() >= 1 && (*k)[0].get<int64_t>() <= 64)
      merge = (*k)[0].get<int64_t>();
    else
      v.error("merge_kernel_size", "expected [s, s] with 1 <= s <= 64");
  }
  p.spatial_merge = merge;
  // The image processor's default in_token_limit of 4096 patches (not in config.json).
  p.min_pixels = p.patch_size * merge * p.patch_size * merge;
  p.max_pixels = 4096 * p.patch_size * p.patch_size;
  ModuleSpec vision = encoder_module("vision", Modality::kImage, a);
  vision.patching = p;
  // The projector: a LayerNorm over each encoder token (pre_norm), the merged tokens through
  // linear -> GELU -> linear to the LLM width.
  const int64_t merged = width * merge * merge;
  ModuleSpec projector = projector_module("vision_projector", "vision", merged, merged,
                                          llm.transformer->hidden, 2, true);
  projector.projector->input_norm_width = width;
  root.known({"media_placeholder_token_id", "ignore_index"});
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

// transformers 4.2x and older wrote each tower's config twice: as given (`vision_config_dict`) and
// complete (`vision_config`, which the import reads). The copy must agree where both say a key.
void config_dict_copy(const Reader& root, std::string_view copy, std::string_view config) {
  const Json* a = root.raw(copy);
  if (a == nullptr) return;
  const Json* b = root.raw(config);
  if (a->is_object() && b != nullptr && b->is_object())
    for (const auto& [key, value] : a->items())
      if (b->contains(key) && (*b)[key] != value)
        root.error(std::string(copy) + "." + key,
                   value.dump() + " differs from " + std::string(config) + "." + key + " = " +
                       (*b)[key].dump() + ": the two are copies of one config");
  root.unused({copy}, "copies of the towers' configs that older transformers versions wrote");
}

ModelSpec import_clip(const Reader& root, bool siglip) {
  config_dict_copy(root, "vision_config_dict", "vision_config");
  config_dict_copy(root, "text_config_dict", "text_config");
  ModelSpec model;
  model.modules = {vit_module(root.sub("vision_config"), siglip)};
  root.leave_out("text_config",
                 "the text tower, which a VLM does not run (the vision tower alone is imported)");
  root.leave_out("projection_dim", "the projection into the joint text-image space");
  return model;
}

namespace {

// timm's SigLIP towers that MiniCPM-V 2.0 names instead of describing (vision_encoder), with
// timm's sizes: no class token, a biased patch convolution, learned positions for the square
// input, a final norm (the attention-pooling head is replaced by an identity).
struct TimmTower {
  const char* name;
  int64_t width, depth, ffn, heads, patch, image;
};
constexpr TimmTower kTimmTowers[] = {
    {"vit_so400m_patch14_siglip_384", 1152, 27, 4304, 16, 14, 384},
    {"vit_so400m_patch14_siglip_224", 1152, 27, 4304, 16, 14, 224},
};

}  // namespace

ModelSpec import_minicpmv(const Reader& root) {
  // Versions differ in the tower's description and the LLM: 2.0 names a timm tower and stores
  // its resampler's position table with the weights; 2.6 (and MiniCPM-o 2.6) has a Qwen2 LLM,
  // 2.0 (MiniCPM-2.4B), 2.5 (Llama 3) and 4.0 (MiniCPM4) Llama-shaped ones.
  const bool timm = root.has("vision_encoder");
  double version = timm ? 2.0 : 2.5;
  if (const Json* v = root.raw("version")) {
    if (v->is_string()) {
      try {
        version = std::stod(v->get<std::string>());
      } catch (const std::exception&) {
        root.error("version", "'" + v->get<std::string>() + "' is not a version number");
      }
    } else {
      version = root.get_double("version", version);
    }
  }
  const bool qwen2 = version >= 2.6 && version < 3;
  ModuleSpec llm = llm_module(root, qwen2 ? "qwen2" : "llama");
  root.require("mlp_bias", false, "biases on the language model's MLP linears");
  // MiniCPM's muP scalars (embeddings scaled by scale_emb, residuals by scale_depth / sqrt(layers),
  // logits by hidden / dim_model_base): no parameter, no work to speak of.
  root.known({"scale_emb", "scale_depth", "dim_model_base"});
  // Image-boundary and image-id markers are text tokens; vision_batch_size and
  // batch_vision_input set how inference batches the slices through the tower.
  root.known({"mm_use_im_start_end", "use_image_id"});
  root.unused({"vision_batch_size", "batch_vision_input"},
              "how inference batches the slices through the vision tower");

  ModuleSpec vision;
  if (timm) {
    const std::string name = root.get_string("vision_encoder", "");
    const std::string base = name.substr(0, name.find('.'));  // the pretrained tag after '.'
    const auto t = std::find_if(std::begin(kTimmTowers), std::end(kTimmTowers),
                                [&](const TimmTower& x) { return base == x.name; });
    if (t == std::end(kTimmTowers)) {
      root.error("vision_encoder", "timm tower '" + name + "' has no sizes here (known: " +
                                       std::string(kTimmTowers[0].name) + ", " +
                                       kTimmTowers[1].name + ")");
      return {};
    }
    Diagnostics none;
    const Json tower{{"hidden_size", t->width},         {"num_hidden_layers", t->depth},
                     {"num_attention_heads", t->heads}, {"intermediate_size", t->ffn},
                     {"patch_size", t->patch},          {"image_size", t->image}};
    vision = vit_module(Reader(tower, "", none), true);
  } else {
    vision = vit_module(root.sub("vision_config"), true);
  }
  TransformerArch& tower = *vision.transformer;
  // The remote code drops the tower's last layer when asked (2.0 does).
  if (root.get_bool("drop_vision_last_layer", false)) --tower.layers;
  // LLaVA-UHD slicing: an image of more than one scale_resolution² area is cut into up to
  // max_slice_nums slices of about that area, each through the tower, and the whole image
  // downscaled beside them; each becomes query_num tokens. Tiles of scale_resolution stand for
  // the slices (their aspect follows the image's; the area is the same).
  Patching& p = *vision.patching;
  const Reader slices = root.sub("slice_config");
  slices.known({"model_type"});
  slices.alias("patch_size", p.patch_size, "vision_config.patch_size");
  root.alias("patch_size", p.patch_size, "vision_config.patch_size");
  const int64_t side = slices.has("scale_resolution") ? slices.get("scale_resolution", 448)
                                                      : root.get("scale_resolution", 448);
  root.known({"image_size"});  // the processor's default side, which scale_resolution repeats
  p.resize = ResizeMode::kTiles;
  p.tile_size = side;
  p.image_size = 0;
  p.thumbnail = true;
  p.max_tiles = root.get_bool("slice_mode", true)
                    ? (slices.has("max_slice_nums") ? slices.get("max_slice_nums", 9)
                                                    : root.get("max_slice_nums", 9))
                    : 1;
  if (p.patch_size < 1 || side % p.patch_size != 0)
    root.error("scale_resolution", std::to_string(side) + " is not a multiple of the patch size " +
                                       std::to_string(p.patch_size));

  const int64_t h = llm.transformer->hidden;
  // The resampler at the LLM's width with heads of 128, then its output matrix (proj, no bias).
  ModuleSpec projector =
      projector_module("vision_projector", "vision", tower.hidden, h, h, 1, false);
  ProjectorArch& r = *projector.projector;
  r.bias = false;
  r.queries = root.get("query_num", 64);
  if (r.queries < 1) root.error("query_num", "must be positive");
  r.query_heads = std::max<int64_t>(1, h / 128);
  r.query_positions = timm;
  return vlm(std::move(vision), std::move(projector), std::move(llm));
}

}  // namespace tessera::hf

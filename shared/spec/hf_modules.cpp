#include "shared/spec/hf_modules.hpp"

#include <cmath>

namespace tessera::hf {

namespace {

// Decoder-only LLM defaults of HF's config classes, for sparse text_config blocks (llava-hf,
// Gemma 3), and what the family always has.
struct LlmDefaults {
  int64_t hidden, ffn, layers, heads, kv_heads, vocab;
  bool qkv_bias = false;
  int64_t head_dim = 0;  // 0: hidden / heads
  bool tied = false;
  bool qk_norm = false;
  bool post_norms = false;
};
LlmDefaults llm_defaults(const std::string& model_type) {
  if (model_type == "mistral") return {4096, 14336, 32, 32, 8, 32000};
  if (model_type == "qwen2") return {4096, 22016, 32, 32, 32, 151936, true};
  // Qwen3: per-head query/key norms, no q/k/v biases, head_dim 128 whatever the width.
  if (model_type == "qwen3") return {4096, 12288, 36, 32, 8, 151936, false, 128, false, true};
  if (model_type == "internlm2") return {4096, 11008, 32, 32, 32, 103168};
  if (model_type == "phi3") return {3072, 8192, 32, 32, 32, 32064};
  if (model_type == "gemma") return {3072, 24576, 28, 16, 16, 256000, false, 256, true};
  // Gemma 2 and 3: four norms per layer; Gemma 3 normalizes queries and keys too.
  if (model_type == "gemma2") return {2304, 9216, 26, 8, 4, 256000, false, 256, true, false, true};
  if (model_type == "gemma3_text")
    return {2304, 9216, 26, 8, 4, 262208, false, 256, true, true, true};
  return {4096, 11008, 32, 32, 32, 32000};  // llama (Vicuna, Llama 2)
}

}  // namespace

ModuleSpec llm_module(const Reader& r, const std::string& model_type) {
  const LlmDefaults d = llm_defaults(model_type);
  TransformerArch a;
  a.hidden = r.get("hidden_size", d.hidden);
  a.ffn = r.get("intermediate_size", d.ffn);
  a.layers = r.get("num_hidden_layers", d.layers);
  a.heads = r.get("num_attention_heads", d.heads);
  a.kv_heads = r.get("num_key_value_heads", a.heads == d.heads ? d.kv_heads : a.heads);
  a.head_dim = r.get("head_dim", d.head_dim > 0 ? d.head_dim
                                 : a.heads > 0  ? a.hidden / a.heads
                                                : 0);
  a.vocab = r.get("vocab_size", d.vocab);
  a.gated_ffn = true;
  a.tied_embeddings = r.get_bool("tie_word_embeddings", d.tied);
  a.qk_norm = d.qk_norm;
  a.post_norms = d.post_norms;
  a.qkv_bias = model_type == "qwen2" || model_type == "qwen2_vl" || model_type == "qwen2_5_vl" ||
               r.get_bool("attention_bias", false) || d.qkv_bias;
  a.norm = NormKind::kRmsNorm;
  // Attention within a sliding window, where a config turns one on, is priced as full attention
  // (an upper bound); multimodal rotary positions (use_mrope) change no parameter or FLOP.
  r.known({"sliding_window", "use_sliding_window", "use_mrope", "sliding_window_pattern",
           "layer_types"});
  // Gemma's logit soft-capping, attention scale and local rotary base: no parameter, no FLOP
  // to speak of.
  r.known({"attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar",
           "cache_implementation"});
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

ModuleSpec vit_module(const Reader& v, bool siglip) {
  TransformerArch a = encoder_arch(v.get("num_hidden_layers", 12), v.get("hidden_size", 768),
                                   v.get("num_attention_heads", 12),
                                   v.get("intermediate_size", 3072), NormKind::kLayerNorm);
  Patching p;
  // The CLIP/SigLIP projection of the pooled output into the joint text-image space: a VLM
  // takes the patch features before it.
  v.leave_out("projection_dim",
              "the projection into the joint text-image space, which a VLM "
              "does not run");
  v.known({"vocab_size"});  // a vision tower has no vocabulary: a serialization leftover
  p.patch_size = v.get("patch_size", siglip ? 16 : 32);
  p.in_channels = v.get("num_channels", 3);
  p.image_size = v.get("image_size", 224);
  p.resize = ResizeMode::kFixed;
  p.class_token = !siglip;
  // CLIP: a patch convolution without bias, and a norm (pre_layrnorm) before the first layer.
  p.conv_bias = siglip;
  p.pre_norm = !siglip;
  // SigLIP's attention-pooling head: a VLM takes the patch features before it.
  if (v.get_bool("vision_use_head", false))
    v.leave_out("vision_use_head",
                "the attention-pooling head of the vision tower, which a VLM "
                "does not run");
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

ModuleSpec whisper_encoder(const Reader& r, int64_t mel_bins) {
  TransformerArch a = encoder_arch(r.get("encoder_layers", 32), r.get("d_model", 1280),
                                   r.get("encoder_attention_heads", 20),
                                   r.get("encoder_ffn_dim", 5120), NormKind::kLayerNorm);
  a.positions = r.get("max_source_positions", 1500);
  a.key_bias = false;  // Whisper's k_proj has no bias
  // WhisperConfig writes its encoder depth twice.
  r.alias("num_hidden_layers", a.layers, "encoder_layers");
  // The audio-classification head of WhisperForAudioClassification, and the median filter that
  // smooths word timestamps at inference.
  r.leave_out("classifier_proj_size",
              "the audio-classification head, which neither transcription nor a speech-LLM runs");
  r.unused({"median_filter_width"}, "the smoothing of word timestamps at inference");
  // scale_embedding multiplies the input by sqrt(d_model): no parameters, no work to speak of.
  r.known({"scale_embedding"});
  AudioFrontEnd fe;
  fe.mel_bins = r.get("num_mel_bins", mel_bins);
  fe.max_seconds = static_cast<double>(a.positions * fe.downsampling) /
                   static_cast<double>(fe.frames_per_second);
  ModuleSpec audio = encoder_module("audio", Modality::kAudio, a);
  audio.audio = fe;
  return audio;
}

}  // namespace tessera::hf

// The model families `tessera import-hf` reads: each assembles a ModelSpec from one config.json
// shape, module by module (hf_modules.hpp), and names what it leaves out.
#pragma once

#include "shared/spec/hf_reader.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera::hf {

// Qwen2-VL (flat: LLM keys at the top level) and Qwen2.5-VL.
ModelSpec import_qwen_vl(const Reader& root, bool qwen25);
// Qwen3-VL (dense): the native-resolution ViT with DeepStack mergers and a Qwen3 LLM.
ModelSpec import_qwen3_vl(const Reader& root);
// Qwen2.5-Omni's thinker: a Qwen2.5-VL vision tower, a windowed Whisper-style audio encoder and
// a Qwen2 LLM (the talker and the waveform generator are left out).
ModelSpec import_qwen_omni(const Reader& root);
// LLaVA-1.5 and LLaVA-NeXT (anyres tiles).
ModelSpec import_llava(const Reader& root, bool next);
// LLaVA-OneVision: LLaVA-NeXT's tiles with a SigLIP tower, the features of at most N tiles
// (anyres_max_N) reaching a Qwen2 LLM.
ModelSpec import_llava_next_video(const Reader& root);
ModelSpec import_mistral3(const Reader& root);
ModelSpec import_llava_onevision(const Reader& root);
// InternVL: the remote-code shape (llm_config) and the hf one (text_config).
ModelSpec import_internvl(const Reader& root, bool remote_code);
// Llama 3.2 Vision (Mllama): cross-attention to tiled images.
ModelSpec import_mllama(const Reader& root);
// Whisper's encoder.
ModelSpec import_whisper(const Reader& root);
// Qwen2-Audio: a Whisper encoder, pooled 2:1, a linear projector and a Qwen2 LLM.
ModelSpec import_qwen2_audio(const Reader& root);
// Gemma 3: a SigLIP tower pooled to 256 tokens an image, a normalized linear projection and a
// Gemma 3 LLM.
ModelSpec import_gemma3(const Reader& root);
ModelSpec import_llama4(const Reader& root);
// PaliGemma (1 and 2): a SigLIP tower, a linear projection and a Gemma LLM.
ModelSpec import_paligemma(const Reader& root);
// Phi-3-vision and Phi-3.5-vision: CLIP ViT-L/14-336 crops merged 2 x 2, an MLP with learned
// separators, and a Phi-3 LLM.
ModelSpec import_phi3_vision(const Reader& root);
// Idefics3 and SmolVLM: SigLIP tiles pixel-shuffled into a linear projection, and a Llama LLM.
ModelSpec import_idefics3(const Reader& root);
// DeepSeek-VL2: SigLIP-SO400M tiles merged 2 x 2 into an MLP, and a DeepSeekMoE LLM whose first
// layers are dense.
ModelSpec import_deepseek_vl2(const Reader& root);
// Kimi-VL: MoonViT at native resolution merged 2 x 2 into an MLP, and a DeepSeek-V3 MoE LLM with
// multi-head latent attention.
ModelSpec import_kimi_vl(const Reader& root);
// MiniCPM-V (2.0, Llama3-V 2.5, 2.6, 4.0): a SigLIP-400M tower over the image and its slices,
// a resampler of query_num learned queries per slice, and the LLM flat at the top level.
ModelSpec import_minicpmv(const Reader& root);
// CLIP's or SigLIP's vision tower, from the two-tower config.
ModelSpec import_clip(const Reader& root, bool siglip);

}  // namespace tessera::hf

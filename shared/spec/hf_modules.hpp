// Tessera modules built from the blocks of a HuggingFace config.json: the LLM decoders, vision
// and audio encoders and projectors that the model families of hf_families.cpp assemble. Each
// reads its block's keys with the defaults of the transformers config class it mirrors.
#pragma once

#include <string>

#include "shared/spec/hf_reader.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera::hf {

// A decoder-only LLM block (text_config, llm_config, or the top level of a flat config) of
// transformers type `model_type` ("llama", "qwen2", "mistral", ...), whose defaults fill keys
// the block leaves out.
ModuleSpec llm_module(const Reader& r, const std::string& model_type);

// The bias-everywhere encoder stack shared by ViT, InternViT and Whisper towers.
TransformerArch encoder_arch(int64_t layers, int64_t hidden, int64_t heads, int64_t ffn,
                             NormKind norm);
ModuleSpec encoder_module(const std::string& name, Modality modality, const TransformerArch& arch);

// A CLIP or SigLIP vision tower (fixed square input), without its pooling head.
ModuleSpec vit_module(const Reader& v, bool siglip);

// A Whisper-style audio encoder (two convolutions over log-mel frames, learned positions);
// `mel_bins` is the config class's default for num_mel_bins.
ModuleSpec whisper_encoder(const Reader& r, int64_t mel_bins);

ModuleSpec projector_module(const std::string& name, const std::string& input, int64_t in,
                            int64_t hidden, int64_t out, int64_t layers, bool input_norm);

// An encoder -> projector -> LLM model.
ModelSpec vlm(ModuleSpec vision, ModuleSpec projector, ModuleSpec llm);

}  // namespace tessera::hf

// Small models the IR tests share, as model JSON.
#pragma once

namespace tessera::test {

// A text-only GPT-like model (no media) so every micro-batch does identical work.
inline constexpr const char* kTextModel = R"({"name": "gpt", "modules": [
  {"name": "llm", "role": "llm", "transformer": {"layers": 8, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1000}}]})";
// A vision-language model with a frozen ViT, a projector and a GQA LLM.
inline constexpr const char* kVlm = R"({"name": "vlm", "modules": [
  {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
   "transformer": {"layers": 4, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm"},
   "patching": {"patch_size": 8, "resize": "fixed", "image_size": 64}},
  {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 128, "out": 256}},
  {"name": "llm", "role": "llm", "inputs": ["proj"],
   "transformer": {"layers": 8, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 688, "gated_ffn": true, "vocab": 1000}}]})";

}  // namespace tessera::test

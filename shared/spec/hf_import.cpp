#include "shared/spec/hf_import.hpp"

#include <algorithm>
#include <filesystem>

#include "shared/spec/hf_families.hpp"
#include "shared/spec/hf_modules.hpp"
#include "shared/spec/hf_reader.hpp"

namespace tessera {

namespace {

using hf::Reader;

ModelSpec tower(ModuleSpec module) {
  ModelSpec model;
  model.modules = {std::move(module)};
  return model;
}

// model_type -> the family that imports it.
struct Family {
  const char* type;
  ModelSpec (*import)(const Reader& root);
};
constexpr Family kFamilies[] = {
    {"qwen2_vl", [](const Reader& r) { return hf::import_qwen_vl(r, false); }},
    {"qwen2_5_vl", [](const Reader& r) { return hf::import_qwen_vl(r, true); }},
    {"qwen3_vl", hf::import_qwen3_vl},
    {"qwen3_vl_moe", hf::import_qwen3_vl},
    {"llava", [](const Reader& r) { return hf::import_llava(r, false); }},
    {"llava_next", [](const Reader& r) { return hf::import_llava(r, true); }},
    {"llava_next_video", hf::import_llava_next_video},
    {"mistral3", hf::import_mistral3},
    {"llava_onevision", hf::import_llava_onevision},
    {"internvl_chat", [](const Reader& r) { return hf::import_internvl(r, true); }},
    {"internvl", [](const Reader& r) { return hf::import_internvl(r, false); }},
    {"mllama", hf::import_mllama},
    {"whisper", hf::import_whisper},
    {"qwen2_audio", hf::import_qwen2_audio},
    {"qwen2_5_omni", hf::import_qwen_omni},
    {"gemma3", hf::import_gemma3},
    {"llama4", hf::import_llama4},
    {"paligemma", hf::import_paligemma},
    {"phi3_v", hf::import_phi3_vision},
    {"idefics3", hf::import_idefics3},
    {"deepseek_vl_v2", hf::import_deepseek_vl2},
    {"kimi_vl", hf::import_kimi_vl},
    {"minicpmv", hf::import_minicpmv},
    {"smolvlm", hf::import_idefics3},
    {"siglip", [](const Reader& r) { return hf::import_clip(r, true); }},
    {"siglip_vision_model", [](const Reader& r) { return tower(hf::vit_module(r, true)); }},
    {"clip", [](const Reader& r) { return hf::import_clip(r, false); }},
    {"clip_vision_model", [](const Reader& r) { return tower(hf::vit_module(r, false)); }},
};

// Families people train whose checkpoints have parts the IR cannot express. They are refused
// naming the missing part rather than imported as an approximation.
struct Inexpressible {
  const char* type;
  const char* family;
  const char* missing;
};
constexpr const char* kGlmProjector =
    "its projector merges 2x2 patches by a biased convolution, then a square linear, a "
    "LayerNorm and GELU, then a SwiGLU MLP as wide as the decoder's; the IR's projector is one "
    "MLP behind an optional bias-free merge";
constexpr const char* kMolmoConnector =
    "its config.json describes only the decoder (the vision encoder is fixed in its remote "
    "code), and its connector pools each 2x2 patch window by attention, which the IR's projector "
    "cannot express";
constexpr const char* kPhi4Adapters =
    "it adapts one decoder to each modality with its own LoRA adapters, and its audio encoder "
    "is a conformer (convolution modules between attention layers)";
constexpr Inexpressible kInexpressible[] = {
    {"glm4v", "GLM-4.1V", kGlmProjector},
    {"glm4v_moe", "GLM-4.5V", kGlmProjector},
    {"minicpmo", "MiniCPM-o",
     "its speech decoder (ChatTTS, tts_config) trains with the LLM end to end on the LLM's "
     "hidden states, and its Whisper encoder streams audio in chunks (chunk_input); the IR has "
     "neither (MiniCPM-V, the same vision path without them, imports)"},
    {"molmo", "Molmo", kMolmoConnector},
    {"molmoe", "MolmoE", kMolmoConnector},
    {"aria", "Aria",
     "its projector maps the patches to a fixed number of learned queries by cross-attention "
     "(projector_patch_to_query_dict); the IR's projector has no attention"},
    {"gemma3n", "Gemma 3n",
     "its vision encoder is convolutional (MobileNet-V5), its audio encoder a conformer, and its "
     "decoder adds per-layer input embeddings, AltUp and LAuReL blocks and KV-cache sharing, none "
     "of which the IR's transformer stack expresses"},
    {"gemma4", "Gemma 4",
     "its decoder adds per-layer input embeddings (hidden_size_per_layer_input) and shares "
     "keys and values across layers (num_kv_shared_layers), which the IR's transformer stack "
     "does not express"},
    {"phi4mm", "Phi-4-multimodal", kPhi4Adapters},
    {"phi4_multimodal", "Phi-4-multimodal", kPhi4Adapters},
    {"lfm2_vl", "LFM2-VL",
     "most of its decoder's layers are short gated convolutions (layer_types 'conv'), not "
     "attention, which the IR's transformer stack does not express"},
    {"qwen3_5", "Qwen3.5",
     "most of its layers are linear attention (Gated DeltaNet, layer_types "
     "'linear_attention'), which the IR's attention does not express"},
};

}  // namespace

const std::vector<std::string>& supported_hf_model_types() {
  static const std::vector<std::string> types = [] {
    std::vector<std::string> out;
    for (const Family& f : kFamilies) out.emplace_back(f.type);
    return out;
  }();
  return types;
}

std::optional<ModelSpec> import_hf_config(const Json& config, const std::string& file,
                                          const HfImportOptions& options, Diagnostics& diag,
                                          HfImportNotes* notes) {
  const std::size_t before = diag.errors().size();
  if (!config.is_object()) {
    diag.error(file, "", "expected a JSON object, got " + json_type_name(config));
    return std::nullopt;
  }
  const Reader root(config, file, diag);
  const std::string type = root.get_string("model_type", "");
  const auto family = std::find_if(std::begin(kFamilies), std::end(kFamilies),
                                   [&](const Family& f) { return type == f.type; });
  if (family == std::end(kFamilies)) {
    const auto known = std::find_if(std::begin(kInexpressible), std::end(kInexpressible),
                                    [&](const Inexpressible& f) { return type == f.type; });
    if (known != std::end(kInexpressible)) {
      diag.error(
          file, "model_type",
          std::string(known->family) + " ('" + type + "') is not imported: " + known->missing);
      return std::nullopt;
    }
    std::string message = type.empty() ? "no model_type" : "unsupported model_type '" + type + "'";
    message += "; supported: ";
    const auto& types = supported_hf_model_types();
    for (std::size_t i = 0; i < types.size(); ++i) message += (i ? ", " : "") + types[i];
    diag.error(file, "model_type", message);
    return std::nullopt;
  }
  ModelSpec model = family->import(root);
  std::optional<bool> tied;
  for (const ModuleSpec& m : model.modules)
    if (m.role == ModuleRole::kLlm && m.transformer) tied = m.transformer->tied_embeddings;
  hf::Ledger& ledger = root.ledger();
  hf::check_unread(ledger, file, type, tied, diag);
  if (notes != nullptr) {
    notes->left_out = ledger.left_out;
    notes->unused.clear();
    for (const auto& [why, paths] : ledger.unused) {
      std::string line;
      for (const std::string& p : paths) line += (line.empty() ? "" : ", ") + p;
      notes->unused.push_back(line + ": " + why);
    }
  }
  // Name: the checkpoint's _name_or_path when it is a Hub id ("org/model"); else the file's name,
  // or its folder's when the file is a checkpoint's config.json. A local path the checkpoint was
  // saved from ("/raid/user/ov-500") names a machine, not the model.
  const std::filesystem::path path(file);
  std::string name = root.get_string("_name_or_path", "");
  if (name.starts_with("/") || name.starts_with(".") || name.starts_with("~")) name.clear();
  if (name.empty())
    name = path.filename() == "config.json" ? path.parent_path().filename().string()
                                            : path.stem().string();
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
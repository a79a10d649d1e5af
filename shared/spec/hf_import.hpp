// Import of HuggingFace config.json files into a ModelSpec (docs/ALGORITHMS.md §7).
// Supported model_type values are listed by supported_hf_model_types(); the shapes handled are
// flat (Qwen2-VL: LLM keys at top level + vision_config) and nested (text_config /
// vision_config / audio_config, or InternVL's remote-code llm_config).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/spec/model_spec.hpp"

namespace tessera {

struct HfImportOptions {
  std::vector<std::string> freeze;  // module names to mark frozen ("vision", "llm", ...)
};

const std::vector<std::string>& supported_hf_model_types();

// nullopt when the config cannot be imported; every problem is in `diag`, naming `file` and
// the JSON path of the offending key. A key that shapes the architecture and that the import
// does not read is such a problem. `left_out` (optional) gets the parts of the checkpoint a
// training run does not hold and that the model leaves out, each as "json.path: why".
std::optional<ModelSpec> import_hf_config(const Json& config, const std::string& file,
                                          const HfImportOptions& options, Diagnostics& diag,
                                          std::vector<std::string>* left_out = nullptr);

}  // namespace tessera

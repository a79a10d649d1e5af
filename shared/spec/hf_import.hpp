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

// What an import did not take from the config, for its summary.
struct HfImportNotes {
  // Parts of the checkpoint that a training run does not hold, left out of the model, each as
  // "json.path: why".
  std::vector<std::string> left_out;
  // Keys accepted without being read because their values change nothing the import builds,
  // grouped by reason: "text_config.num_beams, vision_config.top_k: why".
  std::vector<std::string> unused;
};

// nullopt when the config cannot be imported; every problem is in `diag`, naming `file` and
// the JSON path of the offending key. A key that the import does not read and whose value would
// change the network it builds is such a problem. `notes` (optional) gets what the model leaves
// out and the keys accepted unread.
std::optional<ModelSpec> import_hf_config(const Json& config, const std::string& file,
                                          const HfImportOptions& options, Diagnostics& diag,
                                          HfImportNotes* notes = nullptr);

}  // namespace tessera

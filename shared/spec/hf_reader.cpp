#include "shared/spec/hf_reader.hpp"

#include <algorithm>
#include <array>

namespace tessera::hf {

Reader::Reader(const Json& config, std::string file, Diagnostics& diag)
    : Reader(&config, std::move(file), "", diag, std::make_shared<Ledger>()) {}

Reader::Reader(const Json* json, std::string file, std::string path, Diagnostics& diag,
               std::shared_ptr<Ledger> ledger)
    : json_(json),
      file_(std::move(file)),
      path_(std::move(path)),
      diag_(&diag),
      ledger_(std::move(ledger)) {
  if (json_ != nullptr) ledger_->blocks.emplace(path_, json_);
}

namespace {
bool looks_architectural(std::string_view key);
}  // namespace

void Reader::mark(std::string_view key) const {
  ledger_->read.insert(join_path(path_, key));
}

bool Reader::has(std::string_view key) const {
  mark(key);
  return json_ != nullptr && json_->contains(key) && !(*json_)[std::string(key)].is_null();
}

const Json* Reader::raw(std::string_view key) const {
  return has(key) ? &(*json_)[std::string(key)] : nullptr;
}

int64_t Reader::get(std::string_view key, int64_t fallback) const {
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

double Reader::get_double(std::string_view key, double fallback) const {
  const Json* v = raw(key);
  double out = fallback;
  if (v != nullptr) read_value(*v, file_, join_path(path_, key), out, *diag_);
  return out;
}

bool Reader::get_bool(std::string_view key, bool fallback) const {
  const Json* v = raw(key);
  bool out = fallback;
  if (v != nullptr) read_value(*v, file_, join_path(path_, key), out, *diag_);
  return out;
}

std::string Reader::get_string(std::string_view key, std::string fallback) const {
  const Json* v = raw(key);
  std::string out = std::move(fallback);
  if (v != nullptr) read_value(*v, file_, join_path(path_, key), out, *diag_);
  return out;
}

Reader Reader::sub(std::string_view key) const {
  const Json* v = raw(key);
  if (v != nullptr && !v->is_object()) {
    diag_->error(file_, join_path(path_, key), "expected an object, got " + json_type_name(*v));
    v = nullptr;
  }
  return Reader(v, file_, join_path(path_, key), *diag_, ledger_);
}

void Reader::known(std::initializer_list<std::string_view> keys) const {
  for (const std::string_view key : keys) mark(key);
}

void Reader::leave_out(std::string_view key, const std::string& why) const {
  // A key the family read is used, not left out.
  const std::string at = join_path(path_, key);
  if (ledger_->read.contains(at) || !has(key)) return;
  // Everything under it counts as read: the part is left out whole.
  ledger_->read.insert(at);
  ledger_->left_out.push_back(at + ": " + why);
  if (const Json* v = raw(key); v->is_object()) ledger_->blocks.erase(at);
}

void Reader::leave_out(std::initializer_list<std::string_view> keys, const std::string& why) const {
  std::string present;
  for (const std::string_view key : keys)
    if (has(key)) present += (present.empty() ? "" : ", ") + join_path(path_, key);
  if (!present.empty()) ledger_->left_out.push_back(present + ": " + why);
}

void Reader::alias(std::string_view key, int64_t value, std::string_view read_as) const {
  if (!has(key)) return;
  if (const int64_t v = get(key, value); v != value)
    error(key, std::to_string(v) + " differs from " + join_path(path_, read_as) + " = " +
                   std::to_string(value) + ", which the import reads: the two name one size");
}

void Reader::unused(std::initializer_list<std::string_view> keys, const std::string& why) const {
  for (const std::string_view key : keys)
    if (has(key)) ledger_->unused[why].push_back(join_path(path_, key));
}

void Reader::repeated_in(const Reader& block) const {
  if (json_ == nullptr || block.json_ == nullptr) return;
  for (const auto& [key, value] : json_->items()) {
    const std::string at = join_path(path_, key);
    if (ledger_->read.contains(at) || !block.json_->contains(key) || !looks_architectural(key))
      continue;
    const Json& copy = (*block.json_)[key];
    mark(key);
    // A null in the block is the block's class clearing a setting that is off there (Qwen2.5-VL's
    // text config drops sliding_window when use_sliding_window is false).
    if (copy == value || copy.is_null())
      ledger_
          ->unused["the language model's keys, repeated at the top level (" + block.path_ +
                   " is read)"]
          .push_back(at);
    else
      error(key, value.dump() + " differs from " + join_path(block.path_, key) + " = " +
                     copy.dump() + ": the two are copies of one setting");
  }
}

void Reader::require(std::string_view key, const Json& built, const std::string& why) const {
  if (const Json* v = raw(key); v != nullptr && *v != built)
    error(key, v->dump() + ": " + why + " (the import builds " + built.dump() + ")");
}

void Reader::error(std::string_view key, const std::string& message) const {
  diag_->error(file_, join_path(path_, key), message);
}

void Reader::refuse(std::string_view key, const std::string& message) const {
  error(key, message);
  // This object and every object under it.
  std::erase_if(ledger_->blocks, [&](const auto& block) {
    return path_.empty() || block.first == path_ || block.first.starts_with(path_ + ".");
  });
}

namespace {

// Whether a key's name says it sizes or switches part of the network.
bool looks_architectural(std::string_view key) {
  static constexpr std::array<std::string_view, 26> kParts = {
      "layer",  "head",  "hidden", "intermediate", "expert",  "vocab", "embed", "width", "depth",
      "window", "pool",  "merge",  "patch",        "channel", "ffn",   "mlp",   "proj",  "router",
      "topk",   "top_k", "shared", "dense",        "lora",    "bias",  "_dim",  "config"};
  if (key.starts_with("num_") || key.starts_with("n_") || key.ends_with("_size") ||
      key.ends_with("_ratio") || key.starts_with("tie_") || key.starts_with("use_"))
    return true;
  return std::any_of(kParts.begin(), kParts.end(),
                     [&](std::string_view part) { return key.find(part) != std::string::npos; });
}

// Keys of that look that change neither the parameters nor the work per token as Tessera
// models them (activations, dropout, limits and ids, generation and export settings).
bool known_harmless(std::string_view key) {
  static constexpr std::array<std::string_view, 18> kExact = {"hidden_act",
                                                              "projector_hidden_act",
                                                              "max_position_embeddings",
                                                              "use_cache",
                                                              "use_return_dict",
                                                              "output_hidden_states",
                                                              "initializer_range",
                                                              "layerdrop",
                                                              "encoder_layerdrop",
                                                              "decoder_layerdrop",
                                                              "use_weighted_layer_sum",
                                                              "tie_encoder_decoder",
                                                              "image_seq_length",
                                                              "vision_feature_layer",
                                                              "vision_feature_select_strategy",
                                                              "use_bfloat16",
                                                              "hidden_activation",
                                                              "max_window_layers"};
  if (std::find(kExact.begin(), kExact.end(), key) != kExact.end()) return true;
  return key.ends_with("max_position_embeddings") || key.ends_with("_dropout") ||
         key.ends_with("_dropout_prob") || key.ends_with("_init_value") ||
         key.ends_with("dropout_rate") || key.ends_with("_eps") || key.ends_with("_token_id") ||
         key.ends_with("_token_index") || key.ends_with("_act") || key.starts_with("rope_") ||
         key.starts_with("initializer_") || key.starts_with("output_") ||
         key.starts_with("use_flash");
}

// What an unread key known by name does at its value: an attribute every config class inherits
// from PretrainedConfig, or a setting of the training code that wrote the config.
struct Verdict {
  bool known = false;   // the key is such an attribute
  std::string why;      // when its value changes nothing: why (the `unused` group)
  std::string problem;  // when it changes the network: the error
};

Verdict known_attribute(std::string_view key, const Json& value, bool root, bool has_experts,
                        std::optional<bool> tied_llm) {
  // Settings of generate(): the network is the same whatever they say. An MoE block's top_k
  // could be read as its routing width by someone, so there only the default passes.
  static constexpr std::array<std::string_view, 6> kGeneration = {"num_beams",
                                                                  "num_beam_groups",
                                                                  "num_return_sequences",
                                                                  "no_repeat_ngram_size",
                                                                  "encoder_no_repeat_ngram_size",
                                                                  "top_k"};
  static const std::string kGenerationWhy =
      "generation settings every config class inherits; generate() alone reads them";
  if (std::find(kGeneration.begin(), kGeneration.end(), key) != kGeneration.end()) {
    if (key == "top_k" && has_experts && !(value.is_number_integer() && value == 50))
      return {true, "",
              "top_k beside experts: the import reads the routing width from "
              "num_experts_per_tok, and refuses a top_k that may mean it"};
    return {true, kGenerationWhy, ""};
  }
  if (key == "ep_size" || key == "use_deepep" || key == "use_fa3")
    return {true,
            "settings of the training code (its expert-parallel size, DeepEP, FlashAttention 3), "
            "not of the network",
            ""};
  if (key == "quantization_config" && root)
    return {true,
            "the checkpoint's storage format (quantized weights): the network is the same, and "
            "trains in the plan's precision",
            ""};
  if (key == "transformers.js_config")
    return {true, "settings of transformers.js, an inference runtime, for its exported weights",
            ""};
  if (key == "chunk_size_feed_forward")
    return {true, "feed-forward chunking, which trades memory for nothing in the network", ""};
  if (key == "pruned_heads") {
    if (value.empty()) return {true, "inherited attributes at their defaults", ""};
    return {true, "",
            "heads pruned from layers " + value.dump() +
                ": the import builds every head of every layer"};
  }
  if (key == "add_cross_attention") {
    if (value == false) return {true, "inherited attributes at their defaults", ""};
    return {true, "", "cross-attention added to every layer is not imported"};
  }
  if (key == "tie_word_embeddings") {
    // Every language-model reader reads its block's switch, so an unread one sits in a block
    // without an output layer (a vision or audio tower), where it ties nothing. At the top of a
    // composite config it is the model's: it must agree with the language model's own.
    if (!root) return {true, "output tying in a block without an output layer", ""};
    if (!value.is_boolean()) return {true, "", "expected true or false, got " + value.dump()};
    if (!tied_llm.has_value()) return {true, "output tying in a model without an output layer", ""};
    if (value.get<bool>() == *tied_llm)
      return {true, "the model's output tying, which the language model's own switch repeats", ""};
    return {true, "",
            std::string(value.get<bool>() ? "true" : "false") +
                ", but the language model's block says " + (*tied_llm ? "true" : "false") +
                ": which of the two ties the output layer depends on the transformers version; "
                "refusing rather than guessing"};
  }
  return {};
}

}  // namespace

void check_unread(Ledger& ledger, const std::string& file, const std::string& model_type,
                  std::optional<bool> tied_llm, Diagnostics& diag) {
  for (const auto& [path, json] : ledger.blocks) {
    const bool has_experts = json->contains("num_experts") || json->contains("num_local_experts") ||
                             json->contains("n_routed_experts");
    for (const auto& [key, value] : json->items()) {
      const std::string at = join_path(path, key);
      if (ledger.read.contains(at) || value.is_null()) continue;
      if (const Verdict v = known_attribute(key, value, path.empty(), has_experts, tied_llm);
          v.known) {
        // Listed when the key looks like a size or a switch of the network: the others were
        // never in question.
        if (v.problem.empty()) {
          if (looks_architectural(key)) ledger.unused[v.why].push_back(at);
        } else {
          diag.error(file, at, v.problem);
        }
        continue;
      }
      if (known_harmless(key) || !looks_architectural(key)) continue;
      diag.error(file, at,
                 "this key shapes the architecture, and the import of model_type '" + model_type +
                     "' does not read it: refusing rather than ignoring it");
    }
  }
}

}  // namespace tessera::hf

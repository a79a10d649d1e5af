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

void Reader::error(std::string_view key, const std::string& message) const {
  diag_->error(file_, join_path(path_, key), message);
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
         key.ends_with("dropout_rate") || key.ends_with("_eps") || key.ends_with("_token_id") ||
         key.ends_with("_token_index") || key.ends_with("_act") || key.starts_with("rope_") ||
         key.starts_with("initializer_") || key.starts_with("output_") ||
         key.starts_with("use_flash");
}

}  // namespace

void check_unread(const Ledger& ledger, const std::string& file, const std::string& model_type,
                  Diagnostics& diag) {
  for (const auto& [path, json] : ledger.blocks) {
    for (const auto& [key, value] : json->items()) {
      const std::string at = join_path(path, key);
      if (ledger.read.contains(at) || value.is_null() || known_harmless(key) ||
          !looks_architectural(key))
        continue;
      diag.error(file, at,
                 "this key shapes the architecture, and the import of model_type '" + model_type +
                     "' does not read it: refusing rather than ignoring it");
    }
  }
}

}  // namespace tessera::hf

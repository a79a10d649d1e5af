// Reading a HuggingFace config.json: typed keys with the config classes' defaults, every problem
// naming the file and JSON path, and a ledger of the keys read, so that a key which shapes the
// architecture but which no importer reads is an error rather than silently ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/diagnostics.hpp"
#include "shared/base/json_reader.hpp"

namespace tessera::hf {

// What one import read of a config: the keys consulted (full JSON paths), the objects it
// opened, the parts it left out on purpose with the reason, and the keys it accepted without
// reading them because their values change nothing it builds (grouped by that reason).
struct Ledger {
  std::set<std::string> read;
  std::map<std::string, const Json*> blocks;               // JSON path ("" for the root) -> object
  std::vector<std::string> left_out;                       // "text_config: CLIP's text tower, ..."
  std::map<std::string, std::vector<std::string>> unused;  // reason -> JSON paths
};

class Reader {
 public:
  // The root of `config` (an object), read from `file`.
  Reader(const Json& config, std::string file, Diagnostics& diag);

  // Whether `key` is present and not null; consulting a key counts as reading it.
  bool has(std::string_view key) const;
  const Json* raw(std::string_view key) const;

  // An integer (or the first of a [n, n] pair, as newer configs write image sizes).
  int64_t get(std::string_view key, int64_t fallback) const;
  double get_double(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key, std::string fallback) const;
  // A nested config; absent gives a reader that answers defaults.
  Reader sub(std::string_view key) const;

  // Keys the import knows and deliberately does not use, each with a reason in the caller's
  // comment (a cost the model does not price, a field the config class duplicates).
  void known(std::initializer_list<std::string_view> keys) const;
  // A part of the checkpoint that a training run of the model does not hold (a CLIP text tower,
  // a speech generator): recorded in the import's summary with `why`. Nothing when the key is
  // absent or already read.
  void leave_out(std::string_view key, const std::string& why) const;
  // The same for a part that is a set of keys of this object (Whisper's decoder sizes).
  void leave_out(std::initializer_list<std::string_view> keys, const std::string& why) const;

  // A key that repeats a size the import reads under another name (Whisper's num_hidden_layers
  // for encoder_layers, Qwen2-VL's spatial_patch_size for patch_size): accepted when it agrees
  // with `value`, the size read as `read_as`, an error naming both when it does not.
  void alias(std::string_view key, int64_t value, std::string_view read_as) const;
  // A key whose value changes nothing the import builds, for `why` (a part used only at
  // inference, a setting of the training loop): listed among the keys not used.
  void unused(std::initializer_list<std::string_view> keys, const std::string& why) const;
  // The keys of this object that `block` (a sub-config the import reads) repeats, as newer
  // transformers versions write a VLM's language-model keys at both levels: accepted where the
  // two agree, an error naming both where they do not.
  void repeated_in(const Reader& block) const;
  // A switch or count whose one value the import builds (InternVL's select_layer -1, LoRA off):
  // any other value is an error saying what it would change, `why`.
  void require(std::string_view key, const Json& built, const std::string& why) const;

  void error(std::string_view key, const std::string& message) const;
  // An error that refuses this whole object (a format the import does not read): its other keys,
  // and those of the objects under it, are not reported one by one.
  void refuse(std::string_view key, const std::string& message) const;
  Ledger& ledger() const { return *ledger_; }

 private:
  Reader(const Json* json, std::string file, std::string path, Diagnostics& diag,
         std::shared_ptr<Ledger> ledger);
  void mark(std::string_view key) const;

  const Json* json_;
  std::string file_;
  std::string path_;
  Diagnostics* diag_;
  std::shared_ptr<Ledger> ledger_;
};

// The keys of every object the import opened that look architectural (layer, head, width,
// expert, vocabulary, window, pooling, ... counts and switches) and were not read: each is an
// error when its value would change the network from what the import builds, and is recorded
// in the ledger's `unused` when it would not — a PretrainedConfig attribute every config class
// inherits, at a value that changes nothing (empty pruned_heads, generation settings, the
// output-tying switch of a block without an output layer). `tied_llm` is whether the imported
// language model ties its output layer to its input embedding (nullopt: the model has none).
void check_unread(Ledger& ledger, const std::string& file, const std::string& model_type,
                  std::optional<bool> tied_llm, Diagnostics& diag);

}  // namespace tessera::hf

// Fuzz target: a HuggingFace config.json through the importer (`tessera import-hf`).
// Properties: a refusal gives a reason; an imported model validates and writes back (to_json)
// to JSON that reads to the same model.
#include <cstdint>

#include "fuzz/support.hpp"
#include "shared/spec/hf_import.hpp"

using namespace tessera;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string file = "config.json";
  Diagnostics diag;
  const std::optional<Json> json = parse_json_text(fuzz::as_text(data, size), file, diag);
  if (!json) {
    fuzz::refused("JSON text", diag);
    return 0;
  }
  // The last byte, when the input has one, picks which modules are frozen (as --freeze does).
  HfImportOptions options;
  if (size > 0 && (data[size - 1] & 1)) options.freeze.push_back("vision");
  if (size > 0 && (data[size - 1] & 2)) options.freeze.push_back("llm");
  const std::optional<ModelSpec> model = import_hf_config(*json, file, options, diag);
  if (!model) {
    fuzz::refused("a config", diag);
    return 0;
  }
  fuzz::accepted("a config", diag);
  validate_model(*model, "model.json", "", diag);
  if (!diag.ok()) fuzz::fail("an imported model does not validate:\n" + diag.format());
  fuzz::check_round_trip(to_json(*model), "an imported model", [](const Json& j, Diagnostics& d) {
    const ModelSpec again = read_model(j, "model.json", "", d);
    return d.ok() ? std::optional<Json>(to_json(again)) : std::nullopt;
  });
  return 0;
}

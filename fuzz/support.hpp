// What the fuzz targets share (fuzz/README.md): the input as text, a scratch folder of the
// process's own for readers that take file paths, and how a target reports a broken property.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "shared/base/json_reader.hpp"

namespace tessera::fuzz {

std::string_view as_text(const uint8_t* data, std::size_t size);

// A folder made for this process on first use and removed when it exits.
const std::string& scratch_dir();

// Writes `text` to `file` (replacing it). A failure is a broken harness: it aborts.
void write_text(const std::string& file, std::string_view text);

// A property the target checks does not hold: prints `what` and aborts, which libFuzzer and
// the corpus replay both report as a failure with the input that caused it.
[[noreturn]] void fail(const std::string& what);

// An input was refused: `diag` must say why (else fail). TESSERA_FUZZ_VERBOSE=1 prints the
// reasons, to see how far the seeds get.
void refused(const char* what, const Diagnostics& diag);
// An input was accepted: `diag` must hold no error (else fail).
void accepted(const char* what, const Diagnostics& diag);

// The property every writer/reader pair must have: what `to_json` wrote reads back to the same
// JSON. `reread` parses the dumped text and returns the re-serialized value, or nullopt with the
// problems in `diag`.
template <class Reread>
void check_round_trip(const Json& written, const char* what, Reread reread) {
  Diagnostics diag;
  const std::optional<Json> again = reread(Json::parse(written.dump()), diag);
  if (!again) fail(std::string(what) + " written by to_json does not read back:\n" + diag.format());
  if (*again != written)
    fail(std::string(what) + " changes in a round trip:\n" + written.dump() + "\n" + again->dump());
}

}  // namespace tessera::fuzz

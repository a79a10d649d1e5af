// Fault injection for the reliability tests (docs/RELIABILITY.md): TESSERA_FAILPOINT=name:index
// makes failpoint(name, index) true at that one place, so a test can crash one simulation child
// of a sweep, say, and check what survives. Unset (always, outside tests): false everywhere.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace tessera {

inline bool failpoint(std::string_view name, int64_t index) {
  const char* spec = std::getenv("TESSERA_FAILPOINT");
  if (spec == nullptr) return false;
  const std::string_view s(spec);
  const std::size_t colon = s.rfind(':');
  return colon != std::string_view::npos && s.substr(0, colon) == name &&
         s.substr(colon + 1) == std::to_string(index);
}

}  // namespace tessera

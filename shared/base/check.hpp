// TESSERA_CHECK: broken invariants are bugs, reported with file:line. Input errors never use
// this; they are returned as Diagnostics (see diagnostics.hpp).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

// Thrown by TESSERA_CHECK. main() turns it into exit code 1 (a bug), never 2 (bad input).
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] inline void check_failed(const char* expr, const char* file, int line,
                                      const std::string& detail) {
  std::ostringstream out;
  out << file << ":" << line << ": check failed: " << expr;
  if (!detail.empty()) out << " (" << detail << ")";
  throw InternalError(out.str());
}

}  // namespace tessera

#define TESSERA_CHECK(cond, ...)                                                               \
  do {                                                                                         \
    if (!(cond)) ::tessera::check_failed(#cond, __FILE__, __LINE__, std::string{__VA_ARGS__}); \
  } while (0)

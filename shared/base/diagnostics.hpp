// Diagnostics: the problems found in user input, each naming the file and the JSON path.
// Readers and validators append to a Diagnostics and keep going, so a user sees every problem
// of a file at once rather than one per run.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct Diagnostic {
  std::string file;     // the input file, as the user named it; empty for in-memory input
  std::string path;     // JSON path inside the file: "plan.modules.llm.tp"; empty = whole file
  std::string message;  // what is wrong, with the offending value
};

class Diagnostics {
 public:
  void error(std::string file, std::string path, std::string message);
  // Something valid that the user should know costs them (a GPU without kernel data): reported
  // beside the results, never a reason to refuse. Each new warning also goes to the warning
  // reporter, when a program has set one.
  void warn(std::string file, std::string path, std::string message);
  void append(const Diagnostics& other);

  bool ok() const { return errors_.empty(); }
  const std::vector<Diagnostic>& errors() const { return errors_; }
  const std::vector<Diagnostic>& warnings() const { return warnings_; }

  // One line per problem: "file: path: message".
  std::string format() const;
  // One line per warning: "warning: file: path: message".
  std::string format_warnings() const;

 private:
  std::vector<Diagnostic> errors_;
  std::vector<Diagnostic> warnings_;
};

// Where warnings go as they are found: the programs' main() sets one that prints each distinct
// warning once to stderr, so that every command shows them whatever it does with its results.
// Unset (the default, in tests) they are only kept in their Diagnostics.
using WarningReporter = std::function<void(const Diagnostic&)>;
void set_warning_reporter(WarningReporter reporter);
// The reporter the programs use: "warning: file: path: message" on `err`, each line once.
WarningReporter print_warnings_once(std::ostream& err);

// Thrown only by the *_or_throw helpers that callers use when they have already validated
// their input (tests, internal code); user-facing paths return Diagnostics instead.
struct InputError : std::exception {
  Diagnostics diagnostics;
  std::string text;
  explicit InputError(Diagnostics d) : diagnostics(std::move(d)), text(diagnostics.format()) {}
  const char* what() const noexcept override { return text.c_str(); }
};

// Levenshtein distance, used to suggest the closest valid key or enum value.
int edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word`, or "" when none is close enough to be a plausible typo.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// "path.key" with the root ("" path) elided.
std::string join_path(std::string_view path, std::string_view key);
// "path[3]".
std::string index_path(std::string_view path, std::size_t index);

}  // namespace tessera

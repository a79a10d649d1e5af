#include "shared/base/diagnostics.hpp"

#include <algorithm>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>

namespace tessera {

namespace {

WarningReporter& warning_reporter() {
  static WarningReporter reporter;
  return reporter;
}

// "file: path: message", each part only when present.
std::string line_of(const Diagnostic& d) {
  std::string line;
  if (!d.file.empty()) line += d.file + ": ";
  if (!d.path.empty()) line += d.path + ": ";
  return line + d.message;
}

}  // namespace

void set_warning_reporter(WarningReporter reporter) {
  warning_reporter() = std::move(reporter);
}

WarningReporter print_warnings_once(std::ostream& err) {
  auto printed = std::make_shared<std::set<std::string>>();
  return [&err, printed](const Diagnostic& d) {
    if (printed->insert(line_of(d)).second) err << "warning: " << line_of(d) << "\n";
  };
}

void Diagnostics::error(std::string file, std::string path, std::string message) {
  errors_.push_back({std::move(file), std::move(path), std::move(message)});
}

void Diagnostics::warn(std::string file, std::string path, std::string message) {
  const Diagnostic d{std::move(file), std::move(path), std::move(message)};
  // A file read twice (a cluster named by several scenario parts) warns once.
  for (const Diagnostic& w : warnings_)
    if (w.file == d.file && w.path == d.path && w.message == d.message) return;
  warnings_.push_back(d);
  if (warning_reporter()) warning_reporter()(warnings_.back());
}

void Diagnostics::append(const Diagnostics& other) {
  errors_.insert(errors_.end(), other.errors_.begin(), other.errors_.end());
  for (const Diagnostic& w : other.warnings_) warn(w.file, w.path, w.message);
}

namespace {

std::string format_lines(const std::vector<Diagnostic>& lines, std::string_view prefix) {
  std::ostringstream out;
  for (const Diagnostic& d : lines) out << prefix << line_of(d) << "\n";
  return out.str();
}

}  // namespace

std::string Diagnostics::format() const {
  return format_lines(errors_, "");
}

std::string Diagnostics::format_warnings() const {
  return format_lines(warnings_, "warning: ");
}

int edit_distance(std::string_view a, std::string_view b) {
  std::vector<int> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= a.size(); ++i) {
    int diagonal = row[0];
    row[0] = static_cast<int>(i);
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const int substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  // Fewest edits; among equals, the longest common prefix ("tpp" is a typo of "tp", not "pp").
  auto prefix = [&](const std::string& c) {
    std::size_t n = 0;
    while (n < c.size() && n < word.size() && c[n] == word[n]) ++n;
    return n;
  };
  std::string best;
  int best_distance = 0;
  for (const std::string& c : candidates) {
    const int d = edit_distance(word, c);
    if (best.empty() || d < best_distance || (d == best_distance && prefix(c) > prefix(best))) {
      best = c;
      best_distance = d;
    }
  }
  // A typo changes a few characters; beyond half the word it is another word altogether.
  const int limit = std::max<int>(2, static_cast<int>(word.size()) / 2);
  return best_distance <= limit ? best : std::string{};
}

std::string join_path(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  std::string out(path);
  out += '.';
  out += key;
  return out;
}

std::string index_path(std::string_view path, std::size_t index) {
  return std::string(path) + "[" + std::to_string(index) + "]";
}

}  // namespace tessera

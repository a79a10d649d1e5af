// Reading JSON input with diagnostics: every problem names the file and the JSON path, unknown
// keys are reported with the closest valid key, and reading goes on after an error so one run
// lists every problem of a file.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/diagnostics.hpp"

namespace tessera {

using Json = nlohmann::ordered_json;

// Parses `text`; a syntax error is recorded as "file: line L, column C: ..." and gives nullopt.
std::optional<Json> parse_json_text(std::string_view text, const std::string& file,
                                    Diagnostics& diag);
// Reads and parses a file; a missing or unreadable file is recorded the same way.
std::optional<Json> read_json_file(const std::string& file, Diagnostics& diag);
// The file another file names by `ref`: relative to the folder of `from_file` unless absolute.
std::string referenced_path(const std::string& ref, const std::string& from_file);
// Reads the file `ref` names from `from_file`; a missing one is recorded at (from_file, path) as
// "file not found: 'ref' (looked for ...)". `target` (optional) gets the path it read.
std::optional<Json> read_referenced_json(const std::string& ref, const std::string& from_file,
                                         const std::string& path, Diagnostics& diag,
                                         std::string* target = nullptr);

// Writes `text` to `file` atomically (temporary file in the same folder, then rename), so a
// reader never sees half a file. Returns an error message, or "" on success.
std::string write_file_atomically(const std::string& file, std::string_view text);

// Name of a JSON value's type as a user would say it ("integer", "string", ...).
std::string json_type_name(const Json& value);

// Scalar conversions with type checking. Return false (and record an error) on a wrong type.
bool read_value(const Json& v, const std::string& file, const std::string& path, int64_t& out,
                Diagnostics& diag);
bool read_value(const Json& v, const std::string& file, const std::string& path, int& out,
                Diagnostics& diag);
bool read_value(const Json& v, const std::string& file, const std::string& path, uint64_t& out,
                Diagnostics& diag);
bool read_value(const Json& v, const std::string& file, const std::string& path, double& out,
                Diagnostics& diag);
bool read_value(const Json& v, const std::string& file, const std::string& path, bool& out,
                Diagnostics& diag);
bool read_value(const Json& v, const std::string& file, const std::string& path, std::string& out,
                Diagnostics& diag);
template <class T>
bool read_value(const Json& v, const std::string& file, const std::string& path,
                std::vector<T>& out, Diagnostics& diag) {
  if (!v.is_array()) {
    diag.error(file, path, "expected an array, got " + json_type_name(v));
    return false;
  }
  std::vector<T> items(v.size());
  bool ok = true;
  for (std::size_t i = 0; i < v.size(); ++i)
    ok = read_value(v[i], file, index_path(path, i), items[i], diag) && ok;
  if (ok) out = std::move(items);
  return ok;
}

// A table from the JSON spelling of an enum to its value.
template <class E>
using EnumTable = std::vector<std::pair<std::string, E>>;

template <class E>
std::string enum_name(E value, const EnumTable<E>& table) {
  for (const auto& [name, v] : table)
    if (v == value) return name;
  return "?";
}

template <class E>
std::vector<std::string> enum_names(const EnumTable<E>& table) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.first);
  return names;
}

std::string unknown_value_message(const std::string& value, const std::vector<std::string>& valid);

template <class E>
bool read_enum(const Json& v, const std::string& file, const std::string& path, E& out,
               const EnumTable<E>& table, Diagnostics& diag) {
  std::string text;
  if (!read_value(v, file, path, text, diag)) return false;
  for (const auto& [name, value] : table)
    if (name == text) {
      out = value;
      return true;
    }
  diag.error(file, path, unknown_value_message(text, enum_names(table)));
  return false;
}

// Reads the members of one JSON object. Every key the caller asks about counts as known; keys
// the caller never asked about are reported by finish() with the closest known key.
class ObjectReader {
 public:
  // REQUIRES: `value` outlives the reader. A non-object `value` is recorded as an error and
  // the reader then answers every query with "absent".
  ObjectReader(const Json& value, std::string file, std::string path, Diagnostics& diag);

  bool valid() const { return object_ != nullptr; }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  Diagnostics& diagnostics() const { return *diag_; }
  std::string path_of(std::string_view key) const { return join_path(path_, key); }

  // True when any of `names` is present (and marks all of them known).
  bool has(std::initializer_list<std::string_view> names);
  bool has(std::string_view key) { return has({key}); }

  // The raw value under the first present name (the others being aliases), or nullptr.
  // Two aliases given at once is an error.
  const Json* find(std::initializer_list<std::string_view> names);
  const Json* find(std::string_view key) { return find({key}); }
  // Name under which find() found its value last (for messages).
  const std::string& found_name() const { return found_name_; }

  template <class T>
  bool optional(std::initializer_list<std::string_view> names, T& out) {
    const Json* v = find(names);
    return v != nullptr && read_value(*v, file_, path_of(found_name_), out, *diag_);
  }
  template <class T>
  bool optional(std::string_view key, T& out) {
    return optional({key}, out);
  }
  template <class T>
  bool required(std::initializer_list<std::string_view> names, T& out) {
    if (find(names) == nullptr) {
      missing(*names.begin());
      return false;
    }
    return optional(names, out);
  }
  template <class T>
  bool required(std::string_view key, T& out) {
    return required({key}, out);
  }

  template <class E>
  bool optional_enum(std::string_view key, E& out, const EnumTable<E>& table) {
    const Json* v = find(key);
    return v != nullptr && read_enum(*v, file_, path_of(key), out, table, *diag_);
  }
  template <class E>
  bool required_enum(std::string_view key, E& out, const EnumTable<E>& table) {
    if (find(key) == nullptr) {
      missing(key);
      return false;
    }
    return optional_enum(key, out, table);
  }

  // Range checks on a value already read; record "must be > 0, got -3" and return false.
  template <class T>
  bool check_positive(std::string_view key, T value) {
    if (value > T{0}) return true;
    error(key, "must be > 0, got " + to_text(value));
    return false;
  }
  template <class T>
  bool check_at_least(std::string_view key, T value, T minimum) {
    if (value >= minimum) return true;
    error(key, "must be >= " + to_text(minimum) + ", got " + to_text(value));
    return false;
  }

  void error(std::string_view key, std::string message) {
    diag_->error(file_, path_of(key), std::move(message));
  }
  void missing(std::string_view key) { error(key, "required key is missing"); }

  // Reports every key that no query named, suggesting the closest known key.
  void finish();

 private:
  template <class T>
  static std::string to_text(T value) {
    if constexpr (std::is_floating_point_v<T>) {
      std::ostringstream out;
      out << value;
      return out.str();
    } else {
      return std::to_string(value);
    }
  }

  const Json* object_ = nullptr;
  std::string file_;
  std::string path_;
  Diagnostics* diag_;
  std::set<std::string, std::less<>> known_;
  std::string found_name_;
};

}  // namespace tessera

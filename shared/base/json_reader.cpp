#include "shared/base/json_reader.hpp"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <unistd.h>

namespace tessera {

namespace {

// Line and column (both 1-based) of byte offset `byte` (1-based, as nlohmann reports it).
std::pair<std::size_t, std::size_t> line_and_column(std::string_view text, std::size_t byte) {
  std::size_t line = 1;
  std::size_t column = 1;
  const std::size_t end = std::min(byte > 0 ? byte - 1 : 0, text.size());
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

std::optional<Json> parse_json_text(std::string_view text, const std::string& file,
                                    Diagnostics& diag) {
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    const auto [line, column] = line_and_column(text, e.byte);
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] parse error at line 1, column 2: ";
    // keep only the explanation after the last ": " of that prefix.
    const std::size_t cut = what.find("syntax error");
    if (cut != std::string::npos) what = what.substr(cut);
    diag.error(file, "",
               "invalid JSON at line " + std::to_string(line) + ", column " +
                   std::to_string(column) + ": " + what);
    return std::nullopt;
  } catch (const Json::out_of_range& e) {
    // A number too large for a double ("1e999"): nlohmann names the number, not its place.
    std::string what = e.what();
    const std::size_t cut = what.find("] ");
    if (cut != std::string::npos) what = what.substr(cut + 2);
    std::string where;
    const std::size_t open = what.find('\''), close = what.rfind('\'');
    if (open != std::string::npos && close > open)
      if (const std::size_t at = text.find(what.substr(open + 1, close - open - 1));
          at != std::string_view::npos) {
        const auto [line, column] = line_and_column(text, at + 1);
        where = " at line " + std::to_string(line) + ", column " + std::to_string(column);
      }
    diag.error(file, "", "invalid JSON" + where + ": " + what);
    return std::nullopt;
  }
}

std::string referenced_path(const std::string& ref, const std::string& from_file) {
  const std::filesystem::path p(ref);
  return p.is_absolute() ? ref : (std::filesystem::path(from_file).parent_path() / p).string();
}

std::optional<Json> read_referenced_json(const std::string& ref, const std::string& from_file,
                                         const std::string& path, Diagnostics& diag,
                                         std::string* target) {
  const std::string file = referenced_path(ref, from_file);
  if (target != nullptr) *target = file;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    diag.error(from_file, path, "file not found: '" + ref + "' (looked for " + file + ")");
    return std::nullopt;
  }
  return read_json_file(file, diag);
}

std::optional<Json> read_json_file(const std::string& file, Diagnostics& diag) {
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    diag.error(file, "", "file not found");
    return std::nullopt;
  }
  if (std::filesystem::is_directory(file, ec)) {
    diag.error(file, "", "is a directory, expected a JSON file");
    return std::nullopt;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    diag.error(file, "", "cannot be read");
    return std::nullopt;
  }
  std::ostringstream content;
  content << in.rdbuf();
  return parse_json_text(content.str(), file, diag);
}

std::string write_file_atomically(const std::string& file, std::string_view text) {
  namespace fs = std::filesystem;
  const fs::path target(file);
  // Replacing a device or a folder by a regular file is never what was meant.
  std::error_code status_error;
  if (fs::exists(target, status_error) && !fs::is_regular_file(target, status_error))
    return file + ": exists and is not a regular file";
  const fs::path temp = target.parent_path() /
                        ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return "cannot write " + temp.string();
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      std::error_code ignored;
      fs::remove(temp, ignored);
      return "write failed for " + temp.string() + " (disk full?)";
    }
  }
  std::error_code ec;
  fs::rename(temp, target, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    return "cannot rename " + temp.string() + " to " + file + ": " + ec.message();
  }
  return "";
}

std::string json_type_name(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "integer";
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "value";
  }
}

bool read_value(const Json& v, const std::string& file, const std::string& path, int64_t& out,
                Diagnostics& diag) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      diag.error(file, path, "integer out of range");
      return false;
    }
    out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    // 4.0 and 1e9 are integers written as numbers; 2.5 is not.
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.2e18) {
      out = static_cast<int64_t>(d);
      return true;
    }
    std::ostringstream text;
    text << d;
    diag.error(file, path, "expected an integer, got " + text.str());
    return false;
  }
  diag.error(file, path, "expected an integer, got " + json_type_name(v));
  return false;
}

bool read_value(const Json& v, const std::string& file, const std::string& path, int& out,
                Diagnostics& diag) {
  int64_t wide = 0;
  if (!read_value(v, file, path, wide, diag)) return false;
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max()) {
    diag.error(file, path, "integer out of range: " + std::to_string(wide));
    return false;
  }
  out = static_cast<int>(wide);
  return true;
}

bool read_value(const Json& v, const std::string& file, const std::string& path, uint64_t& out,
                Diagnostics& diag) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return true;
  }
  int64_t wide = 0;
  if (!read_value(v, file, path, wide, diag)) return false;
  if (wide < 0) {
    diag.error(file, path, "must be >= 0, got " + std::to_string(wide));
    return false;
  }
  out = static_cast<uint64_t>(wide);
  return true;
}

bool read_value(const Json& v, const std::string& file, const std::string& path, double& out,
                Diagnostics& diag) {
  if (!v.is_number()) {
    diag.error(file, path, "expected a number, got " + json_type_name(v));
    return false;
  }
  out = v.get<double>();
  return true;
}

bool read_value(const Json& v, const std::string& file, const std::string& path, bool& out,
                Diagnostics& diag) {
  if (!v.is_boolean()) {
    diag.error(file, path, "expected true or false, got " + json_type_name(v));
    return false;
  }
  out = v.get<bool>();
  return true;
}

bool read_value(const Json& v, const std::string& file, const std::string& path, std::string& out,
                Diagnostics& diag) {
  if (!v.is_string()) {
    diag.error(file, path, "expected a string, got " + json_type_name(v));
    return false;
  }
  out = v.get<std::string>();
  return true;
}

std::string unknown_value_message(const std::string& value, const std::vector<std::string>& valid) {
  std::string message = "unknown value '" + value + "'";
  const std::string guess = closest_match(value, valid);
  if (!guess.empty()) message += " (did you mean '" + guess + "'?)";
  message += "; valid: ";
  for (std::size_t i = 0; i < valid.size(); ++i) message += (i ? ", " : "") + valid[i];
  return message;
}

ObjectReader::ObjectReader(const Json& value, std::string file, std::string path, Diagnostics& diag)
    : file_(std::move(file)), path_(std::move(path)), diag_(&diag) {
  if (value.is_object()) {
    object_ = &value;
  } else {
    diag.error(file_, path_, "expected an object, got " + json_type_name(value));
  }
}

bool ObjectReader::has(std::initializer_list<std::string_view> names) {
  bool present = false;
  for (std::string_view name : names) {
    known_.emplace(name);
    if (object_ != nullptr && object_->contains(name)) present = true;
  }
  return present;
}

const Json* ObjectReader::find(std::initializer_list<std::string_view> names) {
  const Json* found = nullptr;
  for (std::string_view name : names) {
    known_.emplace(name);
    if (object_ == nullptr) continue;
    const auto it = object_->find(name);
    if (it == object_->end()) continue;
    if (found != nullptr) {
      error(name, "given twice: also as '" + found_name_ + "' (the two are aliases)");
      continue;
    }
    found = &*it;
    found_name_ = std::string(name);
  }
  return found;
}

void ObjectReader::finish() {
  if (object_ == nullptr) return;
  const std::vector<std::string> known(known_.begin(), known_.end());
  for (const auto& item : object_->items()) {
    if (known_.contains(item.key())) continue;
    std::string message = "unknown key";
    const std::string guess = closest_match(item.key(), known);
    if (!guess.empty()) message += " (did you mean '" + guess + "'?)";
    diag_->error(file_, path_of(item.key()), message);
  }
}

}  // namespace tessera

#include "shared/spec/device_catalog.hpp"

#include <array>
#include <cctype>

namespace tessera {

namespace {

// Each shipped file parsed once; a file that does not parse is a build defect, caught by the
// catalog's test, and matches nothing here.
const std::vector<ShippedDevice>& catalog() {
  static const std::vector<ShippedDevice> devices = [] {
    std::vector<ShippedDevice> out;
    for (const ShippedDeviceFile& f : shipped_device_files()) {
      Json json = Json::parse(f.text, nullptr, /*allow_exceptions=*/false);
      if (json.is_object() && json.contains("name") && json["name"].is_string())
        out.push_back({std::move(json), std::string("scenarios/devices/") + f.file});
    }
    return out;
  }();
  return devices;
}

}  // namespace

std::string device_key(std::string_view name) {
  std::string key;
  for (const char c : name)
    if (std::isalnum(static_cast<unsigned char>(c)) != 0)
      key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const std::string_view vendor : std::array<std::string_view, 3>{"nvidia", "amd", "instinct"})
    if (key.starts_with(vendor) && key.size() > vendor.size()) key.erase(0, vendor.size());
  return key;
}

std::optional<ShippedDevice> shipped_device(std::string_view name) {
  const std::string wanted = device_key(name);
  if (wanted.empty()) return std::nullopt;
  for (const ShippedDevice& d : catalog()) {
    if (device_key(d.json["name"].get<std::string>()) == wanted) return d;
    if (const auto aliases = d.json.find("aliases"); aliases != d.json.end() && aliases->is_array())
      for (const Json& alias : *aliases)
        if (alias.is_string() && device_key(alias.get<std::string>()) == wanted) return d;
  }
  return std::nullopt;
}

std::vector<std::string> shipped_device_names() {
  std::vector<std::string> names;
  for (const ShippedDevice& d : catalog()) names.push_back(d.json["name"].get<std::string>());
  return names;
}

}  // namespace tessera

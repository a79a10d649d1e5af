// The shipped device catalog: the device files of scenarios/devices/, compiled into the program,
// so that a cluster can name its GPU ("device": "H100-SXM5-80GB", or an inline device whose name
// is a shipped one's) and get the kernel data the cost model needs (device_kernels.hpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/json_reader.hpp"

namespace tessera {

struct ShippedDeviceFile {
  const char* file;  // its name in scenarios/devices/
  const char* text;  // its JSON
};
// Generated at build time (cmake/embed_devices.cmake).
const std::vector<ShippedDeviceFile>& shipped_device_files();

// A device name as people write it, for matching: lower case, letters and digits only, without
// a leading vendor ("NVIDIA H100 80GB HBM3" -> "h10080gbhbm3").
std::string device_key(std::string_view name);

// The shipped device whose name or one of whose `aliases` matches `name` (by device_key), as
// its JSON, and the file it came from; nullopt when none does.
struct ShippedDevice {
  Json json;
  std::string file;
};
std::optional<ShippedDevice> shipped_device(std::string_view name);

// The shipped devices' names, for messages.
std::vector<std::string> shipped_device_names();

}  // namespace tessera

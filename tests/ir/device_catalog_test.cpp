#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "shared/spec/cluster_spec.hpp"
#include "shared/spec/device_catalog.hpp"

using namespace tessera;

namespace {

namespace fs = std::filesystem;

const std::string kDevices = std::string(TESSERA_SOURCE_DIR) + "/scenarios/devices/";

// A one-node GPU cluster whose "device" is `device`, read as file "c.json".
ClusterSpec cluster_with(const Json& device, Diagnostics& diag) {
  const Json cluster = {
      {"name", "c"},      {"kind", "gpu"},
      {"nodes", 1},       {"devices_per_node", 8},
      {"device", device}, {"intra_node", {{"bandwidth_bytes_per_s", 4.5e11}, {"latency_s", 3e-6}}}};
  return read_cluster(cluster, "c.json", "", diag);
}

}  // namespace

TEST_CASE("the catalog holds every device file of scenarios/devices/, each found by its name") {
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kDevices)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    const Json json = Json::parse(std::ifstream(entry.path()));
    const std::string name = json.at("name").get<std::string>();
    INFO(entry.path().string());
    const auto shipped = shipped_device(name);
    REQUIRE(shipped.has_value());
    CHECK(shipped->json == json);
    CHECK(shipped->file == "scenarios/devices/" + entry.path().filename().string());
    // Every shipped device reads without a problem and has the kernel data the cost model needs.
    Diagnostics diag;
    const ClusterSpec c = cluster_with(Json(name), diag);
    INFO(diag.format());
    CHECK(diag.ok());
    CHECK(diag.warnings().empty());
    CHECK(c.device.name == name);
    CHECK(c.device.kernels.has_value());
    if (const auto aliases = json.find("aliases"); aliases != json.end())
      for (const Json& alias : *aliases) {
        INFO(alias.dump());
        REQUIRE(shipped_device(alias.get<std::string>()).has_value());
        CHECK(shipped_device(alias.get<std::string>())->json.at("name") == name);
      }
  }
  CHECK(shipped_device_names().size() == files);
  CHECK(files >= 2);
}

TEST_CASE(
    "device names match as people write them: case, punctuation and the vendor do not count") {
  CHECK(device_key("NVIDIA H100-SXM5-80GB") == "h100sxm580gb");
  CHECK(device_key("h100 sxm5 80gb") == "h100sxm580gb");
  CHECK(device_key("AMD Instinct MI300X") == "mi300x");
  CHECK(device_key("nvidia") == "nvidia");  // a vendor alone stays a name
  REQUIRE(shipped_device("nvidia a100-sxm4-80gb").has_value());
  CHECK(shipped_device("nvidia a100-sxm4-80gb")->json.at("name") == "A100-SXM4-80GB");
  CHECK_FALSE(shipped_device("A100").has_value());  // a prefix is not a name
  CHECK_FALSE(shipped_device("").has_value());
}

TEST_CASE("an inline device named like a shipped one gets its kernel data; inline fields win") {
  Diagnostics diag;
  const ClusterSpec c =
      cluster_with(Json{{"name", "A100-SXM4-80GB"}, {"peak_flops", {{"bf16", 300e12}}}}, diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  CHECK(diag.warnings().empty());
  REQUIRE(c.device.kernels.has_value());
  CHECK(c.device.peak_flops.at(DType::kBf16) == 300e12);                      // written inline
  CHECK(c.device.memory_bandwidth_bytes_per_s == doctest::Approx(2.039e12));  // the shipped one's

  // "kernels": null drops the shipped kernel data, and says what that costs.
  Diagnostics flat;
  const ClusterSpec f = cluster_with(Json{{"name", "A100-SXM4-80GB"}, {"kernels", nullptr}}, flat);
  REQUIRE(flat.ok());
  CHECK_FALSE(f.device.kernels.has_value());
  REQUIRE(flat.warnings().size() == 1);
  CHECK(flat.warnings()[0].file == "c.json");
  CHECK(flat.warnings()[0].path == "device");
  CHECK(flat.warnings()[0].message.starts_with("'A100-SXM4-80GB' has no kernel data"));
}

TEST_CASE("a device the catalog does not know: a warning inline, an error by name alone") {
  Diagnostics diag;
  const ClusterSpec c = cluster_with(Json{{"name", "Gaudi3"},
                                          {"peak_flops", {{"bf16", 1835e12}}},
                                          {"memory_bytes", 128e9},
                                          {"memory_bandwidth_bytes_per_s", 3.7e12}},
                                     diag);
  CHECK(diag.ok());
  CHECK_FALSE(c.device.kernels.has_value());
  CHECK(diag.format_warnings().starts_with("warning: c.json: device: 'Gaudi3' has no kernel data"));

  Diagnostics by_name;
  cluster_with(Json("Gaudi3"), by_name);
  REQUIRE_FALSE(by_name.ok());
  CHECK(by_name.format().starts_with(
      "c.json: device: no shipped device is named 'Gaudi3' (shipped: A100-SXM4-80GB"));
}

TEST_CASE("a warning is kept once per Diagnostics and reported once by the programs' reporter") {
  std::ostringstream err;
  set_warning_reporter(print_warnings_once(err));
  Diagnostics a;
  a.warn("f.json", "device", "no kernel data");
  a.warn("f.json", "device", "no kernel data");
  Diagnostics b;
  b.append(a);
  b.warn("f.json", "device", "no kernel data");
  set_warning_reporter(nullptr);
  CHECK(a.warnings().size() == 1);
  CHECK(b.warnings().size() == 1);
  CHECK(err.str() == "warning: f.json: device: no kernel data\n");
}

TEST_CASE("a derived device is its base with its own fields over it, and is fitted as its base") {
  // By a shipped device's name: the peaks and memory written here, the base's kernel data.
  Diagnostics diag;
  const ClusterSpec c = cluster_with(Json{{"name", "H100 at 500 W"},
                                          {"base", "H100-SXM5-80GB"},
                                          {"peak_flops", {{"bf16", 800e12}}},
                                          {"memory_bandwidth_bytes_per_s", 2.4e12}},
                                     diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  CHECK(diag.warnings().empty());
  CHECK(c.device.name == "H100 at 500 W");
  CHECK(c.device.base == "H100-SXM5-80GB");
  CHECK(c.device.fitted_as() == "H100-SXM5-80GB");
  CHECK(c.device.peak_flops.at(DType::kBf16) == 800e12);
  CHECK(c.device.peak_flops.at(DType::kFp8) == 1979e12);  // not written: a merge, key by key
  CHECK(c.device.memory_bandwidth_bytes_per_s == 2.4e12);
  Diagnostics h100_diag;
  const ClusterSpec h100 = cluster_with(Json("H100-SXM5-80GB"), h100_diag);
  REQUIRE(c.device.kernels.has_value());
  CHECK(*c.device.kernels == *h100.device.kernels);
  CHECK(h100.device.base.empty());
  CHECK(h100.device.fitted_as() == "H100-SXM5-80GB");

  // Written out (a run's scenario) and read back, it is the same device, base included.
  Diagnostics again;
  const ClusterSpec back = read_cluster(to_json(c), "back.json", "", again);
  INFO(again.format());
  REQUIRE(again.ok());
  CHECK(back.device == c.device);

  // Nested kernel fields merge into the base's.
  Diagnostics partial;
  const ClusterSpec p = cluster_with(Json{{"name", "d"},
                                          {"base", "H100-SXM5-80GB"},
                                          {"kernels", {{"gemm", {{"efficiency", 0.7}}}}}},
                                     partial);
  REQUIRE(partial.ok());
  CHECK(p.device.kernels->gemm.efficiency == 0.7);
  CHECK(p.device.kernels->gemm.sms == h100.device.kernels->gemm.sms);

  // A base that does not exist, or that has a base of its own, is refused with the path.
  Diagnostics unknown;
  cluster_with(Json{{"name", "d"}, {"base", "H101"}}, unknown);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.format().starts_with("c.json: device.base: no shipped device is named 'H101'"));
  const fs::path dir = fs::temp_directory_path() / "tessera-derived-device";
  fs::create_directories(dir);
  std::ofstream(dir / "a.json") << Json{{"name", "a"}, {"base", "H100-SXM5-80GB"}}.dump();
  Diagnostics chained;
  cluster_with(Json{{"name", "b"}, {"base", (dir / "a.json").string()}}, chained);
  REQUIRE_FALSE(chained.ok());
  CHECK(chained.format().find("device.base: a base device is a device of its own") !=
        std::string::npos);
  std::ofstream(dir / "list.json") << "[1, 2]";
  Diagnostics not_device;
  cluster_with(Json{{"name", "b"}, {"base", (dir / "list.json").string()}}, not_device);
  REQUIRE_FALSE(not_device.ok());
  CHECK(not_device.format().find("device.base: the base is not a device: expected an object") !=
        std::string::npos);
  fs::remove_all(dir);
}

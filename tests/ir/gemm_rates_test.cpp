// Measured GEMM rates against the kernel model: the measurement file's reader and the H200
// measurements shipped in traces/h200/.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "shared/cost/gemm_rates.hpp"

using namespace tessera;

namespace {

const std::string kSource = TESSERA_SOURCE_DIR;

std::string write_temp(const std::string& text) {
  const std::string file = "gemm_rates_test_" + std::to_string(std::rand()) + ".jsonl";
  std::ofstream(file) << text;
  return file;
}

}  // namespace

TEST_CASE("gemm rates: the lent H200's products against the model") {
  Diagnostics diag;
  const auto rates = read_gemm_rates(kSource + "/traces/h200/gemm-rates.jsonl", diag);
  INFO(diag.format());
  REQUIRE(rates.has_value());
  CHECK(rates->device == "NVIDIA H200");
  const auto device = read_named_device(rates->device, diag);
  REQUIRE(device.has_value());
  CHECK(device->name == "H200-SXM-141GB");
  double grouped_error = 0;
  int grouped = 0;
  for (const GemmMeasurement& g : rates->rows) {
    REQUIRE(g.skipped.empty());
    const double error = predicted_gemm_s(*device, g) / g.seconds - 1;
    INFO(g.what);
    if (g.groups > 1) {
      // Grouped experts' products, 64 to 4,096 tokens each: within 20% at every size.
      CHECK(std::abs(error) < 0.2);
      grouped_error += std::abs(error);
      ++grouped;
    } else if (g.dtype == DType::kFp8 && g.scaling != "row") {
      // The device file's FP8 efficiencies, per tensor and per block, are these measurements'.
      CHECK(std::abs(error) < 0.01);
    } else if (g.what == "bf16") {
      CHECK(std::abs(error) < 0.02);
    }
  }
  REQUIRE(grouped == 14);
  CHECK(grouped_error / grouped < 0.1);
}

TEST_CASE("gemm rates: a measurement file's problems are named by line and key") {
  const std::string header = R"({"device": "NVIDIA H200", "torch": "2.11.0"})";
  const std::string row =
      R"({"kind": "grouped", "what": "x", "dtype": "bf16", "m": 64, "n": 128, "k": 256, )"
      R"("groups": 8, "seconds": 1e-5})";
  Diagnostics diag;
  std::string file = write_temp(header + "\n" + row + "\n");
  auto rates = read_gemm_rates(file, diag);
  REQUIRE(rates.has_value());
  CHECK(rates->rows.at(0).groups == 8);
  std::remove(file.c_str());

  // Transformer Engine's multi-stream experts are priced as the model prices a rank's experts:
  // one grouped kernel.
  std::string streams = row;
  streams.replace(streams.find("grouped"), 7, "streams");
  file = write_temp(header + "\n" + streams + "\n");
  diag = {};
  rates = read_gemm_rates(file, diag);
  REQUIRE(rates.has_value());
  CHECK(rates->rows.at(0).kind == "streams");
  const auto h200 = read_named_device("NVIDIA H200", diag);
  REQUIRE(h200.has_value());
  GemmMeasurement grouped = rates->rows.at(0);
  grouped.kind = "grouped";
  CHECK(predicted_gemm_s(*h200, rates->rows.at(0)) == predicted_gemm_s(*h200, grouped));
  std::remove(file.c_str());

  file = write_temp(header + "\n" + row + "\n" +
                    R"({"kind": "sparse", "what": "y", "dtype": "fp8", "m": -1, "n": 1, )"
                    R"("k": 1, "groups": 1, "seconds": 1, "speed": 3})" +
                    "\n{not json\n");
  diag = {};
  rates = read_gemm_rates(file, diag);
  CHECK_FALSE(rates.has_value());
  const std::string text = diag.format();
  INFO(text);
  CHECK(text.find("line 3.kind") != std::string::npos);
  CHECK(text.find("line 3.scaling: required key is missing") != std::string::npos);
  CHECK(text.find("line 3.m: must be > 0") != std::string::npos);
  CHECK(text.find("line 3.speed") != std::string::npos);
  CHECK(text.find("line 4: column") != std::string::npos);
  std::remove(file.c_str());

  file = write_temp(header + "\n" +
                    R"({"kind": "dense", "what": "z", "dtype": "fp8", "scaling": "blocks", )"
                    R"("m": 1, "n": 1, "k": 1, "groups": 1, "seconds": 1})" +
                    "\n");
  diag = {};
  CHECK_FALSE(read_gemm_rates(file, diag).has_value());
  CHECK(diag.format().find("line 2.scaling: expected \"tensor\", \"row\" or \"block\", got "
                           "\"blocks\"") != std::string::npos);
  std::remove(file.c_str());

  diag = {};
  CHECK_FALSE(read_gemm_rates("no-such-file.jsonl", diag).has_value());
  CHECK(diag.format().find("no-such-file.jsonl") != std::string::npos);
  file = write_temp(header + "\n");
  diag = {};
  CHECK_FALSE(read_gemm_rates(file, diag).has_value());
  CHECK(diag.format().find("no measurements") != std::string::npos);
  std::remove(file.c_str());
}

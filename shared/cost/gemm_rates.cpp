#include "shared/cost/gemm_rates.hpp"

#include <fstream>

#include "shared/base/check.hpp"
#include "shared/base/json_reader.hpp"
#include "shared/cost/kernel_cost.hpp"

namespace tessera {

namespace {

const EnumTable<DType> kMeasuredDTypes = {{"bf16", DType::kBf16}, {"fp8", DType::kFp8}};

GemmMeasurement read_row(const Json& json, const std::string& file, const std::string& path,
                         Diagnostics& diag) {
  GemmMeasurement g;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return g;
  if (r.required("kind", g.kind) && g.kind != "dense" && g.kind != "grouped" && g.kind != "streams")
    r.error("kind", "expected \"dense\", \"grouped\" or \"streams\", got \"" + g.kind + "\"");
  r.required("what", g.what);
  r.required_enum("dtype", g.dtype, kMeasuredDTypes);
  if (g.dtype == DType::kFp8 && r.required("scaling", g.scaling) && g.scaling != "tensor" &&
      g.scaling != "row" && g.scaling != "block")
    r.error("scaling", "expected \"tensor\", \"row\" or \"block\", got \"" + g.scaling + "\"");
  for (const auto& [key, value] : {std::pair{"m", &g.m}, {"n", &g.n}, {"k", &g.k}})
    if (r.required(key, *value)) r.check_positive(key, *value);
  if (r.required("groups", g.groups)) r.check_positive("groups", g.groups);
  if (!r.optional("skipped", g.skipped) && r.required("seconds", g.seconds))
    r.check_positive("seconds", g.seconds);
  // Derived or informative: what the script printed beside the measurement.
  for (const char* key : {"tflops", "rel_error"}) r.has(key);
  r.finish();
  return g;
}

}  // namespace

std::optional<GemmRates> read_gemm_rates(const std::string& file, Diagnostics& diag) {
  std::ifstream in(file);
  if (!in) {
    diag.error(file, "", "cannot read the file");
    return std::nullopt;
  }
  Diagnostics local;
  GemmRates rates;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string path = "line " + std::to_string(number);
    Diagnostics syntax;
    const std::optional<Json> json = parse_json_text(line, file, syntax);
    if (!json) {  // "invalid JSON at line 1, column C: ...", the line being the file's `number`
      const std::string& message = syntax.errors().front().message;
      const std::size_t column = message.find("column");
      local.error(file, path, column == std::string::npos ? message : message.substr(column));
      continue;
    }
    if (number == 1) {
      ObjectReader r(*json, file, path, local);
      if (!r.valid()) continue;
      r.required("device", rates.device);
      r.required("torch", rates.torch);
      r.finish();
      continue;
    }
    rates.rows.push_back(read_row(*json, file, path, local));
    rates.rows.back().line = number;
  }
  if (local.ok() && rates.rows.empty()) local.error(file, "", "no measurements after line 1");
  diag.append(local);
  if (!local.ok()) return std::nullopt;
  return rates;
}

double predicted_gemm_s(const DeviceSpec& device, const GemmMeasurement& g) {
  TESSERA_CHECK(device.kernels.has_value());
  if (g.dtype == DType::kFp8)
    return fp8_gemm_s(device, g.m, g.n, g.k, 1.0, g.groups, g.scaling == "block");
  return gemm_s(device, device.peak_flops.at(g.dtype), g.m, g.n, g.k, 2.0, 1.0, g.groups);
}

}  // namespace tessera

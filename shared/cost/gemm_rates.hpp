// Measured matrix-product rates (scripts/gemm-rates.py, run on a GPU) beside the kernel model's
// GEMM pricing (kernel_cost.hpp): each measured product, dense or grouped, bf16 or FP8, against
// what gemm_s gives for the device it ran on, so that the model's tile, wave and efficiency
// constants meet a measurement of their own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/base/diagnostics.hpp"
#include "shared/spec/cluster_spec.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera {

struct GemmMeasurement {
  // "dense", "grouped" (one grouped kernel) or "streams" (one product per group, dealt to
  // Transformer Engine's side streams)
  std::string kind;
  std::string what;  // the script's label
  DType dtype = DType::kBf16;
  std::string scaling;  // FP8: "tensor", "row" or "block"
  double m = 0, n = 0, k = 0;
  double groups = 1;    // products run together (kind grouped or streams)
  double seconds = 0;   // one call, the median measured
  std::string skipped;  // why the device could not run it (then no seconds)
  int64_t line = 0;     // of the file it was read from
};

struct GemmRates {
  std::string device;  // as the GPU named itself
  std::string torch;   // the torch it ran under
  std::vector<GemmMeasurement> rows;
};

// Reads a measurement file: a first line naming the device and torch, then one JSON object per
// measured product. Problems go to `diag` at "line N" paths; nullopt when there are any.
std::optional<GemmRates> read_gemm_rates(const std::string& file, Diagnostics& diag);

// The model's seconds for one measured product on `device`: gemm_s at the row's dtype, `groups`
// products as one grouped kernel (as the model prices a rank's experts, whichever kind ran them);
// FP8 at the device's FP8 peak and FP8 GEMM efficiency, the block-scaled one for block scales, the
// per-tensor one for the others (per-row included). REQUIRES: device.kernels, and the device's peak
// at the row's dtype.
double predicted_gemm_s(const DeviceSpec& device, const GemmMeasurement& g);

}  // namespace tessera

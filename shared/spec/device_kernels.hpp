// DeviceKernels: how fast one GPU runs the kernels a transformer step is made of — dense matrix
// multiplications by shape, attention kernels, memory-bound element-wise kernels and the fixed
// cost of each launch. Read from a device file (scenarios/devices/) that a cluster names; every
// number there cites its public source (docs/FIDELITY.md). kernel_cost.hpp turns an op into
// seconds with them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shared/base/json_reader.hpp"

namespace tessera {

// Dense GEMMs as a roofline with tile and wave quantization: the output is cut into
// tile_m x tile_n tiles, `sms` of them run at once (one wave), and a full wave of full tiles
// sustains `efficiency` of the dense peak. A GEMM's time is the larger of its padded FLOPs at
// that rate and its operand bytes at the achieved memory bandwidth.
struct GemmKernels {
  int64_t sms = 0;
  int64_t tile_m = 256;
  int64_t tile_n = 128;
  double efficiency = 0.8;
  // Of the dense FP8 peak, what large FP8 GEMMs reach (Transformer Engine's per-tensor scaled
  // GEMMs). 0: not measured for this device, taken as `efficiency` times the FP8/BF16 ratio
  // measured on one H100 setup over the peaks' ratio (kFp8OverBf16Measured).
  double fp8_efficiency = 0;
  double fp8() const { return fp8_efficiency > 0 ? fp8_efficiency : efficiency * kFp8Ratio; }
  // stas00/ml-engineering's maximum achievable matmul table, H100 SXM: 1,402.6 TFLOP/s FP8
  // (torch._scaled_mm, per-tensor scales) against 794.5 BF16, on peaks of 1,979 and 989.
  static constexpr double kFp8Ratio = (1402.6 / 794.5) / (1979.0 / 989.0);
  // Of the dense FP8 peak, what large FP8 GEMMs with a scale per block reach (1x128 activation
  // tiles, 128x128 weight blocks). 0: not measured for this device, taken as fp8() times the
  // block-scaled over per-tensor ratio measured on one H200 (kFp8BlockRatio).
  double fp8_block_efficiency = 0;
  double fp8_block() const {
    return fp8_block_efficiency > 0 ? fp8_block_efficiency : fp8() * kFp8BlockRatio;
  }
  // traces/h200/gemm-rates.jsonl: 8192^3 e4m3 products through cuBLAS (torch 2.11, CUDA 13) at
  // 1,261.2 TFLOP/s with block scales against 1,460.4 with per-tensor ones.
  static constexpr double kFp8BlockRatio = 1261.2 / 1460.4;
  bool operator==(const GemmKernels&) const = default;
};

// Fused (flash) attention sustains forward_efficiency / backward_efficiency of the dense peak at
// long sequences, less for short ones: efficiency · L / (L + half_keys) where L is the mean
// number of keys a query attends to. The backward recomputes the scores: it does 2.5x the
// forward's FLOPs (FlashAttention's own count). A plan with `flash_attention: false` runs
// unfused attention instead (kernel_cost.hpp): batched GEMMs and the score matrix through memory.
struct AttentionKernels {
  double forward_efficiency = 0.6;
  double backward_efficiency = 0.5;
  double half_keys = 256;
  bool operator==(const AttentionKernels&) const = default;
};

// What a PyTorch-native training stack (plan `framework: pytorch`) reaches on the device where
// it differs from Megatron-LM with Transformer Engine: its attention kernels (SDPA's
// FlashAttention-2) and its share of the rates inside a training step, fitted on that stack's
// published runs.
struct PytorchKernels {
  std::optional<AttentionKernels> attention;  // none: the device's own
  double training_scale = 1.0;
  bool operator==(const PytorchKernels&) const = default;
};

struct DeviceKernels {
  GemmKernels gemm;
  AttentionKernels attention;
  // Fraction of the memory bandwidth that streaming element-wise kernels reach.
  double memory_efficiency = 0.85;
  // Share of the GEMM and attention rates above that kernels reach inside a training step
  // (framework, clocks under sustained load): fitted on the published runs of this device by
  // `tessera fidelity --fit`; 1 for a device without published runs.
  double training_scale = 1.0;
  // A PyTorch-native stack's; none: it runs as the rates above say.
  std::optional<PytorchKernels> pytorch;
  // The attention rates and training scale of the stack `pytorch` says.
  const AttentionKernels& attention_for(bool pytorch_stack) const {
    return pytorch_stack && pytorch && pytorch->attention ? *pytorch->attention : attention;
  }
  double training_scale_for(bool pytorch_stack) const {
    return pytorch_stack && pytorch ? pytorch->training_scale : training_scale;
  }
  bool operator==(const DeviceKernels&) const = default;
};

DeviceKernels read_device_kernels(const Json& json, const std::string& file,
                                  const std::string& path, Diagnostics& diag);
Json to_json(const DeviceKernels& kernels);

}  // namespace tessera

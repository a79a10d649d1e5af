// Kernel-level pricing of a Compute op on a GPU with DeviceKernels data: the op's matrix FLOPs
// at the rate its GEMM shapes reach (tile and wave quantization, memory roofline), its attention
// at the fused kernel's rate for its key length (or unfused, through memory), its element-wise
// kernels (norms, activations, residuals, rotary, the loss's softmax) by the bytes they move,
// and a fixed cost per kernel launched. The op's FLOPs stay the lowering's: this file only
// decides how fast they run. Formulas and sources: docs/FIDELITY.md.
#pragma once

#include <vector>

#include "shared/program/program.hpp"
#include "shared/spec/cluster_spec.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera {

// The global parameters of kernel-level pricing (docs/FIDELITY.md): the launch cost is fitted on
// the published runs (`tessera fidelity --fit`); `efficiency` scales every device's GEMM and
// attention rates on top of its own fitted DeviceKernels::training_scale (1: none).
struct KernelTuning {
  double efficiency = 1.0;
  double launch_s = 6e-6;  // per kernel (fitted)
};

// Seconds of one GEMM C[m,n] = A[m,k]·B[k,n] of `bytes_per_value` operands on `device`, or of
// `groups` such GEMMs run as one grouped kernel (a rank's routed experts): each group pads its
// own tiles, the waves are shared. REQUIRES: device.kernels.
double gemm_s(const DeviceSpec& device, double peak_flops, double m, double n, double k,
              double bytes_per_value, double efficiency_scale = 1.0, double groups = 1.0);

// Seconds of `groups` FP8 GEMMs C[m,n] = A[m,k]·B[k,n] (one grouped kernel when more than one) at
// the device's FP8 peak and FP8 GEMM efficiency, per-tensor or (`block_scales`) per-block, with
// one-byte operands. REQUIRES: device.kernels and its FP8 peak.
double fp8_gemm_s(const DeviceSpec& device, double m, double n, double k,
                  double efficiency_scale = 1.0, double groups = 1.0, bool block_scales = false);

// Seconds of one of op's transformer-layer GEMMs C[m,n] = A[m,k]·B[k,n]: as gemm_s at the model
// dtype's `peak_flops` and `bytes_per_value`, or, for an FP8 op (kOpFp8), at the device's FP8 peak
// and FP8 GEMM efficiency with one-byte operands. REQUIRES: device.kernels (and its FP8 peak).
double layer_gemm_s(const DeviceSpec& device, const Op& op, double peak_flops, double m, double n,
                    double k, double bytes_per_value, double efficiency_scale = 1.0,
                    double groups = 1.0);

// Seconds of a Compute op of `module` (nested collectives excluded).
// REQUIRES: device.kernels; op.kind == OpKind::kCompute.
double kernel_compute_s(const ModuleSpec& module, const Op& op, const DeviceSpec& device,
                        double peak_flops, double bytes_per_value, const KernelTuning& tuning);

// Seconds of the GEMMs of an op's column-parallel matrices (Q/K/V and the MLP input, per layer)
// in `gemm` (kB: their input gradients; kW: their weight gradients) that each hide one TP call of
// `call_s` seconds run beside them: at most one call a GEMM. Megatron-LM runs the input-gradient
// collective beside the weight-gradient GEMM (tp_backward_overlap) and its sequence-parallel
// input's second gather beside the input-gradient GEMM. 0 for a module without transformer
// layers.
// REQUIRES: device.kernels; op.kind == OpKind::kCompute.
double column_parallel_hidden_s(const ModuleSpec& module, const Op& op, Phase gemm,
                                const DeviceSpec& device, double peak_flops, double bytes_per_value,
                                const KernelTuning& tuning, double call_s);

// Seconds of an optimizer step moving `bytes` (fused multi-tensor Adam: a handful of launches).
double kernel_optimizer_s(const DeviceSpec& device, double bytes, const KernelTuning& tuning);

}  // namespace tessera

// The gated MLP's silu(gate) · up and the rotary position embedding, each in one fused kernel
// each way for bf16 activations on a GPU (exec/pointwise_kernels.hpp); ATen's elementwise ops
// elsewhere (the CPU, fp32, a build without nvcc) and where TESSERA_UNFUSED=1 is set (to
// measure what the kernels gain). Both forms are differentiable.
#pragma once

#include "exec/torch_api.hpp"

namespace tessera::exec {

// silu(gate) · up, elementwise.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// x (B, L, heads, d) with each head's pairs (i, i + d/2) rotated by the angles whose cosines and
// sines are `cos` and `sin`, (1, L, 1, d/2) in x's dtype.
torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin);

}  // namespace tessera::exec

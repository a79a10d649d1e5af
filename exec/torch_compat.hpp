// The few places where Debian's LibTorch 1.13 (CPU, CI) and the torch 2.x of the GPU machine
// differ, in one header instead of #ifs through the executor.
// - torch 2 split a process group into a ProcessGroup front and per-device Backends;
//   ProcessGroupGloo (and ProcessGroupNCCL) became Backends, which carry the collectives we call.
// - torch 2 has a fused scaled_dot_product_attention; 1.13 computes attention step by step.
// Both sides are compiled and tested in CI: Debian's 1.13 (build/) and torch 2.11 with CUDA 13
// (scripts/test.sh --torch2, build-torch2/).
#pragma once

#include <cmath>
#include <limits>
#include <optional>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include "exec/torch_api.hpp"

namespace tessera::exec {

#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

// softmax(q kᵀ / sqrt(d) + bias) v on (B, heads, L, d); `bias` additive and broadcastable to
// (B, heads, Lq, Lk), or undefined; it is cast to q's dtype. `causal` (without a bias, Lq = Lk):
// query i attends to keys 0..i, which torch 2's flash kernels do without a mask and without
// the masked half of the work. The softmax runs in fp32 (inside the fused kernel under torch 2).
// Empty inputs (an encoder's micro-batch without media) take the step-by-step form: torch 2.11's
// fused CUDA kernels return no tensor for them.
inline torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& bias,
                               bool causal = false) {
#if TORCH_VERSION_MAJOR >= 2
  if (q.numel() > 0 && k.numel() > 0)
    return at::scaled_dot_product_attention(
        q, k, v,
        bias.defined() ? std::optional<at::Tensor>(bias.to(q.scalar_type())) : std::nullopt,
        /*dropout_p=*/0.0, causal);
#endif
  torch::Tensor scores =
      torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  if (bias.defined()) scores = scores + bias.to(q.scalar_type());
  if (causal)
    scores = scores.masked_fill(
        torch::ones({q.size(-2), k.size(-2)}, q.options().dtype(torch::kBool)).triu(1),
        -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1, torch::kFloat32).to(q.scalar_type()), v);
}

}  // namespace tessera::exec

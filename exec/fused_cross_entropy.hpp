// The cross-entropy of bf16 logits on a GPU in two fused kernels (exec/cross_entropy_kernels.hpp):
// the forward reads each logit once and keeps one log-sum-exp per token, the backward reads each
// once more and writes its gradient. Elsewhere (the CPU, fp32 logits, a build without nvcc)
// fused_cross_entropy_applies() is false and blockwise_cross_entropy (layers.hpp) does the work.
#pragma once

#include "exec/torch_api.hpp"

namespace tessera::exec {

// Built with the kernels, and `logits` a contiguous bf16 (T, V) tensor on a GPU.
bool fused_cross_entropy_applies(const torch::Tensor& logits);

// Per-token loss (T, fp32), targets < 0 ignored (loss 0, no gradient); differentiable in
// `logits`.
torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace tessera::exec

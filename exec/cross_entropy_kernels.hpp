// Fused cross-entropy kernels for bf16 logits on a GPU, without torch: one pass over each row
// computes its log-sum-exp and loss (an online softmax, as in Milakov & Gimelshein, "Online
// normalizer calculation for softmax", 2018), one pass writes the gradient. Compiled by nvcc
// where the build has it (TESSERA_CUDA_KERNELS); exec/fused_cross_entropy.hpp is the torch side.
#pragma once

#include <cstdint>

namespace tessera::exec::kernels {

// logits: rows × vocab bf16, row-major; targets: rows int64 (< 0: ignored). Writes lse (rows
// fp32) and loss (rows fp32, 0 where ignored). `stream` is a cudaStream_t.
void cross_entropy_forward(const void* logits, const int64_t* targets, float* lse, float* loss,
                           int64_t rows, int64_t vocab, void* stream);

// grad_logits (rows × vocab bf16) = (softmax − one-hot(target)) · scale[row], zero where the
// target is ignored.
void cross_entropy_backward(const void* logits, const int64_t* targets, const float* lse,
                            const float* scale, void* grad_logits, int64_t rows, int64_t vocab,
                            void* stream);

}  // namespace tessera::exec::kernels

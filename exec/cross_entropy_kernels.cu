#include "exec/cross_entropy_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace tessera::exec::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// A running maximum and the sum of exp(x − maximum) over the values seen.
struct MaxSum {
  float max;
  float sum;
};

__device__ MaxSum combine(MaxSum a, MaxSum b) {
  if (a.sum == 0.0f) return b;
  if (b.sum == 0.0f) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ MaxSum add(MaxSum a, float x) {
  if (x <= a.max) return {a.max, a.sum + expf(x - a.max)};
  return {x, a.sum * expf(a.max - x) + 1.0f};
}

// Whether row r's values can be read 8 at a time (16-byte aligned, a multiple of 8 long).
__device__ bool vectorized(const __nv_bfloat16* row, int64_t vocab) {
  return vocab % 8 == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0;
}

__global__ void forward_kernel(const __nv_bfloat16* logits, const int64_t* targets, float* lse,
                               float* loss, int64_t vocab) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = logits + r * vocab;
  MaxSum acc{-INFINITY, 0.0f};
  if (vectorized(row, vocab)) {
    const uint4* packs = reinterpret_cast<const uint4*>(row);
    for (int64_t p = threadIdx.x; p < vocab / 8; p += kThreads) {
      const uint4 pack = packs[p];
      const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&pack);
      for (int i = 0; i < 8; ++i) acc = add(acc, __bfloat162float(v[i]));
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads)
      acc = add(acc, __bfloat162float(row[j]));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(0xffffffffu, acc.max, offset),
                       __shfl_xor_sync(0xffffffffu, acc.sum, offset)};
    acc = combine(acc, other);
  }
  __shared__ MaxSum warps[kWarps];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum all = warps[0];
    for (int w = 1; w < kWarps; ++w) all = combine(all, warps[w]);
    const float log_sum = all.max + logf(all.sum);
    lse[r] = log_sum;
    const int64_t t = targets[r];
    loss[r] = t >= 0 ? log_sum - __bfloat162float(row[t]) : 0.0f;
  }
}

__global__ void backward_kernel(const __nv_bfloat16* logits, const int64_t* targets,
                                const float* lse, const float* scale, __nv_bfloat16* grad,
                                int64_t vocab) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* row = logits + r * vocab;
  __nv_bfloat16* out = grad + r * vocab;
  const int64_t t = targets[r];
  const float s = t >= 0 ? scale[r] : 0.0f;
  const float log_sum = lse[r];
  const auto value = [&](float x, int64_t j) {
    return __float2bfloat16((expf(x - log_sum) - (j == t ? 1.0f : 0.0f)) * s);
  };
  if (vectorized(row, vocab) && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    const uint4* packs = reinterpret_cast<const uint4*>(row);
    uint4* written = reinterpret_cast<uint4*>(out);
    for (int64_t p = threadIdx.x; p < vocab / 8; p += kThreads) {
      const uint4 pack = packs[p];
      const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&pack);
      uint4 result;
      __nv_bfloat16* g = reinterpret_cast<__nv_bfloat16*>(&result);
      for (int i = 0; i < 8; ++i) g[i] = value(__bfloat162float(v[i]), p * 8 + i);
      written[p] = result;
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kThreads)
      out[j] = value(__bfloat162float(row[j]), j);
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

}  // namespace

void cross_entropy_forward(const void* logits, const int64_t* targets, float* lse, float* loss,
                           int64_t rows, int64_t vocab, void* stream) {
  if (rows == 0) return;
  forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(logits), targets, lse, loss, vocab);
  check(cudaGetLastError(), "cross-entropy forward kernel");
}

void cross_entropy_backward(const void* logits, const int64_t* targets, const float* lse,
                            const float* scale, void* grad_logits, int64_t rows, int64_t vocab,
                            void* stream) {
  if (rows == 0) return;
  backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(logits), targets, lse, scale,
      static_cast<__nv_bfloat16*>(grad_logits), vocab);
  check(cudaGetLastError(), "cross-entropy backward kernel");
}

}  // namespace tessera::exec::kernels

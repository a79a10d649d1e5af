#include "exec/pointwise_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace tessera::exec::kernels {

namespace {

constexpr int kThreads = 256;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Enough blocks to fill the device several times over; each thread strides through the rest.
unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 65536));
}

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// Whether every pointer can be read 8 values (16 bytes) at a time.
__host__ __device__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__device__ void swiglu_forward_one(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                   __nv_bfloat16* out, int64_t i) {
  const float g = __bfloat162float(gate[i]);
  out[i] = __float2bfloat16(g * sigmoid(g) * __bfloat162float(up[i]));
}

__global__ void swiglu_forward_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                      __nv_bfloat16* out, int64_t n, bool packed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (packed) {
    const uint4* g8 = reinterpret_cast<const uint4*>(gate);
    const uint4* u8 = reinterpret_cast<const uint4*>(up);
    uint4* o8 = reinterpret_cast<uint4*>(out);
    for (int64_t p = first; p < n / 8; p += stride) {
      const uint4 gp = g8[p], up8 = u8[p];
      uint4 result;
      for (int j = 0; j < 8; ++j)
        swiglu_forward_one(reinterpret_cast<const __nv_bfloat16*>(&gp),
                           reinterpret_cast<const __nv_bfloat16*>(&up8),
                           reinterpret_cast<__nv_bfloat16*>(&result), j);
      o8[p] = result;
    }
    for (int64_t i = n / 8 * 8 + first; i < n; i += stride) swiglu_forward_one(gate, up, out, i);
  } else {
    for (int64_t i = first; i < n; i += stride) swiglu_forward_one(gate, up, out, i);
  }
}

__device__ void swiglu_backward_one(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                    const __nv_bfloat16* grad, __nv_bfloat16* grad_gate,
                                    __nv_bfloat16* grad_up, int64_t i) {
  const float g = __bfloat162float(gate[i]), u = __bfloat162float(up[i]);
  const float d = __bfloat162float(grad[i]);
  const float s = sigmoid(g);
  grad_up[i] = __float2bfloat16(d * g * s);
  grad_gate[i] = __float2bfloat16(d * u * s * (1.0f + g * (1.0f - s)));
}

__global__ void swiglu_backward_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                       const __nv_bfloat16* grad, __nv_bfloat16* grad_gate,
                                       __nv_bfloat16* grad_up, int64_t n, bool packed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (packed) {
    for (int64_t p = first; p < n / 8; p += stride) {
      const uint4 gp = reinterpret_cast<const uint4*>(gate)[p];
      const uint4 up8 = reinterpret_cast<const uint4*>(up)[p];
      const uint4 dp = reinterpret_cast<const uint4*>(grad)[p];
      uint4 dg, du;
      for (int j = 0; j < 8; ++j)
        swiglu_backward_one(reinterpret_cast<const __nv_bfloat16*>(&gp),
                            reinterpret_cast<const __nv_bfloat16*>(&up8),
                            reinterpret_cast<const __nv_bfloat16*>(&dp),
                            reinterpret_cast<__nv_bfloat16*>(&dg),
                            reinterpret_cast<__nv_bfloat16*>(&du), j);
      reinterpret_cast<uint4*>(grad_gate)[p] = dg;
      reinterpret_cast<uint4*>(grad_up)[p] = du;
    }
    for (int64_t i = n / 8 * 8 + first; i < n; i += stride)
      swiglu_backward_one(gate, up, grad, grad_gate, grad_up, i);
  } else {
    for (int64_t i = first; i < n; i += stride)
      swiglu_backward_one(gate, up, grad, grad_gate, grad_up, i);
  }
}

// One thread per pair (row, head, i < width/2).
__global__ void rotary_kernel(const __nv_bfloat16* x, const __nv_bfloat16* cos,
                              const __nv_bfloat16* sin, __nv_bfloat16* out, int64_t rows,
                              int64_t table_rows, int64_t heads, int64_t width, float sign) {
  const int64_t half = width / 2;
  const int64_t pairs = rows * heads * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += stride) {
    const int64_t i = p % half;
    const int64_t row_head = p / half;
    const int64_t row = row_head / heads % table_rows;
    const int64_t at = row_head * width + i;
    const float a = __bfloat162float(x[at]), b = __bfloat162float(x[at + half]);
    const float c = __bfloat162float(cos[row * half + i]);
    const float s = sign * __bfloat162float(sin[row * half + i]);
    out[at] = __float2bfloat16(a * c - b * s);
    out[at + half] = __float2bfloat16(b * c + a * s);
  }
}

}  // namespace

void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, void* stream) {
  if (n == 0) return;
  const bool packed = aligned16(gate) && aligned16(up) && aligned16(out);
  swiglu_forward_kernel<<<blocks_for(packed ? n / 8 + 1 : n), kThreads, 0,
                          static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up),
      static_cast<__nv_bfloat16*>(out), n, packed);
  check(cudaGetLastError(), "swiglu forward kernel");
}

void swiglu_backward(const void* gate, const void* up, const void* grad, void* grad_gate,
                     void* grad_up, int64_t n, void* stream) {
  if (n == 0) return;
  const bool packed = aligned16(gate) && aligned16(up) && aligned16(grad) && aligned16(grad_gate) &&
                      aligned16(grad_up);
  swiglu_backward_kernel<<<blocks_for(packed ? n / 8 + 1 : n), kThreads, 0,
                           static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up),
      static_cast<const __nv_bfloat16*>(grad), static_cast<__nv_bfloat16*>(grad_gate),
      static_cast<__nv_bfloat16*>(grad_up), n, packed);
  check(cudaGetLastError(), "swiglu backward kernel");
}

void rotary(const void* x, const void* cos, const void* sin, void* out, int64_t rows,
            int64_t table_rows, int64_t heads, int64_t width, bool inverse, void* stream) {
  if (rows * heads * width == 0) return;
  rotary_kernel<<<blocks_for(rows * heads * (width / 2)), kThreads, 0,
                  static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(cos),
      static_cast<const __nv_bfloat16*>(sin), static_cast<__nv_bfloat16*>(out), rows, table_rows,
      heads, width, inverse ? -1.0f : 1.0f);
  check(cudaGetLastError(), "rotary kernel");
}

}  // namespace tessera::exec::kernels

// Fused elementwise kernels for bf16 activations on a GPU, without torch: the gated MLP's
// silu(gate) · up and the rotary position embedding, each one pass over its inputs where ATen
// takes several (and keeps intermediates for the backward). Compiled by nvcc where the build has
// it (TESSERA_CUDA_KERNELS); exec/fused_pointwise.hpp is the torch side.
#pragma once

#include <cstdint>

namespace tessera::exec::kernels {

// out = silu(gate) · up over n bf16 values. `stream` is a cudaStream_t.
void swiglu_forward(const void* gate, const void* up, void* out, int64_t n, void* stream);

// With s = sigmoid(gate): grad_up = grad · gate · s, grad_gate = grad · up · s · (1 + gate ·
// (1 − s)), in fp32 and rounded once.
void swiglu_backward(const void* gate, const void* up, const void* grad, void* grad_gate,
                     void* grad_up, int64_t n, void* stream);

// x and out: rows × heads × width bf16, row-major; cos and sin: table_rows × width/2 bf16, row
// r of x taking the angles of table row r mod table_rows (a batch of sequences of table_rows
// positions). Each pair (i, i + width/2) of a head rotates by its angle: (a cos − b sin,
// b cos + a sin); `inverse` rotates back (the backward: sin negated).
void rotary(const void* x, const void* cos, const void* sin, void* out, int64_t rows,
            int64_t table_rows, int64_t heads, int64_t width, bool inverse, void* stream);

}  // namespace tessera::exec::kernels

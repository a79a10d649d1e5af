#include "exec/fused_pointwise.hpp"

#include <cstdlib>
#include <cstring>

#ifdef TESSERA_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "exec/pointwise_kernels.hpp"
#endif

namespace tessera::exec {

namespace {

torch::Tensor aten_swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  return torch::silu(gate) * up;
}

torch::Tensor aten_rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                                const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor a = x.narrow(-1, 0, half), b = x.narrow(-1, half, half);
  return torch::cat({a * cos - b * sin, b * cos + a * sin}, -1);
}

}  // namespace

#ifdef TESSERA_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool fused(std::initializer_list<const torch::Tensor*> tensors) {
  static const bool off = [] {
    const char* v = std::getenv("TESSERA_UNFUSED");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  if (off) return false;
  for (const torch::Tensor* t : tensors)
    if (!t->is_cuda() || t->scalar_type() != torch::kBFloat16 || !t->is_contiguous()) return false;
  return true;
}

void* stream_of(const torch::Tensor& on) {
  return c10::cuda::getCurrentCUDAStream(on.device().index()).stream();
}

struct FusedSwiglu : torch::autograd::Function<FusedSwiglu> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    torch::Tensor out = torch::empty_like(gate);
    kernels::swiglu_forward(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel(),
                            stream_of(gate));
    ctx->save_for_backward({gate, up});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor grad = grads[0].contiguous();
    torch::Tensor grad_gate = torch::empty_like(saved[0]), grad_up = torch::empty_like(saved[1]);
    kernels::swiglu_backward(saved[0].data_ptr(), saved[1].data_ptr(), grad.data_ptr(),
                             grad_gate.data_ptr(), grad_up.data_ptr(), grad.numel(),
                             stream_of(grad));
    return {grad_gate, grad_up};
  }
};

void rotary_launch(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                   torch::Tensor& out, bool inverse) {
  kernels::rotary(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                  x.size(0) * x.size(1), cos.size(1), x.size(2), x.size(3), inverse, stream_of(x));
}

struct FusedRotary : torch::autograd::Function<FusedRotary> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    torch::Tensor out = torch::empty_like(x);
    rotary_launch(x, cos, sin, out, false);
    ctx->save_for_backward({cos, sin});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor grad = grads[0].contiguous();
    torch::Tensor out = torch::empty_like(grad);
    rotary_launch(grad, saved[0], saved[1], out, true);
    return {out, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
#ifdef TESSERA_CUDA_KERNELS
  if (gate.sizes() == up.sizes() && fused({&gate, &up})) return FusedSwiglu::apply(gate, up);
#endif
  return aten_swiglu(gate, up);
}

torch::Tensor rotate_pairs(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
#ifdef TESSERA_CUDA_KERNELS
  if (x.dim() == 4 && x.size(-1) % 2 == 0 && cos.numel() == x.size(1) * x.size(3) / 2 &&
      fused({&x, &cos, &sin}))
    return FusedRotary::apply(x, cos, sin);
#endif
  return aten_rotate_pairs(x, cos, sin);
}

}  // namespace tessera::exec

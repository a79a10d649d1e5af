#include "exec/fused_cross_entropy.hpp"

#include "shared/base/check.hpp"

#ifdef TESSERA_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>

#include "exec/cross_entropy_kernels.hpp"
#endif

namespace tessera::exec {

bool fused_cross_entropy_applies(const torch::Tensor& logits) {
#ifdef TESSERA_CUDA_KERNELS
  return logits.is_cuda() && logits.scalar_type() == torch::kBFloat16 && logits.dim() == 2 &&
         logits.is_contiguous();
#else
  (void)logits;
  return false;
#endif
}

#ifdef TESSERA_CUDA_KERNELS
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void* current_stream(const torch::Tensor& on) {
  return c10::cuda::getCurrentCUDAStream(on.device().index()).stream();
}

struct FusedCrossEntropy : torch::autograd::Function<FusedCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets) {
    const torch::Tensor t = targets.to(logits.device(), torch::kInt64).contiguous();
    const auto fp32 = logits.options().dtype(torch::kFloat32);
    torch::Tensor lse = torch::empty({logits.size(0)}, fp32);
    torch::Tensor loss = torch::empty({logits.size(0)}, fp32);
    kernels::cross_entropy_forward(logits.data_ptr(), t.data_ptr<int64_t>(), lse.data_ptr<float>(),
                                   loss.data_ptr<float>(), logits.size(0), logits.size(1),
                                   current_stream(logits));
    ctx->save_for_backward({logits, t, lse});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& logits = saved[0];
    const torch::Tensor scale = grads[0].to(torch::kFloat32).contiguous();
    torch::Tensor g = torch::empty_like(logits);
    kernels::cross_entropy_backward(logits.data_ptr(), saved[1].data_ptr<int64_t>(),
                                    saved[2].data_ptr<float>(), scale.data_ptr<float>(),
                                    g.data_ptr(), logits.size(0), logits.size(1),
                                    current_stream(logits));
    return {g, torch::Tensor()};
  }
};

}  // namespace
#endif

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  TESSERA_CHECK(fused_cross_entropy_applies(logits),
                "the fused cross-entropy takes contiguous bf16 logits on a GPU, in a build with "
                "its kernels");
#ifdef TESSERA_CUDA_KERNELS
  return FusedCrossEntropy::apply(logits, targets);
#else
  (void)targets;
  return {};
#endif
}

}  // namespace tessera::exec

#include "exec/adamw.hpp"

#include <torch/version.h>

#include "shared/base/check.hpp"

namespace tessera::exec {

torch::Tensor weighted_squared_norm(const std::vector<torch::Tensor>& grads,
                                    const std::vector<double>& weights) {
  TESSERA_CHECK(grads.size() == weights.size(), "one weight per gradient");
  TESSERA_CHECK(!grads.empty(), "no gradient to take the norm of");
  const auto fp64 = grads.front().options().dtype(torch::kFloat64);
  const torch::Tensor w = torch::tensor(weights, torch::kFloat64).to(fp64.device());
#if TORCH_VERSION_MAJOR >= 2
  const torch::Tensor norms = torch::stack(at::_foreach_norm(grads)).to(torch::kFloat64);
  return (norms * norms * w).sum();
#else
  std::vector<torch::Tensor> squares;
  for (const torch::Tensor& g : grads) squares.push_back(g.to(torch::kFloat64).pow(2).sum());
  return (torch::stack(squares) * w).sum();
#endif
}

void adamw_step(torch::optim::AdamW& optimizer, double scale) {
#if TORCH_VERSION_MAJOR >= 2
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    TESSERA_CHECK(!o.amsgrad(), "the fused AdamW step has no AMSGrad");
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
    std::vector<int64_t> steps;
    for (torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        // As torch::optim::AdamW starts a parameter's state.
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      steps.push_back(state.step());
    }
    if (params.empty()) continue;
    // The kernel reads each parameter's step count from a tensor: one tensor, a view each.
    const torch::Tensor counts =
        torch::tensor(steps, torch::kInt64).to(params.front().options().dtype(torch::kFloat32));
    std::vector<torch::Tensor> state_steps;
    for (std::size_t i = 0; i < steps.size(); ++i)
      state_steps.push_back(counts.select(0, static_cast<int64_t>(i)));
    // The kernel divides each gradient by `grad_scale`: 1 / scale applies the clipping.
    std::optional<at::Tensor> inverse;
    if (scale != 1.0)
      inverse = torch::full({}, 1.0 / scale, params.front().options().dtype(torch::kFloat32));
    const auto [beta1, beta2] = o.betas();
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, state_steps, o.lr(), beta1, beta2,
                      o.weight_decay(), o.eps(), /*amsgrad=*/false, /*maximize=*/false, inverse,
                      std::nullopt);
  }
#else
  if (scale != 1.0)
    for (auto& group : optimizer.param_groups())
      for (torch::Tensor& p : group.params())
        if (p.grad().defined()) p.mutable_grad().mul_(scale);
  optimizer.step();
#endif
}

}  // namespace tessera::exec

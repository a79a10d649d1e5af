#include "exec/working_copies.hpp"

namespace tessera::exec {

namespace {

thread_local WorkingCopies* active = nullptr;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The cached copy as an autograd node of `param`: its backward adds the incoming gradient into
// param.grad() itself, one kernel that converts as it adds, and hands autograd no gradient to
// accumulate.
struct IntoMaster : torch::autograd::Function<IntoMaster> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& param,
                               const torch::Tensor& copy) {
    ctx->saved_data["param"] = param;
    return copy.detach();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (grads[0].defined()) {
      torch::Tensor param = ctx->saved_data["param"].toTensor();
      torch::Tensor& grad = param.mutable_grad();
      if (grad.defined())
        grad.add_(grads[0]);
      else
        grad = grads[0].to(param.scalar_type());
    }
    return {torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor working_copy(const torch::Tensor& param, c10::ScalarType dtype) {
  if (param.scalar_type() == dtype) return param;
  if (active == nullptr) return param.to(dtype);
  return active->get(param, dtype);
}

WorkingCopies::Scope::Scope(WorkingCopies& copies) : previous_(active) {
  active = &copies;
}

WorkingCopies::Scope::~Scope() {
  active = previous_;
}

void WorkingCopies::drop_trainable() {
  std::erase_if(entries_, [](const auto& e) { return e.second.param.requires_grad(); });
}

torch::Tensor WorkingCopies::get(const torch::Tensor& param, c10::ScalarType dtype) {
  Entry& e = entries_[{param.unsafeGetTensorImpl(), static_cast<int>(dtype)}];
  const int64_t version = static_cast<int64_t>(param._version());
  if (!e.copy.defined() || e.version != version) {
    torch::NoGradGuard no_grad;
    e = {param, param.detach().to(dtype), version};
    ++casts_;
  }
  if (!param.requires_grad() || !torch::GradMode::is_enabled()) return e.copy;
  return IntoMaster::apply(param, e.copy);
}

}  // namespace tessera::exec

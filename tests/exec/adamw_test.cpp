// The optimizer's fused passes (exec/adamw.hpp) against torch's own AdamW and a plain norm.
#include <doctest/doctest.h>

#include <vector>

#include <torch/version.h>

#include "exec/adamw.hpp"

using namespace tessera::exec;

namespace {

std::vector<torch::Tensor> parameters(int64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (const int64_t n : {5, 17, 64})
    out.push_back(torch::randn({n, 3}, torch::kFloat32).requires_grad_(true));
  return out;
}

void set_gradients(std::vector<torch::Tensor>& params, int64_t step) {
  torch::manual_seed(100 + step);
  for (torch::Tensor& p : params) p.mutable_grad() = torch::randn_like(p);
}

const torch::optim::AdamWParamState& state_of(torch::optim::AdamW& o, const torch::Tensor& p) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<torch::optim::AdamWParamState&>(*o.state().at(p.unsafeGetTensorImpl()));
#else
  return static_cast<torch::optim::AdamWParamState&>(
      *o.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
#endif
}

}  // namespace

TEST_CASE("the AdamW step equals torch's AdamW, clipping included, and keeps its state") {
  torch::optim::AdamWOptions o(0.01);
  o.betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  std::vector<torch::Tensor> ours = parameters(3), reference = parameters(3);
  torch::optim::AdamW fused(ours, o), plain(reference, o);
  for (int64_t step = 0; step < 4; ++step) {
    const double clip = step % 2 == 0 ? 1.0 : 0.25;
    set_gradients(ours, step);
    set_gradients(reference, step);
    adamw_step(fused, clip);
    for (torch::Tensor& p : reference) p.mutable_grad().mul_(clip);
    plain.step();
    for (std::size_t i = 0; i < ours.size(); ++i) {
      INFO("step " << step << ", parameter " << i);
      CHECK(torch::allclose(ours[i], reference[i], 1e-6, 1e-7));
    }
  }
  // The moments sit where torch keeps them: a checkpoint saves and loads them alike.
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto& a = state_of(fused, ours[i]);
    const auto& b = state_of(plain, reference[i]);
    CHECK(a.step() == 4);
    CHECK(a.step() == b.step());
    // One float rounding apart (torch's fused kernel updates the first moment by lerp).
    CHECK(torch::allclose(a.exp_avg(), b.exp_avg(), 1e-6, 1e-7));
    CHECK(torch::allclose(a.exp_avg_sq(), b.exp_avg_sq(), 1e-6, 1e-10));
  }
}

TEST_CASE("the weighted squared norm of several gradients") {
  torch::manual_seed(9);
  const std::vector<torch::Tensor> grads{torch::randn({7}), torch::randn({3, 4}),
                                         torch::randn({1000})};
  const std::vector<double> weights{1.0, 0.5, 0.25};
  double expected = 0;
  for (std::size_t i = 0; i < grads.size(); ++i)
    expected += weights[i] * grads[i].to(torch::kFloat64).pow(2).sum().item<double>();
  const torch::Tensor got = weighted_squared_norm(grads, weights);
  CHECK((got.scalar_type() == torch::kFloat64));
  CHECK(got.item<double>() == doctest::Approx(expected).epsilon(1e-6));
}

// Mixed precision's working copies: a bf16 block run over several micro-batches with one copy of
// each parameter per step computes what casting at every use computes, to the bit, outputs and
// fp32 gradients alike; copies are made again only when a parameter changes.
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "exec/layers.hpp"
#include "exec/working_copies.hpp"
#include "tests/exec/small_arch.hpp"

using namespace tessera;
using namespace tessera::exec;
using tessera::exec::testing::small_gqa;

namespace {

struct Result {
  std::vector<torch::Tensor> outputs, grads;
  int64_t params = 0, first_casts = 0;  // the block's parameters; copies after one micro-batch
};

// Three micro-batches of bf16 activations through one block, the gradients of all three summed
// into the fp32 parameters' gradients, under `copies` when given.
Result run(WorkingCopies* copies) {
  const Comm alone{{0}, 0, {}};
  ParamSet ps(11, true, alone);
  const Block block(ps, "b", small_gqa(), 0, alone);
  for (Param& p : ps.params()) p.tensor.mutable_grad() = torch::zeros_like(p.tensor);
  std::optional<WorkingCopies::Scope> scope;
  if (copies != nullptr) scope.emplace(*copies);
  Result r;
  torch::manual_seed(5);
  AttentionInputs in;
  in.positions_q = torch::arange(8);
  for (int mb = 0; mb < 3; ++mb) {
    const torch::Tensor x = torch::randn({1, 8, 32}).to(torch::kBFloat16).requires_grad_(true);
    const torch::Tensor out = block.forward(x, in);
    CHECK((out.scalar_type() == torch::kBFloat16));
    torch::autograd::backward({out.to(torch::kFloat32).pow(2).sum()});
    r.outputs.push_back(out.detach());
    r.outputs.push_back(x.grad());
    if (mb == 0 && copies != nullptr) r.first_casts = copies->casts();
  }
  r.params = static_cast<int64_t>(ps.params().size());
  for (const Param& p : ps.params()) r.grads.push_back(p.tensor.grad());
  return r;
}

}  // namespace

TEST_CASE("working copies: the same outputs and fp32 gradients as a cast at every use") {
  const Result plain = run(nullptr);
  WorkingCopies copies;
  const Result cached = run(&copies);
  REQUIRE(plain.grads.size() == cached.grads.size());
  for (std::size_t i = 0; i < plain.outputs.size(); ++i)
    CHECK(torch::equal(plain.outputs[i], cached.outputs[i]));
  for (std::size_t i = 0; i < plain.grads.size(); ++i) {
    INFO("parameter " << i);
    CHECK((cached.grads[i].scalar_type() == torch::kFloat32));
    CHECK(cached.grads[i].abs().sum().item<double>() > 0);
    CHECK(torch::equal(plain.grads[i], cached.grads[i]));
  }
  // One copy per parameter the block uses in bf16, made in the first micro-batch: its six
  // linears' weights (q, k, v, o; up, down), and on torch 2 its norms' (the fused norms take the
  // weight in the activations' dtype).
  CHECK(copies.casts() == cached.first_casts);
  CHECK(copies.casts() == static_cast<int64_t>(copies.size()));
  CHECK(copies.size() >= 6);
  CHECK(copies.size() <= static_cast<std::size_t>(cached.params));
}

TEST_CASE("working copies: made again when the parameter changes; frozen ones kept over steps") {
  WorkingCopies copies;
  const WorkingCopies::Scope scope(copies);
  const torch::Tensor trained = torch::randn({4, 4}).requires_grad_(true);
  const torch::Tensor frozen = torch::randn({4, 4});
  const torch::Tensor a = working_copy(trained, torch::kBFloat16);
  CHECK(torch::equal(a, trained.detach().to(torch::kBFloat16)));
  CHECK(a.requires_grad());
  CHECK(torch::equal(working_copy(frozen, torch::kBFloat16), frozen.to(torch::kBFloat16)));
  CHECK_FALSE(working_copy(frozen, torch::kBFloat16).requires_grad());
  working_copy(trained, torch::kBFloat16);
  CHECK(copies.casts() == 2);
  // An optimizer's step (in place, with an autograd version): a new copy at the next use.
  {
    torch::NoGradGuard no_grad;
    trained.add_(1.0);
  }
  CHECK(
      torch::equal(working_copy(trained, torch::kBFloat16), trained.detach().to(torch::kBFloat16)));
  CHECK(copies.casts() == 3);
  // A write without a version (a fully sharded gather): the optimizer step drops the copy first.
  trained.data().add_(1.0);
  copies.drop_trainable();
  CHECK(copies.size() == 1);
  CHECK(
      torch::equal(working_copy(trained, torch::kBFloat16), trained.detach().to(torch::kBFloat16)));
  working_copy(frozen, torch::kBFloat16);
  CHECK(copies.casts() == 4);
  // A parameter already in the activations' dtype is itself; no scope, a cast of autograd's own.
  CHECK(working_copy(trained, torch::kFloat32).is_same(trained));
}

TEST_CASE("working copies: with no scope in force, a fresh cast at every use") {
  const torch::Tensor p = torch::randn({3}).requires_grad_(true);
  const torch::Tensor a = working_copy(p, torch::kBFloat16), b = working_copy(p, torch::kBFloat16);
  CHECK_FALSE(a.is_same(b));
  torch::autograd::backward({(a.to(torch::kFloat32) + b.to(torch::kFloat32)).sum()});
  CHECK(torch::equal(p.grad(), torch::full({3}, 2.0)));
}

// The executor's layers on one rank: selective recomputation's attention core, attention block
// by block over a packed micro-batch's samples (by spans, or under a mask), the loss block by
// block over its tokens, and on a GPU the fused loss, SwiGLU and rotary kernels.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include <torch/version.h>

#include "exec/data.hpp"
#include "exec/fused_pointwise.hpp"
#include "exec/layers.hpp"
#include "tests/exec/small_arch.hpp"

using namespace tessera;
using namespace tessera::exec;
using tessera::exec::testing::small_gqa;

namespace {

// The names of every node of the autograd graph behind `t`.
std::set<std::string> graph_nodes(const torch::Tensor& t) {
  std::set<std::string> names;
  std::set<const torch::autograd::Node*> seen;
  std::deque<std::shared_ptr<torch::autograd::Node>> next{t.grad_fn()};
  while (!next.empty()) {
    const std::shared_ptr<torch::autograd::Node> node = next.front();
    next.pop_front();
    if (!node || !seen.insert(node.get()).second) continue;
    names.insert(node->name());
    for (const torch::autograd::Edge& e : node->next_edges()) next.push_back(e.function);
  }
  return names;
}

bool any_contains(const std::set<std::string>& names, const std::string& part) {
  for (const std::string& n : names)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("selective recomputation: the attention core keeps no scores, and its gradients hold") {
  const Comm alone{{0}, 0, {}};
  ParamSet ps(7, true, alone);
  Attention attention(ps, "a", small_gqa());
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({1, 16, 32}).requires_grad_(true);
  AttentionInputs in;
  in.bias = torch::full({16, 16}, -std::numeric_limits<float>::infinity()).triu(1);
  in.positions_q = torch::arange(16);
  auto run = [&](bool recompute) {
    attention.recompute_core = recompute;
    const torch::Tensor out = attention.forward(x, in);
    const std::set<std::string> nodes = graph_nodes(out);
    const auto grads = torch::autograd::grad({(out * out).sum()}, {x, attention.q.weight});
    return std::tuple{out.detach(), grads[0], grads[1], nodes};
  };
  const auto [out, dx, dq, nodes] = run(false);
  const auto [out_r, dx_r, dq_r, nodes_r] = run(true);
  CHECK(torch::allclose(out, out_r, 1e-6, 1e-7));
  CHECK(torch::allclose(dx, dx_r, 1e-5, 1e-7));
  CHECK(torch::allclose(dq, dq_r, 1e-5, 1e-7));
  // The plain core keeps what its backward needs (torch 1.13: the softmax of the scores; torch 2:
  // the fused attention's own saved state); the recomputed one keeps q, k and v only.
  INFO(std::accumulate(nodes.begin(), nodes.end(), std::string(),
                       [](std::string all, const std::string& b) { return all + b + " "; }));
#if TORCH_VERSION_MAJOR >= 2
  CHECK(any_contains(nodes, "ScaledDotProduct"));
#else
  CHECK(any_contains(nodes, "Softmax"));
#endif
  CHECK_FALSE(any_contains(nodes_r, "Softmax"));
  CHECK(any_contains(nodes_r, "RecomputedAttention"));
}

TEST_CASE("attention block by block over the samples equals the whole masked sequence") {
  const Comm alone{{0}, 0, {}};
  ParamSet ps(11, true, alone);
  Attention attention(ps, "a", small_gqa());
  // Five samples: two of 5 tokens (an image item of 2, then text), 5 of text, 3 (text, a 1-token
  // item, text) and 4 whose item is split by text (a layout no spans can describe: masked).
  LlmLayout layout;
  layout.sample = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 4, 4, 4, 4};
  layout.item = {0, 0, -1, -1, -1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, -1, 3, -1, 3, -1};
  const auto n = static_cast<int64_t>(layout.sample.size());
  std::vector<int64_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);

  const std::vector<AttentionBlocks> blocks = attention_blocks(layout);
  // The two image-then-text samples batched; the text-only one apart, though as long.
  REQUIRE(blocks.size() == 4);
  const std::vector<std::array<int64_t, 3>> want = {{0, 5, 2}, {10, 5, 1}, {15, 3, 1}, {18, 4, 1}};
  for (std::size_t b = 0; b < want.size(); ++b) {
    INFO("run " << b);
    CHECK(blocks[b].begin == want[b][0]);
    CHECK(blocks[b].length == want[b][1]);
    CHECK(blocks[b].count == want[b][2]);
  }
  const auto spans = [](const AttentionBlocks& run) {
    std::vector<std::array<int64_t, 3>> out;
    for (const AttentionSpan& s : run.spans) out.push_back({s.offset, s.length, s.media ? 1 : 0});
    return out;
  };
  CHECK((spans(blocks[0]) == std::vector<std::array<int64_t, 3>>{{0, 2, 1}, {2, 3, 0}}));
  CHECK((spans(blocks[1]) == std::vector<std::array<int64_t, 3>>{{0, 5, 0}}));
  CHECK((spans(blocks[2]) == std::vector<std::array<int64_t, 3>>{{0, 1, 0}, {1, 1, 1}, {2, 1, 0}}));
  CHECK(blocks[3].spans.empty());
  for (std::size_t b = 0; b < 3; ++b) CHECK_FALSE(blocks[b].bias.defined());
  // The split item's block carries the whole mask's diagonal block.
  const torch::Tensor whole = attention_bias(layout, all, all);
  CHECK(blocks[3].bias.sizes() == torch::IntArrayRef{1, 1, 4, 4});
  CHECK(torch::equal(blocks[3].bias[0][0], whole.slice(0, 18, 22).slice(1, 18, 22)));
  CHECK(whole[0][1].item<float>() == 0.0f);        // an image token sees the next one
  CHECK(std::isinf(whole[2][3].item<float>()));    // text does not see the future
  CHECK(std::isinf(whole[5][4].item<float>()));    // nor another sample
  CHECK(std::isinf(whole[16][15].item<float>()));  // nor an item the text before it

  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({1, n, 32}).requires_grad_(true);
  AttentionInputs dense, blocked;
  dense.bias = whole;
  blocked.blocks = blocks;
  dense.positions_q = blocked.positions_q = torch::tensor(
      std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3});
  for (const bool recompute : {false, true}) {
    attention.recompute_core = recompute;
    const auto run = [&](const AttentionInputs& in) {
      const torch::Tensor out = attention.forward(x, in);
      const auto grads = torch::autograd::grad({(out * out).sum()}, {x, attention.k.weight});
      return std::tuple{out.detach(), grads[0], grads[1]};
    };
    const auto [out, dx, dk] = run(dense);
    const auto [out_b, dx_b, dk_b] = run(blocked);
    INFO("recompute " << recompute);
    CHECK(torch::allclose(out, out_b, 1e-5, 1e-7));
    CHECK(torch::allclose(dx, dx_b, 1e-5, 1e-7));
    CHECK(torch::allclose(dk, dk_b, 1e-5, 1e-7));
  }
}

TEST_CASE("the loss block by block equals log-softmax cross-entropy, value and gradient") {
  torch::manual_seed(21);
  const torch::Tensor base = torch::randn({7, 11}) * 3;
  const torch::Tensor targets = torch::tensor(std::vector<int64_t>{3, -1, 0, 10, 5, -1, 2});
  const torch::Tensor weights = torch::rand({7});  // a different gradient for every token
  const torch::Tensor kept = (targets >= 0).to(torch::kFloat32);
  // Reference in fp64.
  const torch::Tensor x64 = base.to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor picked =
      torch::log_softmax(x64, 1).gather(1, targets.clamp_min(0).unsqueeze(1)).squeeze(1);
  const torch::Tensor want = -picked * kept.to(torch::kFloat64);
  (want * weights.to(torch::kFloat64)).sum().backward();
  for (const auto dtype : {torch::kFloat32, torch::kBFloat16})
    for (const int64_t rows : {0, 1, 3, 7}) {
      INFO("dtype " << dtype << ", block rows " << rows);
      const double tol = dtype == torch::kFloat32 ? 1e-5 : 2e-2;
      const torch::Tensor x = base.to(dtype).clone().requires_grad_(true);
      const torch::Tensor loss = blockwise_cross_entropy(x, targets, rows);
      CHECK((loss.scalar_type() == torch::kFloat32));
      (loss * weights).sum().backward();
      CHECK((x.grad().scalar_type() == dtype));
      CHECK(torch::allclose(loss.to(torch::kFloat64), want.detach(), tol, tol));
      CHECK(torch::allclose(x.grad().to(torch::kFloat64), x64.grad(), tol, tol));
      // Ignored tokens: no loss, no gradient.
      CHECK(loss[1].item<float>() == 0.0f);
      CHECK(x.grad()[5].abs().sum().item<float>() == 0.0f);
    }
}

// Reported as skipped where no GPU is (CI): run on the GPU machine with -tc="*fused loss*".
TEST_CASE("on a GPU, the fused loss kernels equal the blockwise loss" *
          doctest::skip(!torch::cuda::is_available())) {
  torch::manual_seed(22);
  for (const int64_t vocab : {11, 4096, 128256}) {  // 8-wide loads from 4096 on
    INFO("vocabulary " << vocab);
    const int64_t rows = 37;
    const torch::Tensor base = (torch::randn({rows, vocab}) * 4).to(torch::kBFloat16);
    torch::Tensor targets = torch::randint(vocab, {rows}, torch::kInt64);
    targets.index_put_({torch::tensor(std::vector<int64_t>{3, 20})}, -1);
    const torch::Tensor weights = torch::rand({rows});
    const auto run = [&](const torch::Device& on) {
      const torch::Tensor x = base.to(on).clone().requires_grad_(true);
      const torch::Tensor loss = blockwise_cross_entropy(x, targets.to(on));
      (loss * weights.to(on)).sum().backward();
      return std::pair{loss.cpu(), x.grad().cpu().to(torch::kFloat32)};
    };
    const auto [loss, grad] = run(torch::kCUDA);
    const auto [want, want_grad] = run(torch::kCPU);
    CHECK(torch::allclose(loss, want, 1e-4, 1e-4));
    CHECK(torch::allclose(grad, want_grad, 1e-2, 1e-5));
    CHECK(loss[3].item<float>() == 0.0f);
    CHECK(grad[20].abs().sum().item<float>() == 0.0f);
  }
}

// Reported as skipped where no GPU is (CI): run on the GPU machine with -tc="*pointwise*".
TEST_CASE("on a GPU, the fused pointwise kernels equal ATen's ops in fp32" *
          doctest::skip(!torch::cuda::is_available())) {
  torch::manual_seed(23);
  const auto bf16 = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  // silu(gate) · up: 8-wide loads where the size allows, one at a time otherwise.
  for (const int64_t n : {8 * 1024, 1001}) {
    INFO("swiglu over " << n);
    const torch::Tensor gate = bf16(torch::randn({n}) * 3), up = bf16(torch::randn({n}));
    const torch::Tensor weights = torch::randn({n});
    const torch::Tensor g = gate.cuda().requires_grad_(true), u = up.cuda().requires_grad_(true);
    const torch::Tensor out = swiglu(g, u);
    (out.to(torch::kFloat32) * weights.cuda()).sum().backward();
    const torch::Tensor g32 = gate.to(torch::kFloat32).requires_grad_(true);
    const torch::Tensor u32 = up.to(torch::kFloat32).requires_grad_(true);
    const torch::Tensor want = torch::silu(g32) * u32;
    (want * weights).sum().backward();
    CHECK(torch::allclose(out.cpu().to(torch::kFloat32), want.detach(), 1e-2, 1e-2));
    CHECK(torch::allclose(g.grad().cpu().to(torch::kFloat32), g32.grad(), 2e-2, 2e-2));
    CHECK(torch::allclose(u.grad().cpu().to(torch::kFloat32), u32.grad(), 2e-2, 2e-2));
  }
  // Rotary: two sequences of 5 positions, 3 heads of width 8.
  const torch::Tensor x = bf16(torch::randn({2, 5, 3, 8}));
  const torch::Tensor angle = torch::arange(5).unsqueeze(1).to(torch::kFloat32) *
                              torch::tensor(std::vector<float>{1.0f, 0.3f, 0.1f, 0.01f});
  const torch::Tensor cos = bf16(angle.cos().view({1, 5, 1, 4}));
  const torch::Tensor sin = bf16(angle.sin().view({1, 5, 1, 4}));
  const torch::Tensor weights = torch::randn({2, 5, 3, 8});
  const torch::Tensor xg = x.cuda().requires_grad_(true);
  const torch::Tensor out = rotate_pairs(xg, cos.cuda(), sin.cuda());
  (out.to(torch::kFloat32) * weights.cuda()).sum().backward();
  const torch::Tensor x32 = x.to(torch::kFloat32).requires_grad_(true);
  const torch::Tensor c32 = cos.to(torch::kFloat32), s32 = sin.to(torch::kFloat32);
  const torch::Tensor a = x32.narrow(-1, 0, 4), b = x32.narrow(-1, 4, 4);
  const torch::Tensor want = torch::cat({a * c32 - b * s32, b * c32 + a * s32}, -1);
  (want * weights).sum().backward();
  CHECK(torch::allclose(out.cpu().to(torch::kFloat32), want.detach(), 1e-2, 1e-2));
  CHECK(torch::allclose(xg.grad().cpu().to(torch::kFloat32), x32.grad(), 2e-2, 2e-2));
}

// The executor's layers on one rank: selective recomputation's attention core, and attention
// block by block over a packed micro-batch's samples.
#include <doctest/doctest.h>

#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include <torch/version.h>

#include "exec/data.hpp"
#include "exec/layers.hpp"

using namespace tessera;
using namespace tessera::exec;

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

// One layer, 32 wide, 4 query heads over 2 key/value heads of 8.
TransformerArch small_gqa() {
  TransformerArch a;
  a.layers = 1;
  a.hidden = 32;
  a.heads = 4;
  a.kv_heads = 2;
  a.head_dim = 8;
  a.ffn = 64;
  return a;
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
  // Three samples: 5 tokens (an image item of 2, then text), 5 of text, 3 (a 1-token item, text).
  LlmLayout layout;
  layout.sample = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2};
  layout.item = {0, 0, -1, -1, -1, -1, -1, -1, -1, -1, 1, -1, -1};
  const auto n = static_cast<int64_t>(layout.sample.size());
  std::vector<int64_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);

  const std::vector<AttentionBlocks> blocks = attention_blocks(layout);
  REQUIRE(blocks.size() == 2);  // the two samples of 5 batched, then the one of 3
  CHECK(blocks[0].begin == 0);
  CHECK(blocks[0].length == 5);
  CHECK(blocks[0].count == 2);
  CHECK(blocks[1].begin == 10);
  CHECK(blocks[1].length == 3);
  CHECK(blocks[1].count == 1);
  CHECK(blocks[0].bias.sizes() == torch::IntArrayRef{2, 1, 5, 5});
  // Each block's mask is the whole mask's diagonal block: image tokens both ways, text causal.
  const torch::Tensor whole = attention_bias(layout, all, all);
  CHECK(torch::equal(blocks[0].bias[0][0], whole.slice(0, 0, 5).slice(1, 0, 5)));
  CHECK(torch::equal(blocks[0].bias[1][0], whole.slice(0, 5, 10).slice(1, 5, 10)));
  CHECK(torch::equal(blocks[1].bias[0][0], whole.slice(0, 10, 13).slice(1, 10, 13)));
  CHECK(whole[0][1].item<float>() == 0.0f);      // an image token sees the next one
  CHECK(std::isinf(whole[2][3].item<float>()));  // text does not see the future
  CHECK(std::isinf(whole[5][4].item<float>()));  // nor another sample

  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({1, n, 32}).requires_grad_(true);
  AttentionInputs dense, blocked;
  dense.bias = whole;
  blocked.blocks = blocks;
  dense.positions_q = blocked.positions_q =
      torch::tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2});
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

// The executor's layers on one rank: selective recomputation's attention core.
#include <doctest/doctest.h>

#include <deque>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include <torch/version.h>

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

}  // namespace

TEST_CASE("selective recomputation: the attention core keeps no scores, and its gradients hold") {
  const Comm alone{{0}, 0, {}};
  ParamSet ps(7, true, alone);
  TransformerArch a;
  a.layers = 1;
  a.hidden = 32;
  a.heads = 4;
  a.kv_heads = 2;
  a.head_dim = 8;
  a.ffn = 64;
  Attention attention(ps, "a", a);
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

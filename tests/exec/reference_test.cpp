// The executor's layers against references computed another way: scalar loops in double over
// the layers' own weights, written from the formulas (grouped-query attention with rotary
// positions under the image/text mask, the gated MLP, top-k expert routing), not from the
// tensor code they check.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "exec/data.hpp"
#include "exec/layers.hpp"

using namespace tessera;
using namespace tessera::exec;

namespace {

using Matrix = std::vector<std::vector<double>>;  // [row][column]

Matrix to_matrix(const torch::Tensor& t) {
  const torch::Tensor d = t.detach().to(torch::kFloat64).contiguous().reshape({t.size(0), -1});
  Matrix m(static_cast<std::size_t>(d.size(0)),
           std::vector<double>(static_cast<std::size_t>(d.size(1))));
  const auto a = d.accessor<double, 2>();
  for (int64_t i = 0; i < d.size(0); ++i)
    for (int64_t j = 0; j < d.size(1); ++j)
      m[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = a[i][j];
  return m;
}

// x · wᵀ for x (tokens × in) and a linear's weight w (out × in).
Matrix times_transposed(const Matrix& x, const Matrix& w) {
  Matrix y(x.size(), std::vector<double>(w.size(), 0.0));
  for (std::size_t t = 0; t < x.size(); ++t)
    for (std::size_t o = 0; o < w.size(); ++o)
      for (std::size_t i = 0; i < w[o].size(); ++i) y[t][o] += x[t][i] * w[o][i];
  return y;
}

double silu(double v) {
  return v / (1.0 + std::exp(-v));
}

// The gated MLP: down(silu(gate · x) ⊙ (up · x)).
Matrix gated_mlp(const Matrix& x, const Mlp& mlp) {
  const Matrix g = times_transposed(x, to_matrix(mlp.gate.weight));
  const Matrix u = times_transposed(x, to_matrix(mlp.up.weight));
  Matrix inner = g;
  for (std::size_t t = 0; t < g.size(); ++t)
    for (std::size_t j = 0; j < g[t].size(); ++j) inner[t][j] = silu(g[t][j]) * u[t][j];
  return times_transposed(inner, to_matrix(mlp.down.weight));
}

void check_close(const torch::Tensor& got, const Matrix& want, double tolerance) {
  const Matrix g = to_matrix(got.reshape({-1, got.size(-1)}));
  REQUIRE(g.size() == want.size());
  double worst = 0;
  for (std::size_t t = 0; t < g.size(); ++t)
    for (std::size_t j = 0; j < g[t].size(); ++j)
      worst = std::max(worst, std::abs(g[t][j] - want[t][j]) / (1.0 + std::abs(want[t][j])));
  INFO("largest difference " << worst);
  CHECK(worst <= tolerance);
}

}  // namespace

TEST_CASE("grouped-query attention with rotary positions under the image/text mask, by hand") {
  TransformerArch arch;
  arch.layers = 1;
  arch.hidden = 24;
  arch.heads = 6;
  arch.kv_heads = 2;  // query heads 0-2 read key/value head 0, heads 3-5 head 1
  arch.head_dim = 8;
  arch.ffn = 48;
  const Comm alone{{0}, 0, {}};
  ParamSet ps(17, true, alone);
  const Attention attention(ps, "a", arch);
  // Two samples: an image of 3 tokens then 4 of text, and 2 text, an image of 2, 1 text.
  LlmLayout layout;
  layout.sample = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
  layout.item = {0, 0, 0, -1, -1, -1, -1, -1, -1, 1, 1, -1};
  const std::vector<int64_t> position = {0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4};
  const auto n = static_cast<int64_t>(layout.sample.size());
  torch::manual_seed(29);
  const torch::Tensor x = torch::randn({1, n, arch.hidden});

  // The reference: project, rotate each head's pairs (i, i + d/2) by position · 10000^(-2i/d),
  // and attend where the mask allows (text: its sample up to itself; an image token: its image).
  const Matrix xs = to_matrix(x[0]);
  Matrix q = times_transposed(xs, to_matrix(attention.q.weight));
  Matrix k = times_transposed(xs, to_matrix(attention.k.weight));
  const Matrix v = times_transposed(xs, to_matrix(attention.v.weight));
  const int64_t d = arch.head_dim;
  const auto rotate = [&](Matrix& m, int64_t heads) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < d / 2; ++i) {
          const double angle =
              static_cast<double>(position[static_cast<std::size_t>(t)]) *
              std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
          double& a = m[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * d + i)];
          double& b = m[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * d + i + d / 2)];
          const double a0 = a, b0 = b;
          a = a0 * std::cos(angle) - b0 * std::sin(angle);
          b = b0 * std::cos(angle) + a0 * std::sin(angle);
        }
  };
  rotate(q, arch.heads);
  rotate(k, arch.kv_heads);
  const auto sees = [&](int64_t query, int64_t key) {
    const auto qi = static_cast<std::size_t>(query), ki = static_cast<std::size_t>(key);
    if (layout.sample[qi] != layout.sample[ki]) return false;
    return layout.item[qi] < 0 ? key <= query : layout.item[ki] == layout.item[qi];
  };
  Matrix heads_out(static_cast<std::size_t>(n),
                   std::vector<double>(static_cast<std::size_t>(arch.heads * d), 0.0));
  const int64_t group = arch.heads / arch.kv_heads;
  for (int64_t h = 0; h < arch.heads; ++h) {
    const int64_t kv = h / group;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> score(static_cast<std::size_t>(n), -INFINITY);
      double top = -INFINITY;
      for (int64_t s = 0; s < n; ++s) {
        if (!sees(t, s)) continue;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i)
          dot += q[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * d + i)] *
                 k[static_cast<std::size_t>(s)][static_cast<std::size_t>(kv * d + i)];
        score[static_cast<std::size_t>(s)] = dot / std::sqrt(static_cast<double>(d));
        top = std::max(top, score[static_cast<std::size_t>(s)]);
      }
      double sum = 0;
      for (double& e : score) sum += (e = std::exp(e - top));
      for (int64_t s = 0; s < n; ++s)
        for (int64_t i = 0; i < d; ++i)
          heads_out[static_cast<std::size_t>(t)][static_cast<std::size_t>(h * d + i)] +=
              score[static_cast<std::size_t>(s)] / sum *
              v[static_cast<std::size_t>(s)][static_cast<std::size_t>(kv * d + i)];
    }
  }
  const Matrix want = times_transposed(heads_out, to_matrix(attention.o.weight));

  std::vector<int64_t> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  AttentionInputs masked, spans;
  masked.bias = attention_bias(layout, all, all);
  spans.blocks = attention_blocks(layout);
  REQUIRE_FALSE(spans.blocks.front().spans.empty());
  masked.positions_q = spans.positions_q = torch::tensor(position);
  check_close(attention.forward(x, masked), want, 1e-6);
  check_close(attention.forward(x, spans), want, 1e-6);
}

namespace {

// A one-layer MoE stack 16 wide with gated experts of 12.
TransformerArch tiny_moe(int64_t experts, int64_t top_k) {
  TransformerArch arch;
  arch.layers = 1;
  arch.hidden = 16;
  arch.heads = 2;
  arch.head_dim = 8;
  arch.ffn = 24;
  arch.gated_ffn = true;
  arch.experts = experts;
  arch.top_k = top_k;
  arch.moe_ffn = 12;
  return arch;
}

// The softmax of one token's router scores.
std::vector<double> probabilities(const std::vector<double>& scores) {
  const double top = *std::max_element(scores.begin(), scores.end());
  std::vector<double> p(scores.size());
  double sum = 0;
  for (std::size_t e = 0; e < p.size(); ++e) sum += (p[e] = std::exp(scores[e] - top));
  for (double& e : p) e /= sum;
  return p;
}

}  // namespace

TEST_CASE("top-k expert routing and the gated experts, by hand") {
  const TransformerArch arch = tiny_moe(4, 2);
  const Comm alone{{0}, 0, {}};
  ParamSet ps(19, true, alone);
  const Moe moe(ps, "moe", arch, alone);
  REQUIRE(moe.experts.size() == 4);
  torch::manual_seed(31);
  const torch::Tensor x = torch::randn({1, 9, arch.hidden});
  const Matrix xs = to_matrix(x[0]);

  // The reference: softmax over the router's scores, the two most probable experts, their
  // probabilities renormalized to sum to one weighting their MLPs' outputs.
  const Matrix scores = times_transposed(xs, to_matrix(moe.router.weight));
  Matrix want(xs.size(), std::vector<double>(static_cast<std::size_t>(arch.hidden), 0.0));
  for (std::size_t t = 0; t < xs.size(); ++t) {
    const std::vector<double> p = probabilities(scores[t]);
    std::vector<std::size_t> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return p[a] > p[b]; });
    const double kept = p[order[0]] + p[order[1]];
    for (std::size_t r = 0; r < 2; ++r) {
      const Matrix y = gated_mlp({xs[t]}, moe.experts[order[r]]);
      for (std::size_t j = 0; j < want[t].size(); ++j) want[t][j] += p[order[r]] / kept * y[0][j];
    }
  }
  check_close(moe.forward(x), want, 1e-6);
}

TEST_CASE("group-limited routing, by hand: a token's experts from its best group") {
  TransformerArch arch = tiny_moe(8, 2);
  arch.router_groups = 4;  // experts {0, 1}, {2, 3}, {4, 5}, {6, 7}
  arch.router_group_top_k = 1;
  const Comm alone{{0}, 0, {}};
  ParamSet ps(23, true, alone);
  const Moe moe(ps, "moe", arch, alone);
  torch::manual_seed(37);
  const torch::Tensor x = torch::randn({1, 12, arch.hidden});
  const Matrix xs = to_matrix(x[0]);

  // The reference: the group whose two experts' probabilities sum highest, and both of them,
  // weighted by their probabilities renormalized over the two.
  const Matrix scores = times_transposed(xs, to_matrix(moe.router.weight));
  Matrix want(xs.size(), std::vector<double>(static_cast<std::size_t>(arch.hidden), 0.0));
  bool differs = false;  // some token's two best experts lie in different groups
  for (std::size_t t = 0; t < xs.size(); ++t) {
    const std::vector<double> p = probabilities(scores[t]);
    std::size_t best = 0;
    for (std::size_t g = 1; g < 4; ++g)
      if (p[2 * g] + p[2 * g + 1] > p[2 * best] + p[2 * best + 1]) best = g;
    std::vector<std::size_t> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return p[a] > p[b]; });
    differs = differs || order[0] / 2 != order[1] / 2;
    const double kept = p[2 * best] + p[2 * best + 1];
    for (std::size_t e = 2 * best; e < 2 * best + 2; ++e) {
      const Matrix y = gated_mlp({xs[t]}, moe.experts[e]);
      for (std::size_t j = 0; j < want[t].size(); ++j) want[t][j] += p[e] / kept * y[0][j];
    }
  }
  CHECK(differs);  // so plain top-k routing would not pass
  check_close(moe.forward(x), want, 1e-6);
}

#include "exec/layers.hpp"

#include <cmath>

#include <torch/version.h>

#include "exec/device.hpp"
#include "exec/fused_cross_entropy.hpp"
#include "exec/fused_pointwise.hpp"
#include "exec/torch_compat.hpp"
#include "exec/weights.hpp"
#include "exec/working_copies.hpp"
#include "shared/base/check.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

namespace {

constexpr double kInitScale = 0.02;

// A parameter (fp32, the master copy) in the dtype of the activation it meets: its bf16 working
// copy under mixed precision, whose gradient goes into the fp32 parameter's.
torch::Tensor as(const torch::Tensor& param, const torch::Tensor& x) {
  return working_copy(param, x.scalar_type());
}

torch::Tensor rotary_embed(const torch::Tensor& x, const AttentionInputs& in) {
  // x: (B, L, heads, d); rotate pairs (i, i + d/2) by position · 10000^(-2i/d). The cosines and
  // sines are computed once per width and dtype for all the layers that share `in`.
  const int64_t d = x.size(-1);
  auto& table = in.rotary_tables[{d, static_cast<int>(x.scalar_type())}];
  if (!table.first.defined()) {
    const auto options = torch::TensorOptions().dtype(torch::kFloat64).device(x.device());
    const torch::Tensor inv =
        torch::pow(10000.0, -torch::arange(0, d / 2, options) * 2.0 / static_cast<double>(d));
    const torch::Tensor angle =
        in.positions_q.to(torch::kFloat64).unsqueeze(1) * inv.unsqueeze(0);  // (L, d/2)
    table = {angle.cos().to(x.scalar_type()).view({1, -1, 1, d / 2}),
             angle.sin().to(x.scalar_type()).view({1, -1, 1, d / 2})};
  }
  return rotate_pairs(x, table.first, table.second);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Which keys each query sees: an additive `bias` (undefined: all) or `causal` (see attention()).
struct AttentionMask {
  torch::Tensor bias;
  bool causal = false;
};

// softmax(q kᵀ / sqrt(d) + mask) v keeping q, k, v and the mask only; the backward computes the
// core again, with its graph, and differentiates that.
struct RecomputedAttention : torch::autograd::Function<RecomputedAttention> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const AttentionMask& mask) {
    ctx->save_for_backward({q, k, v});
    ctx->saved_data["bias"] = mask.bias;
    ctx->saved_data["causal"] = mask.causal;
    return attention(q, k, v, mask.bias, mask.causal);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    for (const torch::Tensor& t : saved) inputs.push_back(t.detach().requires_grad_(true));
    torch::Tensor out;
    {
      torch::AutoGradMode graph(true);
      out = attention(inputs[0], inputs[1], inputs[2], ctx->saved_data["bias"].toTensor(),
                      ctx->saved_data["causal"].toBool());
    }
    variable_list g = torch::autograd::grad({out}, inputs, {grads[0]});
    g.push_back(torch::Tensor());
    return g;
  }
};

}  // namespace

torch::Tensor ParamSet::add(const std::string& name, torch::Tensor full, int64_t shard_dim) {
  // Seeded on the CPU, whatever the device: the same weights on every device and precision.
  torch::Tensor local = shard_dim < 0 ? full : shard(full, shard_dim, tp_.rank, tp_.size());
  local = local.to(device_setting().device);
  local.set_requires_grad(trainable_);
  const bool sharded = shard_dim >= 0 && tp_.size() > 1;
  params_.push_back({name, local, (sharded ? 1 : tp_.size()) * replicas_});
  return local;
}

torch::Tensor ParamSet::rows_of(const std::string& name, torch::Tensor full, int64_t first,
                                int64_t rows, int64_t copies) {
  torch::Tensor local = full.narrow(0, first, rows).clone().to(device_setting().device);
  local.set_requires_grad(trainable_);
  params_.push_back({name, local, copies * replicas_, /*kv_replica=*/true});
  return local;
}

torch::Tensor ParamSet::weight(const std::string& name, std::vector<int64_t> shape, double scale,
                               int64_t shard_dim, int64_t pad_to) {
  // Seeded at the unpadded shape: the same values as a run without padding.
  torch::Tensor full = seeded_uniform(seed_, name, shape, scale);
  if (pad_to > 0 && shard_dim >= 0 && pad_to > shape[static_cast<std::size_t>(shard_dim)]) {
    std::vector<int64_t> zeros = shape;
    zeros[static_cast<std::size_t>(shard_dim)] =
        pad_to - shape[static_cast<std::size_t>(shard_dim)];
    full = torch::cat({full, torch::zeros(zeros, full.options())}, shard_dim);
  }
  return add(name, full, shard_dim);
}

torch::Tensor ParamSet::constant(const std::string& name, std::vector<int64_t> shape, double value,
                                 int64_t shard_dim) {
  return add(name, torch::full(shape, value, torch::kFloat32), shard_dim);
}

Linear::Linear(ParamSet& ps, const std::string& name, int64_t in, int64_t out, bool with_bias,
               Split s, int64_t padded)
    : split(s), tp(&ps.tp()) {
  weight = ps.weight(name + ".weight", {out, in}, kInitScale,
                     s == Split::kColumn ? 0
                     : s == Split::kRow  ? 1
                                         : -1,
                     padded);
  const int64_t bias_rows = s == Split::kColumn && padded > out ? padded : out;
  const std::size_t from = ps.params().size();
  if (with_bias) bias = ps.constant(name + ".bias", {bias_rows}, 0.0, s == Split::kColumn ? 0 : -1);
  // A row-parallel bias is added to the reduce-scattered rows under sequence parallelism.
  if (s == Split::kRow) ps.mark_sequence_partial(from);
}

torch::Tensor Linear::forward(const torch::Tensor& x) const {
  switch (split) {
    case Split::kColumn:
      return forward_entered(copy_to_group(x, *tp));
    case Split::kRow: {
      torch::Tensor y = reduce_from_group(torch::matmul(x, as(weight, x).t()), *tp);
      return bias.defined() ? y + as(bias, x) : y;
    }
    case Split::kReplicated:
      break;
  }
  torch::Tensor y = torch::matmul(x, as(weight, x).t());
  return bias.defined() ? y + as(bias, x) : y;
}

Norm::Norm(ParamSet& ps, const std::string& name, int64_t hidden, NormKind k) : kind(k) {
  const std::size_t from = ps.params().size();
  weight = ps.constant(name + ".weight", {hidden}, 1.0);
  if (kind == NormKind::kLayerNorm) bias = ps.constant(name + ".bias", {hidden}, 0.0);
  ps.mark_sequence_partial(from);
}

torch::Tensor Linear::forward_entered(const torch::Tensor& x) const {
  TESSERA_CHECK(split == Split::kColumn);
  torch::Tensor y = torch::matmul(x, as(weight, x).t());
  return bias.defined() ? y + as(bias, x) : y;
}

torch::Tensor Linear::forward_scattered(const torch::Tensor& x,
                                        const std::vector<int64_t>& rows) const {
  TESSERA_CHECK(split == Split::kRow);
  torch::Tensor y = reduce_scatter_to_rows(torch::matmul(x, as(weight, x).t()), *tp, rows);
  return bias.defined() ? y + as(bias, x) : y;
}

std::vector<torch::Tensor> gathered(const std::vector<const Linear*>& linears,
                                    const torch::Tensor& x, const AttentionInputs& in) {
  std::vector<torch::Tensor> weights, biases;
  for (const Linear* l : linears) {
    TESSERA_CHECK(l->split == Split::kColumn && l->tp == in.sp,
                  "sequence parallelism gathers for column-parallel linears of its TP group");
    weights.push_back(as(l->weight, x));
    biases.push_back(l->bias.defined() ? as(l->bias, x) : torch::Tensor());
  }
  return gathered_linears(x, *in.sp, in.sp_rows, weights, biases);
}

torch::Tensor Norm::forward(const torch::Tensor& x) const {
  if (!weight.defined()) return x;
#if TORCH_VERSION_MAJOR >= 2
  // One fused kernel each way on a GPU (statistics in fp32 inside), with the weights in the
  // activations' dtype as Megatron-LM's and Transformer Engine's norms take them.
  if (kind == NormKind::kLayerNorm)
    return torch::layer_norm(x, {x.size(-1)}, as(weight, x), as(bias, x), 1e-5);
  return at::rms_norm(x, {x.size(-1)}, as(weight, x), 1e-6);
#else
  // In fp32 whatever the activations' dtype, back in theirs after.
  const torch::Tensor f = x.to(torch::kFloat32);
  if (kind == NormKind::kLayerNorm)
    return torch::layer_norm(f, {f.size(-1)}, weight, bias, 1e-5).to(x.scalar_type());
  return (f * torch::rsqrt(f.pow(2).mean(-1, true) + 1e-6) * weight).to(x.scalar_type());
#endif
}

Attention::Attention(ParamSet& ps, const std::string& name, const TransformerArch& real, bool pad) {
  const int64_t tp = ps.tp().size();
  // The heads this runs: the model's, or padded with zero heads to a multiple of TP. The
  // weights are seeded at the model's sizes, then extended with zeros (`padded`).
  const TransformerArch arch = pad && !accepts_tp(real, tp) ? pad_heads(real, tp) : real;
  TESSERA_CHECK(arch.heads == real.heads || (real.kv_lora_rank == 0 && arch.kv_heads == arch.heads),
                name + ": only multi-head attention is padded");
  const int64_t kv = arch.kv_heads > 0 ? arch.kv_heads : arch.heads;
  const std::string why = tp_refusal(arch, name, tp);
  TESSERA_CHECK(why.empty(), "tp " + why);
  head_dim = arch.head_dim > 0 ? arch.head_dim : arch.hidden / arch.heads;
  heads = arch.heads / tp;
  const int64_t padded = arch.heads != real.heads ? arch.heads * head_dim : 0;
  const int64_t real_heads = real.heads;
  rotary = arch.positions == 0;
  value_dim = value_head_dim(arch);
  if (arch.kv_lora_rank > 0) {
    // Multi-head latent attention (no biases: validated).
    kv_rank = arch.kv_lora_rank;
    rope_dim = arch.rope_head_dim;
    kv_heads = heads;  // keys and values expand to every head
    if (arch.q_lora_rank > 0) {
      q_down =
          Linear(ps, name + ".q_down", arch.hidden, arch.q_lora_rank, false, Split::kReplicated);
      q_latent_norm = Norm(ps, name + ".q_latent_norm", arch.q_lora_rank, arch.norm);
      q = Linear(ps, name + ".q", arch.q_lora_rank, arch.heads * head_dim, false, Split::kColumn);
    } else {
      q = Linear(ps, name + ".q", arch.hidden, arch.heads * head_dim, false, Split::kColumn);
    }
    kv_down =
        Linear(ps, name + ".kv_down", arch.hidden, kv_rank + rope_dim, false, Split::kReplicated);
    kv_latent_norm = Norm(ps, name + ".kv_latent_norm", kv_rank, arch.norm);
    kv_up = Linear(ps, name + ".kv_up", kv_rank, arch.heads * (head_dim - rope_dim + value_dim),
                   false, Split::kColumn);
    o = Linear(ps, name + ".o", arch.heads * value_dim, arch.hidden, false, Split::kRow);
    return;
  }
  const bool qkv_bias = arch.linear_bias || arch.qkv_bias;
  q = Linear(ps, name + ".q", arch.hidden, real_heads * head_dim, qkv_bias, Split::kColumn, padded);
  if (kv >= tp) {
    kv_heads = kv / tp;
    // Padded only where key/value heads are the heads (multi-head attention).
    const int64_t real_kv = padded > 0 ? real_heads : kv;
    k = Linear(ps, name + ".k", arch.hidden, real_kv * head_dim, qkv_bias && arch.key_bias,
               Split::kColumn, padded);
    v = Linear(ps, name + ".v", arch.hidden, real_kv * head_dim, qkv_bias, Split::kColumn, padded);
  } else {
    // Fewer key/value heads than ranks: each rank holds the one its query heads use, replicated
    // on tp / kv ranks (Megatron's rule); their gradients are summed over those ranks.
    kv_heads = 1;
    const int64_t copies = tp / kv, head = ps.tp().rank / copies;
    const auto replica = [&](const std::string& n, bool bias) {
      Linear l;
      l.split = Split::kColumn;
      l.tp = &ps.tp();
      l.weight = ps.rows_of(
          n + ".weight",
          seeded_uniform(ps.seed(), n + ".weight", {kv * head_dim, arch.hidden}, kInitScale),
          head * head_dim, head_dim, copies);
      if (bias)
        l.bias = ps.rows_of(n + ".bias", torch::zeros({kv * head_dim}), head * head_dim, head_dim,
                            copies);
      return l;
    };
    k = replica(name + ".k", qkv_bias && arch.key_bias);
    v = replica(name + ".v", qkv_bias);
  }
  o = Linear(ps, name + ".o", real_heads * head_dim, arch.hidden, arch.linear_bias || arch.out_bias,
             Split::kRow, padded);
  if (arch.qk_norm) {
    // Refused under TP (executor_plan_support): each rank's heads would give the one weight a
    // partial gradient.
    TESSERA_CHECK(tp == 1, name + ": query/key norms under tensor parallelism");
    q_norm = Norm(ps, name + ".q_norm", head_dim, arch.norm);
    k_norm = Norm(ps, name + ".k_norm", head_dim, arch.norm);
  }
}

torch::Tensor Attention::forward(const torch::Tensor& x, const AttentionInputs& in) const {
  // Under sequence parallelism x holds this rank's rows: Q, K and V come from every row.
  const bool sp = in.sequence_parallel();
  const int64_t b = x.size(0);
  int64_t l = x.size(1);
  torch::Tensor qh, kh, vh;
  if (sp) {
    TESSERA_CHECK(b == 1 && kv_rank == 0,
                  "sequence parallelism needs one packed sequence and no latent attention");
    const std::vector<torch::Tensor> qkv = gathered({&q, &k, &v}, x.squeeze(0), in);
    l = qkv[0].size(0);
    qh = qkv[0].view({b, l, heads, head_dim});
    kh = qkv[1].view({b, l, kv_heads, head_dim});
    vh = qkv[2].view({b, l, kv_heads, head_dim});
  } else if (kv_rank > 0) {
    // The latents from the whole input on every rank, normalized, then entered into the TP
    // group: that sums their gradients from every rank's heads, so the whole-on-every-rank
    // weights (down-projections and latent norms) get the same full gradient everywhere.
    const torch::Tensor query_in =
        q_down.weight.defined() ? copy_to_group(q_latent_norm.forward(q_down.forward(x)), *q.tp)
                                : copy_to_group(x, *q.tp);
    qh = q.forward_entered(query_in).view({b, l, heads, head_dim});
    const torch::Tensor down = kv_down.forward(x);
    const torch::Tensor latent = copy_to_group(
        torch::cat(
            {kv_latent_norm.forward(down.narrow(2, 0, kv_rank)), down.narrow(2, kv_rank, rope_dim)},
            2),
        *q.tp);
    const torch::Tensor kv = kv_up.forward_entered(latent.narrow(2, 0, kv_rank))
                                 .view({b, l, heads, head_dim - rope_dim + value_dim});
    // Rotary positions on the last rope_dim values of each query head and on the one rotary
    // key every head shares.
    torch::Tensor q_rope = qh.narrow(3, head_dim - rope_dim, rope_dim);
    torch::Tensor k_rope = latent.narrow(2, kv_rank, rope_dim).unsqueeze(2);
    if (in.positions_q.defined()) {
      q_rope = rotary_embed(q_rope, in);
      k_rope = rotary_embed(k_rope, in);
    }
    qh = torch::cat({qh.narrow(3, 0, head_dim - rope_dim), q_rope}, 3);
    kh = torch::cat({kv.narrow(3, 0, head_dim - rope_dim), k_rope.expand({b, l, heads, rope_dim})},
                    3);
    vh = kv.narrow(3, head_dim - rope_dim, value_dim);
  } else {
    const torch::Tensor entered = copy_to_group(x, *q.tp);
    qh = q.forward_entered(entered).view({b, l, heads, head_dim});
    kh = k.forward_entered(entered).view({b, l, kv_heads, head_dim});
    vh = v.forward_entered(entered).view({b, l, kv_heads, head_dim});
  }
  if (q_norm.weight.defined()) {
    qh = q_norm.forward(qh);
    kh = k_norm.forward(kh);
  }
  if (rotary && in.positions_q.defined() && kv_rank == 0) {
    qh = rotary_embed(qh, in);
    kh = rotary_embed(kh, in);
  }
  if (in.cp != nullptr && in.cp->size() > 1) {
    TESSERA_CHECK(b == 1, "context parallelism needs one packed sequence");
    // Keys and values together in one gather per layer (its backward one reduce-scatter), as
    // the Program counts them.
    const int64_t key_width = kh.size(3);
    const torch::Tensor kv =
        gather_rows(torch::cat({kh, vh}, 3).squeeze(0), *in.cp, in.cp_rows).unsqueeze(0);
    kh = kv.narrow(3, 0, key_width);
    vh = kv.narrow(3, key_width, kv.size(3) - key_width);
  }
  if (kv_heads != heads) {
    kh = kh.repeat_interleave(heads / kv_heads, 2);
    vh = vh.repeat_interleave(heads / kv_heads, 2);
  }
  // (B, L, heads, d) in, (B, L, heads, value_dim) out.
  const auto core = [&](const torch::Tensor& qb, const torch::Tensor& kb, const torch::Tensor& vb,
                        const torch::Tensor& bias, bool causal = false) {
    const torch::Tensor qt = qb.transpose(1, 2), kt = kb.transpose(1, 2), vt = vb.transpose(1, 2);
    return (recompute_core && torch::GradMode::is_enabled()
                ? RecomputedAttention::apply(qt, kt, vt, AttentionMask{bias, causal})
                : attention(qt, kt, vt, bias, causal))
        .transpose(1, 2);
  };
  // Blocks that share their spans: the text's rows from one causal call over the block up to its
  // last text token, each media item's from an unmasked call over the item alone.
  const auto spanned = [&](const torch::Tensor& qb, const torch::Tensor& kb,
                           const torch::Tensor& vb, const std::vector<AttentionSpan>& spans) {
    int64_t text_end = 0;
    for (const AttentionSpan& s : spans)
      if (!s.media) text_end = s.offset + s.length;
    const auto prefix = [&](const torch::Tensor& t) { return t.narrow(1, 0, text_end); };
    const torch::Tensor text =
        text_end > 0 ? core(prefix(qb), prefix(kb), prefix(vb), {}, true) : torch::Tensor();
    std::vector<torch::Tensor> pieces;
    for (const AttentionSpan& s : spans) {
      const auto span = [&](const torch::Tensor& t) { return t.narrow(1, s.offset, s.length); };
      pieces.push_back(s.media ? core(span(qb), span(kb), span(vb), {}) : span(text));
    }
    return pieces.size() == 1 ? pieces.front() : torch::cat(pieces, 1);
  };
  // The output projection: all-reduced, or reduce-scattered to this rank's rows.
  const auto project = [&](const torch::Tensor& y) {
    return sp ? o.forward_scattered(y.squeeze(0), in.sp_rows).unsqueeze(0) : o.forward(y);
  };
  if (in.blocks.empty())
    return project(core(qh, kh, vh, in.bias).reshape({b, l, heads * value_dim}));
  TESSERA_CHECK(b == 1 && kh.size(1) == l, "attention blocks need one packed sequence");
  std::vector<torch::Tensor> parts;
  int64_t at = 0;
  for (const AttentionBlocks& run : in.blocks) {
    TESSERA_CHECK(run.begin == at, "attention blocks must cover the sequence in order");
    at += run.count * run.length;
    const auto blocks = [&](const torch::Tensor& t) {
      return t.narrow(1, run.begin, run.count * run.length)
          .reshape({run.count, run.length, t.size(2), t.size(3)});
    };
    parts.push_back((run.spans.empty() ? core(blocks(qh), blocks(kh), blocks(vh), run.bias)
                                       : spanned(blocks(qh), blocks(kh), blocks(vh), run.spans))
                        .reshape({1, run.count * run.length, heads * value_dim}));
  }
  TESSERA_CHECK(at == l, "attention blocks must cover the sequence");
  return project(parts.size() == 1 ? parts.front() : torch::cat(parts, 1));
}

Mlp::Mlp(ParamSet& ps, const std::string& name, const TransformerArch& arch, int64_t width)
    : gated(arch.gated_ffn) {
  const bool bias = arch.linear_bias || arch.mlp_bias;
  up = Linear(ps, name + ".up", arch.hidden, width, bias, Split::kColumn);
  if (gated) gate = Linear(ps, name + ".gate", arch.hidden, width, bias, Split::kColumn);
  down = Linear(ps, name + ".down", width, arch.hidden, bias, Split::kRow);
}

torch::Tensor Mlp::forward(const torch::Tensor& x) const {
  const torch::Tensor entered = copy_to_group(x, *up.tp);
  if (gated)
    return down.forward(swiglu(gate.forward_entered(entered), up.forward_entered(entered)));
  return down.forward(torch::gelu(up.forward_entered(entered)));
}

torch::Tensor Mlp::forward(const torch::Tensor& x, const AttentionInputs& in) const {
  if (!in.sequence_parallel()) return forward(x);
  const torch::Tensor rows = x.reshape({-1, x.size(-1)});
  torch::Tensor inner;
  if (gated) {
    const std::vector<torch::Tensor> gate_up = gathered({&gate, &up}, rows, in);
    inner = swiglu(gate_up[0], gate_up[1]);
  } else {
    inner = torch::gelu(gathered({&up}, rows, in)[0]);
  }
  return down.forward_scattered(inner, in.sp_rows).view(x.sizes());
}

torch::Tensor Mlp::partial(const torch::Tensor& entered) const {
  const torch::Tensor inner =
      gated ? swiglu(gate.forward_entered(entered), up.forward_entered(entered))
            : torch::gelu(up.forward_entered(entered));
  return torch::matmul(inner, as(down.weight, inner).t());
}

Moe::Moe(ParamSet& ps, const std::string& name, const TransformerArch& arch, const Comm& group)
    : top_k(arch.top_k),
      total(arch.experts),
      groups(arch.router_groups),
      group_top_k(arch.router_group_top_k),
      ep(&group) {
  TESSERA_CHECK(arch.experts % group.size() == 0, name + ": " + std::to_string(group.size()) +
                                                      " EP ranks do not divide " +
                                                      std::to_string(arch.experts) + " experts");
  // With router_bias, a learned bias per expert on the scores.
  router =
      Linear(ps, name + ".router", arch.hidden, arch.experts, arch.router_bias, Split::kReplicated);
  const int64_t local = arch.experts / group.size();
  first_expert = group.rank * local;
  const std::size_t from = ps.params().size();
  for (int64_t e = first_expert; e < first_expert + local; ++e)
    experts.emplace_back(ps, name + ".experts." + std::to_string(e), arch, arch.moe_ffn);
  ps.mark_experts(from);
  if (arch.shared_expert_ffn > 0) {
    shared = Mlp(ps, name + ".shared", arch, arch.shared_expert_ffn);
    has_shared = true;
  }
}

torch::Tensor Moe::forward(const torch::Tensor& x) const {
  const int64_t hidden = x.size(-1);
  const torch::Tensor tokens = x.reshape({-1, hidden});
  // Route: each token's top_k experts and their weights. The router is replicated over TP, its
  // input too, so every TP rank routes alike.
  const torch::Tensor probs = torch::softmax(router.forward(tokens).to(torch::kFloat32), -1);
  torch::Tensor allowed = probs;
  if (groups > 1 && group_top_k < groups) {
    // Group-limited: the experts outside a token's best groups leave the race (probabilities
    // are positive, so -1 is never picked: the best groups hold at least top_k experts).
    const torch::Tensor by_group = probs.view({probs.size(0), groups, total / groups});
    const int64_t per_group = std::max<int64_t>(1, top_k / group_top_k);
    const torch::Tensor score = std::get<0>(by_group.topk(per_group, -1)).sum(-1);
    const torch::Tensor best = std::get<1>(score.topk(group_top_k, -1));
    const torch::Tensor kept = torch::zeros_like(score, torch::kBool).scatter(1, best, true);
    allowed = probs.masked_fill(
        kept.unsqueeze(-1).expand_as(by_group).reshape_as(probs).logical_not(), -1.0);
  }
  const auto [top, chosen] = allowed.topk(top_k, -1);
  const torch::Tensor weights = (top / top.sum(-1, true)).to(x.scalar_type()).reshape({-1});
  // Assignments (token, expert) ordered by expert, so each EP rank's are contiguous.
  const torch::Tensor expert_of = chosen.reshape({-1});
  const torch::Tensor order = std::get<1>(expert_of.sort(/*stable=*/true, 0, false));
  const torch::Tensor sorted_expert = expert_of.index_select(0, order);
  const torch::Tensor token_of = order.div(top_k, "floor");
  // Tokens per expert, and so per EP rank (each holds `local` experts in a row).
  const int64_t local = total / ep->size();
  const torch::Tensor per_expert = sorted_expert.bincount({}, total).to(torch::kInt64);
  std::vector<int64_t> send(static_cast<std::size_t>(ep->size()));
  for (int r = 0; r < ep->size(); ++r)
    send[static_cast<std::size_t>(r)] =
        per_expert.narrow(0, r * local, local).sum().item<int64_t>();
  // Dispatch: every member learns how many rows each other sends each of its experts (one small
  // all-to-all), then the rows travel, sorted by expert within each sender's block.
  torch::Tensor from_each = per_expert.view({ep->size(), local});  // [sender][local expert]
  if (ep->size() > 1) {
    const std::vector<int64_t> ones(static_cast<std::size_t>(ep->size()), 1);
    from_each = all_to_all_rows(*ep, from_each, ones, ones);
  }
  std::vector<int64_t> recv(static_cast<std::size_t>(ep->size()));
  for (int r = 0; r < ep->size(); ++r)
    recv[static_cast<std::size_t>(r)] = from_each[r].sum().item<int64_t>();
  const torch::Tensor rows = exchange_rows(tokens.index_select(0, token_of), *ep, send, recv);
  const torch::Tensor row_expert = torch::arange(local, from_each.options())
                                       .repeat({ep->size()})
                                       .repeat_interleave(from_each.reshape({-1}));
  // This rank's experts on their rows; the TP sum of their row-parallel outputs at once.
  const Comm& tp = *router.tp;
  const torch::Tensor entered = copy_to_group(rows, tp);
  // Zero rows that still hang on `rows`: a rank whose experts receive nothing keeps both
  // all-to-alls in its autograd graph, so its backward sends and receives with the others.
  torch::Tensor out = entered * 0;
  for (int64_t e = 0; e < local; ++e) {
    const torch::Tensor at = (row_expert == e).nonzero().reshape({-1});
    if (at.numel() == 0) continue;
    out = out.index_copy(0, at,
                         experts[static_cast<std::size_t>(e)].partial(entered.index_select(0, at)));
  }
  out = reduce_from_group(out, tp);
  // The rows' router weights travel to the experts in an all-to-all of their own and weight the
  // experts' outputs there, as Megatron-LM's all-to-all dispatcher sends its probabilities (the
  // backward returns their gradients the same way); then the combine takes the rows back.
  const torch::Tensor row_weight =
      exchange_rows(weights.index_select(0, order).unsqueeze(1), *ep, send, recv);
  const torch::Tensor back = exchange_rows(out * row_weight, *ep, recv, send);
  torch::Tensor y = torch::zeros_like(tokens).index_add(0, token_of, back);
  if (has_shared) y = y + shared.forward(tokens);
  return y.view(x.sizes());
}

Block::Block(ParamSet& ps, const std::string& name, const TransformerArch& arch, int64_t layer,
             const Comm& ep, bool pad_heads)
    : norm1(ps, name + ".norm1", arch.hidden, arch.norm),
      norm2(ps, name + ".norm2", arch.hidden, arch.norm),
      attention(ps, name + ".attn", arch, pad_heads),
      routed(moe_layer(arch, layer)) {
  if (routed)
    moe = Moe(ps, name + ".mlp", arch, ep);
  else
    mlp = Mlp(ps, name + ".mlp", arch, arch.ffn);
  if (arch.post_norms) {
    post1 = Norm(ps, name + ".post1", arch.hidden, arch.norm);
    post2 = Norm(ps, name + ".post2", arch.hidden, arch.norm);
  }
  if (arch.layer_scale) {
    // InternViT's initial scale (layer_scale_init_value).
    const std::size_t from = ps.params().size();
    scale1 = ps.constant(name + ".ls1", {arch.hidden}, 0.1);
    scale2 = ps.constant(name + ".ls2", {arch.hidden}, 0.1);
    ps.mark_sequence_partial(from);
  }
}

torch::Tensor Block::forward(const torch::Tensor& x, const AttentionInputs& in) const {
  const bool post = post1.weight.defined();
  const bool scaled = scale1.defined();
  torch::Tensor a = attention.forward(norm1.forward(x), in);
  if (post) a = post1.forward(a);
  const torch::Tensor h = x + (scaled ? a * as(scale1, a) : a);
  const torch::Tensor normed = norm2.forward(h);
  torch::Tensor m = routed ? moe.forward(normed) : mlp.forward(normed, in);
  if (post) m = post2.forward(m);
  return h + (scaled ? m * as(scale2, m) : m);
}

Embedding::Embedding(ParamSet& ps, const std::string& name, int64_t vocab, int64_t hidden)
    : tp(&ps.tp()) {
  TESSERA_CHECK(vocab % ps.tp().size() == 0, name + ": vocabulary " + std::to_string(vocab) +
                                                 " must divide by tp " +
                                                 std::to_string(ps.tp().size()));
  weight = ps.weight(name + ".weight", {vocab, hidden}, kInitScale, 0);
  vocab_begin = ps.tp().rank * (vocab / ps.tp().size());
}

torch::Tensor Embedding::forward(const torch::Tensor& ids) const {
  return reduce_from_group(forward_partial(ids), *tp);
}

torch::Tensor Embedding::forward_partial(const torch::Tensor& ids) const {
  const int64_t rows = weight.size(0);
  const torch::Tensor outside = (ids < vocab_begin) | (ids >= vocab_begin + rows);
  const torch::Tensor local = (ids - vocab_begin).masked_fill(outside, 0);
  return weight.index_select(0, local)
      .masked_fill(outside.unsqueeze(1), 0.0)
      .to(activation_dtype());
}

namespace {

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t vocab_begin, int64_t comm) {
    const Comm& tp = *reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm));
    const int64_t rows = logits.size(1);
    torch::Tensor most = std::get<0>(logits.max(1));
    all_reduce(tp, most, c10d::ReduceOp::MAX);
    const torch::Tensor shifted = logits - most.unsqueeze(1);
    const torch::Tensor exp = shifted.exp();
    torch::Tensor sum = exp.sum(1);
    all_reduce(tp, sum);
    const torch::Tensor ignored = targets < 0;
    const torch::Tensor inside = (targets >= vocab_begin) & (targets < vocab_begin + rows);
    const torch::Tensor local = (targets - vocab_begin).masked_fill(~inside, 0);
    torch::Tensor picked =
        shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(~inside, 0.0);
    all_reduce(tp, picked);
    const torch::Tensor loss = (sum.log() - picked).masked_fill(ignored, 0.0);
    ctx->save_for_backward({exp / sum.unsqueeze(1), local, inside, ignored});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    torch::Tensor g = saved[0].clone();  // softmax
    const torch::Tensor rows = torch::arange(g.size(0), saved[1].options());
    const torch::Tensor inside = saved[2];
    g.index_put_({rows.masked_select(inside), saved[1].masked_select(inside)},
                 g.index({rows.masked_select(inside), saved[1].masked_select(inside)}) - 1.0);
    g.masked_fill_(saved[3].unsqueeze(1), 0.0);
    return {g * grads[0].unsqueeze(1), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The whole vocabulary on this rank: the loss row block by row block, each block's softmax in
// fp32 read straight from the logits' dtype and never kept. Only the logits are saved; the
// backward computes each block's softmax again and writes its gradient in the logits' dtype.
// Per element that is two fused softmax passes and one scaled write, where the vocab-parallel form
// makes about ten fp32 passes and keeps an fp32 softmax.
struct BlockwiseCrossEntropy : torch::autograd::Function<BlockwiseCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, int64_t block_rows) {
    const torch::Tensor ignored = targets < 0;
    const torch::Tensor safe = targets.masked_fill(ignored, 0).unsqueeze(1);
    torch::Tensor loss = torch::empty({logits.size(0)}, logits.options().dtype(torch::kFloat32));
    for (int64_t at = 0; at < logits.size(0); at += block_rows) {
      const int64_t n = std::min(block_rows, logits.size(0) - at);
      const torch::Tensor log_probs =
          torch::log_softmax(logits.narrow(0, at, n), 1, torch::kFloat32);
      loss.narrow(0, at, n).copy_(-log_probs.gather(1, safe.narrow(0, at, n)).squeeze(1));
    }
    ctx->save_for_backward({logits, safe, ignored});
    ctx->saved_data["block_rows"] = block_rows;
    return loss.masked_fill_(ignored, 0.0);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& logits = saved[0];
    const int64_t block_rows = ctx->saved_data["block_rows"].toInt();
    // d loss_i / d logits_ij = softmax_ij − [j = target_i], zero for ignored rows.
    const torch::Tensor scale =
        grads[0].to(torch::kFloat32).masked_fill(saved[2], 0.0).unsqueeze(1);
    torch::Tensor g = torch::empty_like(logits);
    for (int64_t at = 0; at < logits.size(0); at += block_rows) {
      const int64_t n = std::min(block_rows, logits.size(0) - at);
      torch::Tensor probs = torch::softmax(logits.narrow(0, at, n), 1, torch::kFloat32);
      probs.scatter_add_(1, saved[1].narrow(0, at, n), torch::full({n, 1}, -1.0, probs.options()));
      torch::Tensor out = g.narrow(0, at, n);
      torch::mul_out(out, probs, scale.narrow(0, at, n));
    }
    return {g, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor blockwise_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                      int64_t block_rows) {
  if (fused_cross_entropy_applies(logits)) return fused_cross_entropy(logits, targets);
  // About 256 MiB of fp32 probabilities per block.
  if (block_rows <= 0)
    block_rows = std::max<int64_t>(1, (int64_t{64} << 20) / std::max<int64_t>(1, logits.size(1)));
  return BlockwiseCrossEntropy::apply(logits, targets, block_rows);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_begin,
                                           const Comm& tp) {
  // fp32 logits take the vocab-parallel form on one rank too: a run and its TP counterpart then
  // round alike, which the parity tests hold to 1e-6.
  if (tp.size() == 1 && logits.scalar_type() != torch::kFloat32)
    return blockwise_cross_entropy(logits, targets);
  return VocabParallelCrossEntropy::apply(logits.to(torch::kFloat32), targets, vocab_begin,
                                          static_cast<int64_t>(reinterpret_cast<intptr_t>(&tp)));
}

}  // namespace tessera::exec

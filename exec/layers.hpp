// The parallel building blocks of the executor's models (Megatron-style tensor parallelism):
// column/row-parallel linears with the f/g conjugate collectives, vocab-parallel embedding and
// cross-entropy, norms, rotary embeddings, grouped-query attention under an additive mask (with
// context-parallel K/V gathering), dense and gated MLPs, mixture-of-experts layers with expert
// parallelism, and pre-norm transformer blocks.
// Tensors are plain members; every parameter is registered in a ParamSet under its global name.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/comm.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera::exec {

struct Param {
  std::string name;      // global, plan-independent: "llm.layers.3.attn.q.weight"
  torch::Tensor tensor;  // this rank's shard
  // The TP ranks holding this same tensor: 1 for a shard, tp for a replicated one, tp / kv_heads
  // for a key/value head replicated over fewer ranks (its gradient summed over them).
  int64_t tp_copies = 1;
  bool kv_replica = false;
  // A routed expert's: held by one EP rank, its gradient reduced over the expert-data-parallel
  // replicas only.
  bool expert = false;
  // Whole on every TP rank but applied to the rank's share of the tokens under sequence
  // parallelism (norms, layer scales, row-parallel biases): its gradient summed over TP.
  bool sequence_partial = false;
};

// Creates parameters from the seed (weights.hpp) and keeps the list.
class ParamSet {
 public:
  // `replicas`: ranks beyond `tp` that hold the same parameters (a module run whole on every TP
  // rank of its grid); each parameter's tp_copies counts them.
  ParamSet(uint64_t seed, bool trainable, const Comm& tp, int64_t replicas = 1)
      : seed_(seed), trainable_(trainable), tp_(tp), replicas_(replicas) {}
  // Normal-ish weights of standard deviation `scale`, sharded over TP along `shard_dim` (-1: not);
  // with `pad_to`, zeros extend dimension `shard_dim` to that size first (padding heads).
  torch::Tensor weight(const std::string& name, std::vector<int64_t> shape, double scale,
                       int64_t shard_dim = -1, int64_t pad_to = 0);
  torch::Tensor constant(const std::string& name, std::vector<int64_t> shape, double value,
                         int64_t shard_dim = -1);
  // Parameters of rows [first, first + rows) (along dim 0) of the seeded tensor, held by
  // `copies` TP ranks: a key/value head replicated over them.
  torch::Tensor rows_of(const std::string& name, torch::Tensor full, int64_t first, int64_t rows,
                        int64_t copies);
  std::vector<Param>& params() { return params_; }
  // Marks the parameters added since the list had `from` entries as a routed expert's.
  void mark_experts(std::size_t from) {
    for (std::size_t i = from; i < params_.size(); ++i) params_[i].expert = true;
  }
  // Sequence parallelism: the layers built from here hold 1/tp of the tokens between them.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on && tp_.size() > 1; }
  bool sequence_parallel() const { return sequence_parallel_; }
  // Under sequence parallelism, marks the parameters added since `from` sequence_partial.
  void mark_sequence_partial(std::size_t from) {
    if (!sequence_parallel_) return;
    for (std::size_t i = from; i < params_.size(); ++i) params_[i].sequence_partial = true;
  }
  const Comm& tp() const { return tp_; }
  uint64_t seed() const { return seed_; }

 private:
  torch::Tensor add(const std::string& name, torch::Tensor full, int64_t shard_dim);
  uint64_t seed_;
  bool trainable_;
  const Comm& tp_;
  int64_t replicas_;
  bool sequence_parallel_ = false;
  std::vector<Param> params_;
};

enum class Split { kColumn, kRow, kReplicated };

struct Linear {
  Linear() = default;
  // `padded`: the split dimension's size with zero rows (column) or columns (row) beyond `out`
  // or `in`, whose values stay zero (padding heads); 0: none.
  Linear(ParamSet& ps, const std::string& name, int64_t in, int64_t out, bool bias, Split split,
         int64_t padded = 0);
  torch::Tensor forward(const torch::Tensor& x) const;  // (..., in[/tp]) -> (..., out[/tp])
  // Column split, for an input the caller already entered into the TP group (copy_to_group):
  // column layers sharing one input (Q, K, V; gate, up) then all-reduce its gradient once, as
  // the Program's two TP all-reduces per layer and direction say.
  torch::Tensor forward_entered(const torch::Tensor& x) const;
  // Row split under sequence parallelism: (rows, in/tp) of every token -> this rank's `rows`
  // of the output, reduce-scattered (its gradient all-gathered), the bias added to them.
  torch::Tensor forward_scattered(const torch::Tensor& x, const std::vector<int64_t>& rows) const;
  torch::Tensor weight, bias;  // (out/tp, in) or (out, in/tp)
  Split split = Split::kReplicated;
  const Comm* tp = nullptr;
};

struct Norm {
  Norm() = default;
  Norm(ParamSet& ps, const std::string& name, int64_t hidden, NormKind kind);
  // x itself when the norm was never built (a stack without a final norm).
  torch::Tensor forward(const torch::Tensor& x) const;
  torch::Tensor weight, bias;  // (hidden); bias only for LayerNorm
  NormKind kind = NormKind::kRmsNorm;
};

// A stretch of a sample's tokens: text, which attends causally to everything of its sample
// before it, or one media item, whose tokens attend to each other only, both ways.
struct AttentionSpan {
  int64_t offset = 0, length = 0;
  bool media = false;
};

// `count` consecutive blocks of `length` tokens from token `begin` on, each attending within
// itself only (the samples of a packed micro-batch). When the blocks share `spans` (in order,
// covering a block), attention runs without a mask: one causal call for the text and one
// unmasked call per media item, the kernels that skip masked work. Otherwise `bias` (count, 1,
// length, length) holds the mask.
struct AttentionBlocks {
  int64_t begin = 0, length = 0, count = 0;
  std::vector<AttentionSpan> spans;
  torch::Tensor bias;
};

// What attention needs besides its input.
struct AttentionInputs {
  torch::Tensor bias;  // (Lq, Lk) additive: 0 allowed, -inf masked; undefined: no mask
  // When set, queries are the keys and attention runs block by block over these runs, which
  // cover the sequence in order (`bias` unused): the work of the samples, not of their product.
  std::vector<AttentionBlocks> blocks;
  torch::Tensor positions_q;  // (Lq) rotary positions; undefined: no rotary embedding
  // The rotary cosines and sines of `positions_q` by (width, dtype), made on first use.
  mutable std::map<std::pair<int64_t, int>, std::pair<torch::Tensor, torch::Tensor>> rotary_tables;
  const Comm* cp = nullptr;      // gather K/V over this group (context parallel)
  std::vector<int64_t> cp_rows;  // tokens held by each member of `cp`
  // Sequence parallelism: the layers' inputs and outputs are this TP group's member's rows of
  // the tokens (sp_rows[i] for member i), gathered before the column-parallel linears and
  // reduce-scattered after the row-parallel ones. Null: every token on every TP rank.
  const Comm* sp = nullptr;
  std::vector<int64_t> sp_rows;
  bool sequence_parallel() const { return sp != nullptr && sp->size() > 1; }
};

// Column-parallel linears sharing one input under sequence parallelism: x (rows, in) this TP
// rank's rows, each output (every row, out/tp).
std::vector<torch::Tensor> gathered(const std::vector<const Linear*>& linears,
                                    const torch::Tensor& x, const AttentionInputs& in);

struct Attention {
  Attention() = default;
  // `pad`: heads TP does not divide get zero heads up to a multiple of TP (pad_heads()), whose
  // weights, outputs and gradients stay zero.
  Attention(ParamSet& ps, const std::string& name, const TransformerArch& arch, bool pad = false);
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in) const;  // (B, L, H)
  Linear q, k, v, o;
  Norm q_norm, k_norm;                            // per head, when the architecture has them
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // per TP rank
  bool rotary = false;
  // Multi-head latent attention (kv_lora_rank > 0): the down-projections and latent norms whole
  // on every TP rank, the up-projections (`q` from the query latent, `kv_up`) split by heads.
  Linear q_down, kv_down, kv_up;
  Norm q_latent_norm, kv_latent_norm;
  int64_t kv_rank = 0, rope_dim = 0, value_dim = 0;
  // Selective recomputation: the attention core (scores, softmax, weighted values) keeps only
  // its inputs and runs again in the backward.
  bool recompute_core = false;
};

struct Mlp {
  Mlp() = default;
  // Inner width `width` (the dense MLP's ffn, one expert's moe_ffn, a shared expert's).
  Mlp(ParamSet& ps, const std::string& name, const TransformerArch& arch, int64_t width);
  torch::Tensor forward(const torch::Tensor& x) const;
  // Under sequence parallelism (in.sequence_parallel()): x (1, rows, H) this rank's rows.
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in) const;
  // The row-parallel output before its sum over TP, for an input already entered into the TP
  // group (the caller sums several experts' outputs at once). No output bias.
  torch::Tensor partial(const torch::Tensor& entered) const;
  Linear up, gate, down;  // gate only when gated
  bool gated = false;
};

// A mixture-of-experts MLP. The router (replicated) scores every expert for each token; the
// token goes to its top_k experts, weighted by their softmax probabilities renormalised over the
// k (Mixtral's rule); every expert keeps all its tokens (dropless). With router groups a token
// picks among the experts of its router_group_top_k best groups only, a group scored by the sum
// of its top_k / router_group_top_k best probabilities (Megatron-LM's group-limited routing).
// Member r of the EP group holds experts [r·E/ep, (r+1)·E/ep): tokens travel there and back by
// all-to-all. A shared expert, if any, sees every token.
struct Moe {
  Moe() = default;
  Moe(ParamSet& ps, const std::string& name, const TransformerArch& arch, const Comm& ep);
  torch::Tensor forward(const torch::Tensor& x) const;  // (..., H) -> (..., H)
  Linear router;                                        // (experts, hidden)
  std::vector<Mlp> experts;                             // this rank's, from first_expert on
  Mlp shared;
  bool has_shared = false;
  int64_t top_k = 0, total = 0, first_expert = 0;
  int64_t groups = 0, group_top_k = 0;
  const Comm* ep = nullptr;
};

struct Block {
  Block() = default;
  // Layer `layer` of a stack of `arch`: an MoE layer where the pattern says (moe_layer()), its
  // experts over `ep` (a group of one holds every expert); a dense one otherwise. `pad_heads`:
  // see Attention.
  Block(ParamSet& ps, const std::string& name, const TransformerArch& arch, int64_t layer,
        const Comm& ep, bool pad_heads = false);
  torch::Tensor forward(const torch::Tensor& x, const AttentionInputs& in) const;
  Norm norm1, norm2;
  Norm post1, post2;             // after attention and MLP, when the architecture has them
  torch::Tensor scale1, scale2;  // per-channel scales of the two outputs (layer_scale)
  Attention attention;
  Mlp mlp;  // a dense layer's
  Moe moe;  // an MoE layer's
  bool routed = false;
};

// Vocab-parallel embedding: rows [rank·V/tp, (rank+1)·V/tp) on each TP rank.
struct Embedding {
  Embedding() = default;
  Embedding(ParamSet& ps, const std::string& name, int64_t vocab, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& ids) const;  // (T) int64 -> (T, hidden)
  // This TP rank's partial rows (its vocabulary's), before the sum over TP.
  torch::Tensor forward_partial(const torch::Tensor& ids) const;
  torch::Tensor weight;
  int64_t vocab_begin = 0;
  const Comm* tp = nullptr;
};

// Per-token cross-entropy (fp32) of vocab-parallel logits (T, V/tp), in the activations' dtype,
// against `targets` (T), targets < 0 ignored (loss 0). The result (T) is the same on every TP
// rank. The softmax computes in fp32 whatever the logits' dtype. On one rank, bf16 logits go to
// blockwise_cross_entropy.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_begin,
                                           const Comm& tp);
// The same loss of logits holding the whole vocabulary, `block_rows` tokens at a time (0: as
// many as about 256 MiB of fp32 probabilities hold), keeping no probabilities for the backward:
// two fused softmax passes and one scaled write per logit instead of about ten fp32 passes. bf16
// logits on a GPU take fused_cross_entropy (one read each way) where the build has its kernels.
torch::Tensor blockwise_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                      int64_t block_rows = 0);

}  // namespace tessera::exec

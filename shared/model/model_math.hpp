// Derived quantities of a model, as pure functions of (architecture, tokens, precision):
// parameter counts, forward FLOPs per token, activation bytes per token per layer, and the
// tokens an image, video or audio clip becomes. Formulas: docs/ALGORITHMS.md §6.
#pragma once

#include <cstdint>

#include "shared/program/program.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera {

// --- Layer pattern (moe_layer() and moe_layers() in model_spec.hpp) ---------------------------
// The architecture of a stack's dense layers: `arch` without its experts.
TransformerArch dense_layer_arch(const TransformerArch& arch);
// `per_layer(kind)` summed over layers [first, end), each layer priced by the architecture of
// its kind (MoE or dense). Every per-layer count over a range goes through here.
template <class F>
double sum_over_layers(const TransformerArch& arch, int64_t first, int64_t end, F per_layer) {
  const int64_t moe = moe_layers(arch, first, end);
  const int64_t dense = end - first - moe;
  double sum = 0;
  if (moe > 0) sum += static_cast<double>(moe) * per_layer(arch);
  if (dense > 0) sum += static_cast<double>(dense) * per_layer(dense_layer_arch(arch));
  return sum;
}

// --- Parameters -------------------------------------------------------------------------
// The overloads taking `tp` count what one of `tp` tensor-parallel ranks holds, as Megatron
// splits a module and the executor does: attention and MLP matrices, their column-parallel
// biases, the vocabulary embedding and the output head divided over tp; norms, row-parallel
// output biases, MoE routers, position embeddings, class tokens, patch and audio front ends and
// single-layer projectors whole on every rank; key/value heads fewer than tp replicated, one per
// rank. At tp 1 they are the module's counts, which the overloads without tp return exactly.
//
// Routed experts go to `ep` expert-parallel ranks, experts / ep each (and each expert's matrices
// over `etp`, the expert tensor parallelism: tp where 0); a shared expert and the router stay on
// every rank of the group.
//
// Weights of one transformer layer (attention, MLP or experts, norms, biases) of `arch`'s kind:
// an MoE layer where `arch` has experts (dense_layer_arch() gives the others).
int64_t layer_parameters(const TransformerArch& arch);
double layer_parameters(const TransformerArch& arch, int64_t tp, int64_t ep = 1, int64_t etp = 0);
// Of those, the key/value head a rank holds when the layer has fewer of them than tp (0
// otherwise): replicated on tp / kv_heads ranks, whose gradients sum over them.
double kv_replica_parameters(const TransformerArch& arch, int64_t tp);
// The weights of one norm over `width` values (a LayerNorm's bias too).
int64_t norm_parameters(NormKind norm, int64_t width);
// Of those, the ones every TP rank holds whole that sequence parallelism applies to a rank's
// share of the tokens, so that each rank's gradient is partial (Megatron-LM sums them over TP
// before the optimizer): the norms, the layer scales, the row-parallel linears' biases, an MoE
// layer's router.
double sequence_partial_parameters(const TransformerArch& arch);
// Of those, the routed experts' (0 without experts): gradients reduced over expert-data-parallel
// replicas rather than all data-parallel ones.
double expert_layer_parameters(const TransformerArch& arch, int64_t tp, int64_t ep);
// Layers [first, end) of the stack: their layer_parameters() and, where the model has them, the
// gates of gated layers and the extra norms and gates of cross-attention layers; the
// multi-token-prediction layers among them (from `layers` on) with their mtp_extra_parameters().
double stack_parameters(const TransformerArch& arch, int64_t first, int64_t end, int64_t tp,
                        int64_t ep = 1, int64_t etp = 0);
// A value head's width: v_head_dim, which defaults to head_dim.
int64_t value_head_dim(const TransformerArch& arch);
// The attention's matrices of one layer (standard or multi-head latent attention).
int64_t attention_matmul_parameters(const TransformerArch& arch);
// Key and value values one token holds for attention, over all heads (2·kv_heads·head_dim, or
// multi-head latent attention's heads·(head_dim + v_head_dim) once expanded).
int64_t key_value_width(const TransformerArch& arch);
// Weights of one layer that a token actually multiplies with (top_k experts and a shared
// expert, no biases/norms).
int64_t active_layer_matmul_parameters(const TransformerArch& arch);
// Per-op selective checkpointing (torchtitan's "op" policy) keeps the output of the odd-numbered
// matrix multiplications of a layer, in forward order (Q, K, V, output projection, then the MLP's
// calls: gated, gate, up and down; else up and down), and recomputes the even ones before the
// backward: K, the output projection and the MLP's second call (gated: the up projection; else
// the down projection). Multi-head latent attention counts half its matrices; an MoE layer one
// matrix of each active expert.
int64_t per_op_recomputed_matmul_parameters(const TransformerArch& arch);
// Megatron-LM's selective recomputation by submodule (`recompute_modules`), as bits of a set.
// The output-discarding ones (layernorm, mla_up_proj, moe_act) drop what a submodule writes and
// run it again from its kept input before the backward; the checkpointing ones (core_attn, mlp,
// moe, shared_experts) keep a submodule's input alone and run all of it again.
enum RecomputeModule : uint32_t {
  kRecomputeCoreAttn = 1,        // the attention core (softmax(QK^T)V)
  kRecomputeLayernorm = 2,       // the norms before attention and before the MLP
  kRecomputeMlaUpProj = 4,       // multi-head latent attention's up-projections and rotary
  kRecomputeMoeAct = 8,          // the routed experts' activation function
  kRecomputeMlp = 16,            // a dense layer's MLP
  kRecomputeMoe = 32,            // an MoE layer: router, dispatch, experts, combine
  kRecomputeSharedExperts = 64,  // an MoE layer's shared expert
};
// The matrices one layer of `arch`'s kind (MoE or dense) runs again before its backward under
// `modules` (RecomputeModule bits): the latent up-projections (mla_up_proj), a dense layer's MLP
// (mlp), an MoE layer's router, top-k experts and shared expert (moe), its shared expert alone
// (shared_experts). Per token, as active_layer_matmul_parameters() counts them.
int64_t selective_recomputed_matmul_parameters(const TransformerArch& arch, uint32_t modules);
// What a multi-token-prediction layer (TransformerArch::mtp_layers) has beyond its transformer
// layer: the projection of its normed hidden state and embedding, concatenated, back to the hidden
// width (2·hidden x hidden, no bias: mtp_projection_parameters) and three norms (one on each input,
// one before the head), on one of `tp` ranks (the projection split over them, column-parallel).
// Its embedding and output head are the model's own.
int64_t mtp_projection_parameters(const TransformerArch& arch);
double mtp_extra_parameters(const TransformerArch& arch, int64_t tp);
// Everything outside the layer stack: the input side and the output side.
int64_t embedding_parameters(const ModuleSpec& module);
// Before the first layer: vocabulary embedding, position embeddings, patch or audio front end,
// class token, the norm over the patch embeddings.
double input_side_parameters(const ModuleSpec& module, int64_t tp);
// After the last layer: the final norm and an untied output head.
double output_side_parameters(const ModuleSpec& module, int64_t tp);
int64_t projector_parameters(const ProjectorArch& projector);
double projector_parameters(const ProjectorArch& projector, int64_t tp);
// A projector's matrices: in·out (one layer), else in·hidden + (layers−2)·hidden² + hidden·out,
// with `merger` for `in` and in·merger more where it merges first (`out` for `in` after a
// resampler); times 1 + deepstack. A resampler's own are resampler_parameters().
int64_t projector_matmul_parameters(const ProjectorArch& projector);
// Of those, the merger's (in·merger, times 1 + deepstack): whole on every TP rank.
int64_t projector_merger_parameters(const ProjectorArch& projector);
// A resampler's weights (0 without queries), whole on every TP rank, at D = out: the queries
// (queries·D), the key/value input projection (in·D, where in ≠ D), the attention's input
// (3D² + 3D) and output (D² + D) projections, three LayerNorms; a stored position table adds
// queries·D.
int64_t resampler_parameters(const ProjectorArch& projector);
// Whether TP splits a projector: two layers, column- then row-parallel (their output summed over
// TP), without a resampler. One layer, or three and more, run whole on every TP rank.
inline bool projector_splits(const ProjectorArch& projector) {
  return projector.layers == 2 && projector.queries == 0;
}
int64_t module_parameters(const ModuleSpec& module);
int64_t model_parameters(const ModelSpec& model);
// Parameters that receive gradients (modules not frozen).
int64_t trainable_parameters(const ModelSpec& model);

// --- Tensor parallelism -----------------------------------------------------------------
// Whether a transformer splits over `tp` ranks: its query heads divide evenly, and its
// key/value heads either divide too or, fewer than tp, are replicated (tp a multiple of them:
// Megatron's rule for grouped-query attention).
// tp_refusal() says why not, naming the module `who` ("" when it splits).
std::string tp_refusal(const TransformerArch& arch, const std::string& who, int64_t tp);
inline bool accepts_tp(const TransformerArch& arch, int64_t tp) {
  return tp_refusal(arch, "", tp).empty();
}
// `arch` with zero heads up to a multiple of `tp` (its key/value heads too where they equal its
// heads), head_dim kept: the stack Megatron-LM runs at that TP.
TransformerArch pad_heads(const TransformerArch& arch, int64_t tp);

// --- FLOPs ------------------------------------------------------------------------------
// Forward FLOPs for one token of `module` (multiply-add = 2 FLOPs) when each query attends to
// `attended_tokens` keys on average, its multi-token-prediction layers (each with its projection
// and its output head) included. Conventions: Megatron/Korthikanti count the full s
// (attended = sequence length); a causal kernel that skips masked tiles does about s/2.
// Projectors count per output token; encoders include the patch/conv front end per token.
double forward_flops_per_token(const ModuleSpec& module, double attended_tokens);
// The same for one layer of a transformer, without the front end or output head.
double layer_forward_flops_per_token(const TransformerArch& arch, double attended_tokens);
// The attention-score part of a layer's forward: Q·K^T and P·V, 2·q FLOPs per query-key pair
// each, over the pairs the kernel computes (causal: those the mask keeps).
double layer_attention_flops(const TransformerArch& arch, double attention_pairs);
// One forward of a projector on one of `tp` ranks, taking `tokens_in` tokens from its encoder
// and handing `tokens_out` on (as many, unless it resamples: queries per piece). The merger
// works on the tokens in, the MLP on the tokens out; a resampler projects the tokens in to keys
// and values, its queries through the attention's input and output projections, and attends
// queries × tokens_in pairs at width out (`attention`). The one count the lowering and the stage
// split use.
struct ProjectorFlops {
  double linear = 0;
  double attention = 0;
};
ProjectorFlops projector_forward_flops(const ProjectorArch& projector, double tokens_in,
                                       double tokens_out, int64_t tp);
// Values a projector keeps for its backward on one of `tp` ranks: the inputs of its matrices
// (and a resampler's keys, values, queries and attention probabilities).
double projector_stash_values(const ProjectorArch& projector, double tokens_in, double tokens_out,
                              int64_t tp);
// The FLOPs of a training phase from its forward's matrix (`linear`) and attention FLOPs — the
// one count the lowering, the stage split and Entrain's work share use: the forward and its
// recomputation do both once; the input-gradient backward does the matrices once and the
// attention twice (dS, then dQ and dK/dV); the weight-gradient pass the matrices once.
double phase_flops(double linear, double attention, Phase phase);

// --- Activations ------------------------------------------------------------------------
struct ActivationOptions {
  int64_t tp = 1;                  // tensor-parallel degree
  bool sequence_parallel = false;  // norms/dropout activations split over tp too
  bool flash_attention = true;     // no s x s score matrix is stored
  bool dropout = false;            // dropout masks stored (Korthikanti's model includes them)
  int64_t bytes_per_value = 2;     // 16-bit activations
  // FP8 GEMMs (Transformer Engine): the inputs of the QKV, output-projection and MLP linears are
  // kept for the weight gradient in FP8, one byte each.
  bool fp8_linear_inputs = false;
  // Per-op selective checkpointing: a layer keeps its input, the attention kernel's output and
  // log-sum-exp, the outputs of the matrix multiplications it does not recompute
  // (per_op_recomputed_matmul_parameters) and of the sequence-parallel reduce-scatters.
  bool per_op_checkpoint = false;
  // Selective recomputation's submodules (RecomputeModule bits; recompute selective): what they
  // write is not kept (layernorm: the two norms' outputs; mla_up_proj: queries, keys and values;
  // moe_act: the routed experts' activation output; mlp, moe, shared_experts: everything inside
  // but their input). core_attn keeps no score matrix, as a fused kernel does.
  uint32_t recompute_modules = 0;
};
// Bytes kept for backward per token per layer, for a sequence of `seq_len` tokens.
// With dropout, no flash attention and ffn = 4h this is Korthikanti et al.'s
// s·b·h·(10 + 24/t + 5·a·s/(h·t)) divided by s·b (TP) and (34 + 5as/h)/t·h (TP + SP).
double activation_bytes_per_token_per_layer(const TransformerArch& arch, double seq_len,
                                            const ActivationOptions& options);

// --- Tokens per media item ----------------------------------------------------------------
struct MediaTokens {
  int64_t encoder_tokens = 0;  // sequence the encoder processes (all tiles/windows, CLS included)
  int64_t llm_tokens = 0;      // tokens handed to the LLM (after merge/pooling, CLS dropped)
  int64_t pieces = 1;          // tiles (images), windows (audio): separate encoder sequences
};
// What the encoder alone makes of an item; the LLM's share is llm_tokens() of it.
// REQUIRES: `encoder` has patching (image/video) or an audio front end (audio).
MediaTokens image_tokens(const ModuleSpec& encoder, int64_t width, int64_t height);
MediaTokens video_tokens(const ModuleSpec& encoder, int64_t frames, int64_t width, int64_t height);
MediaTokens audio_tokens(const ModuleSpec& encoder, double seconds);
// The tokens an item of `encoder` (`t`, from the functions above) becomes in the LLM's sequence:
// t.llm_tokens, or `queries` per piece where the projector the encoder feeds resamples.
int64_t llm_tokens(const ModelSpec& model, const ModuleSpec& encoder, const MediaTokens& t);

}  // namespace tessera

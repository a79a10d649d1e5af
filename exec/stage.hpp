// One module's slice on this rank — the layers [begin, end) of a virtual pipeline stage, with
// the module's front end on its first slice (patch embedding, token embedding) and its back end
// on its last (final norm; then CLS removal, or the LM head and loss). Shapes come from the
// ModuleSpec, so a tiny scenario and a full-size model run the same code.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/layers.hpp"

namespace tessera::exec {

// A forward cut before some of the stage's layers, so that its backward can run piece by piece
// (one gradient bucket at a time): at each cut, the output of the layers below it and the leaf
// the layers above start from — one of each per pass through the layers (an audio encoder
// passes once per window).
struct Cuts {
  std::vector<int64_t> layers;  // cut before each of these (neither the stage's first nor past it)
  std::map<int64_t, std::vector<torch::Tensor>> below, above;
  std::function<void(int64_t layer)> entering;  // if set, called before each layer runs
  // Full recomputation (`checkpoint`): the forward runs the layers without keeping their
  // activations, recording per pass its input (with the front end's graph) and attention inputs,
  // and the leaf its output became (the back end's graph starts there); Stage::rerun runs the
  // layers again from those inputs, with their graph, into `stack_outputs`.
  bool checkpoint = false;
  std::vector<torch::Tensor> stack_inputs, stack_leaves, stack_outputs;
  std::vector<AttentionInputs> stack_attention;
};

class Stage {
 public:
  // REQUIRES: executor_support(model) is empty; tp divides the module's heads (or `pad_heads`:
  // the plan pads them, indivisible_heads pad), kv heads, FFN width and vocabulary; `ep` (none:
  // every expert here) divides its experts. `tp_replicas`: ranks beyond `tp` holding the same
  // parameters (a module run whole on every TP rank of its grid).
  // `sequence_parallel`: the LLM's layers under sequence parallelism (its norms' and
  // row-parallel biases' parameters then sequence_partial).
  Stage(const ModuleSpec& module, int64_t layer_begin, int64_t layer_end, uint64_t seed,
        const Comm& tp, const Comm* ep = nullptr, bool pad_heads = false, int64_t tp_replicas = 1,
        bool sequence_parallel = false);

  const ModuleSpec& module() const { return module_; }
  bool first() const { return begin_ == 0; }
  bool last() const { return end_ == layers_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  bool trainable() const { return !module_.frozen; }
  std::vector<Param>& params() { return params_.params(); }
  // The parameters layers [a, b) of this stage use: with the front end when a is the stage's
  // first layer, with the back end (and a head tied to the embedding) when b is its end.
  std::vector<Param*> params_of(int64_t a, int64_t b);

  // Encoder. first: pixels (N, C, S, S) -> (N, L, H); otherwise (N, L, H) -> (N, L, H);
  // last: -> (N·P, H), the LLM-bound tokens (CLS dropped).
  torch::Tensor encode(const torch::Tensor& x, Cuts* cuts = nullptr) const;
  // Audio encoder (Whisper-style), whole: log-mel windows (mel_bins, frames) -> conv front end
  // (stride 1, then `downsampling`) -> learned positions -> blocks -> k:1 average pooling;
  // the windows' tokens concatenated, (rows, H).
  // On a later stage `input` holds the previous stage's windows, their tokens back to back (it
  // passes them on so); the first stage ignores it.
  torch::Tensor encode_audio(const std::vector<torch::Tensor>& windows, const torch::Tensor& input,
                             Cuts* cuts = nullptr) const;
  // Each window's tokens after the conv front end.
  std::vector<int64_t> audio_tokens(const std::vector<torch::Tensor>& windows) const;
  // Projector: (R, in) -> (R, out).
  torch::Tensor project(const torch::Tensor& x) const;
  // LLM, first slice: the sequence (T, H) with text ids embedded at `text_slots` and media rows
  // `media.index_select(media_rows)` at `media_slots`, then restricted to `local` tokens, and
  // under sequence parallelism (in.sequence_parallel()) to this TP rank's rows of them: a
  // text-only model reduce-scatters its embedding's partial rows, one with media rows
  // all-reduces the text's, merges and keeps its rows.
  torch::Tensor embed(const torch::Tensor& ids, const torch::Tensor& text_slots,
                      const torch::Tensor& media, const torch::Tensor& media_slots,
                      const torch::Tensor& media_rows, const torch::Tensor& local,
                      const AttentionInputs& in) const;
  // LLM blocks on (T_local, H).
  torch::Tensor blocks(const torch::Tensor& h, const AttentionInputs& in,
                       Cuts* cuts = nullptr) const;
  // LLM, last slice: summed cross-entropy of (T_local, H) against targets (T_local), -1 ignored;
  // under sequence parallelism h is this TP rank's rows, gathered for the head.
  torch::Tensor loss_sum(const torch::Tensor& h, const torch::Tensor& targets,
                         const AttentionInputs& in) const;
  // Full recomputation: the layers again from each pass `cuts` recorded (cut where cuts.layers
  // say), their outputs into cuts.stack_outputs.
  void rerun(Cuts& cuts) const;
  // Selective recomputation: every layer's attention core runs again in the backward.
  void recompute_attention_cores() {
    for (Block& b : blocks_) b.attention.recompute_core = true;
  }

 private:
  // The layers from x on, cut where `cuts` asks; without their activations when it checkpoints.
  torch::Tensor run_blocks(torch::Tensor x, const AttentionInputs& in, Cuts* cuts) const;
  torch::Tensor run_layers(torch::Tensor x, const AttentionInputs& in, Cuts* cuts) const;

  const ModuleSpec& module_;
  int64_t begin_, end_, layers_;
  ParamSet params_;
  std::vector<Block> blocks_;
  // params() holds the front end's parameters, then each block's, then the back end's.
  std::size_t front_params_ = 0;
  std::vector<std::size_t> block_params_end_;  // per block: one past its last parameter
  // Encoder front end.
  Linear patch_;
  torch::Tensor conv1_weight_, conv1_bias_, conv2_weight_, conv2_bias_;  // (H, mel|H, 3), (H)
  torch::Tensor cls_, positions_;
  Norm pre_norm_;  // over the patch embeddings (Patching::pre_norm)
  // Projector.
  Norm input_norm_;
  Linear fc1_, fc2_;
  std::vector<Linear> middle_;  // a projector of more than two layers: hidden -> hidden
  // LLM front and back end.
  Embedding embedding_;
  Norm final_norm_;
  Linear head_;
};

// A rank's slices of every module, by (module, chunk).
using Stages = std::map<std::pair<int, int>, std::unique_ptr<Stage>>;

// The slice of `module`'s chunk `chunk`; refused, naming the rank, when this rank holds none.
Stage& find_stage(const Stages& stages, int module, int chunk, int64_t rank);

}  // namespace tessera::exec

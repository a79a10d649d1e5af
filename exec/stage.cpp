#include "exec/stage.hpp"

#include <algorithm>
#include <cmath>

#include "exec/device.hpp"
#include "exec/working_copies.hpp"
#include "shared/base/check.hpp"

namespace tessera::exec {

Stage::Stage(const ModuleSpec& module, int64_t layer_begin, int64_t layer_end, uint64_t seed,
             const Comm& tp, const Comm* ep, bool pad_heads, int64_t tp_replicas,
             bool sequence_parallel)
    : module_(module),
      begin_(layer_begin),
      end_(layer_end),
      layers_(module.transformer ? module.transformer->layers : 0),
      params_(seed, !module.frozen, tp, tp_replicas) {
  const std::string& name = module.name;
  TESSERA_CHECK(!sequence_parallel || module.role == ModuleRole::kLlm,
                name + ": sequence parallelism runs the LLM's layers only");
  params_.set_sequence_parallel(sequence_parallel);
  if (module.role == ModuleRole::kProjector) {
    const ProjectorArch& p = *module.projector;
    if (p.input_norm) input_norm_ = Norm(params_, name + ".input_norm", p.in, p.norm);
    const int64_t hidden = p.hidden > 0 ? p.hidden : p.out;
    if (p.layers == 2) {
      fc1_ = Linear(params_, name + ".fc1", p.in, hidden, p.bias, Split::kColumn);
      fc2_ = Linear(params_, name + ".fc2", hidden, p.out, p.bias, Split::kRow);
    } else if (p.layers > 2) {
      // Whole on every TP rank (projector_splits): in -> hidden -> ... -> hidden -> out.
      fc1_ = Linear(params_, name + ".fc1", p.in, hidden, p.bias, Split::kReplicated);
      for (int64_t i = 2; i < p.layers; ++i)
        middle_.emplace_back(params_, name + ".fc" + std::to_string(i), hidden, hidden, p.bias,
                             Split::kReplicated);
      fc2_ = Linear(params_, name + ".fc" + std::to_string(p.layers), hidden, p.out, p.bias,
                    Split::kReplicated);
    } else {
      fc1_ = Linear(params_, name + ".fc1", p.in, p.out, p.bias, Split::kReplicated);
    }
    return;
  }
  const TransformerArch& arch = *module.transformer;
  if (module.role == ModuleRole::kEncoder && module.modality == Modality::kAudio && first()) {
    const AudioFrontEnd& a = *module.audio;
    conv1_weight_ = params_.weight(name + ".conv1.weight", {arch.hidden, a.mel_bins, 3}, 0.02);
    conv1_bias_ = params_.constant(name + ".conv1.bias", {arch.hidden}, 0.0);
    conv2_weight_ = params_.weight(name + ".conv2.weight", {arch.hidden, arch.hidden, 3}, 0.02);
    conv2_bias_ = params_.constant(name + ".conv2.bias", {arch.hidden}, 0.0);
    const auto frames =
        static_cast<int64_t>(std::ceil(a.max_seconds * static_cast<double>(a.frames_per_second)));
    const int64_t longest = (frames + a.downsampling - 1) / a.downsampling;
    TESSERA_CHECK(arch.positions >= longest, name + ": " + std::to_string(arch.positions) +
                                                 " position embeddings for windows of " +
                                                 std::to_string(longest) + " tokens");
    positions_ = params_.weight(name + ".positions", {arch.positions, arch.hidden}, 0.02);
  } else if (module.role == ModuleRole::kEncoder && first()) {
    const Patching& p = *module.patching;
    const int64_t patches = (p.image_size / p.patch_size) * (p.image_size / p.patch_size);
    const int64_t length = patches + (p.class_token ? 1 : 0);
    // A patch spans temporal_patch frames (Qwen2-VL's 3-D patches): C·T·p·p inputs.
    patch_ = Linear(params_, name + ".patch",
                    p.in_channels * p.temporal_patch * p.patch_size * p.patch_size, arch.hidden,
                    arch.linear_bias && p.conv_bias, Split::kReplicated);
    if (p.class_token) cls_ = params_.weight(name + ".cls", {arch.hidden}, 0.02);
    if (arch.positions > 0) {
      TESSERA_CHECK(arch.positions >= length, name + ": " + std::to_string(arch.positions) +
                                                  " position embeddings for a sequence of " +
                                                  std::to_string(length));
      positions_ = params_.weight(name + ".positions", {arch.positions, arch.hidden}, 0.02);
    }
    if (p.pre_norm) pre_norm_ = Norm(params_, name + ".pre_norm", arch.hidden, arch.norm);
  }
  if (module.role == ModuleRole::kLlm && first())
    embedding_ = Embedding(params_, name + ".embedding", arch.vocab, arch.hidden);
  front_params_ = params_.params().size();
  static const Comm every_expert{{0}, 0, {}};  // a group of one
  for (int64_t l = begin_; l < end_; ++l) {
    blocks_.emplace_back(params_, name + ".layers." + std::to_string(l), arch, l,
                         ep != nullptr ? *ep : every_expert, pad_heads);
    block_params_end_.push_back(params_.params().size());
  }
  // Every transformer ends in its final norm: the LLM's before its head, an encoder's over its
  // output (SigLIP's post-layernorm, Whisper's and Qwen2-Audio's last norm, Qwen2-VL's merger
  // norm; CLIP's, which LLaVA's features skip, is applied too), unless it has none (InternViT).
  if (last() && arch.final_norm)
    final_norm_ = Norm(params_, name + ".final_norm", arch.hidden, arch.norm);
  if (module.role == ModuleRole::kLlm && last()) {
    TESSERA_CHECK(!arch.tied_embeddings || first(),
                  name + ": tied embeddings across pipeline stages are not in the executor yet");
    if (arch.tied_embeddings) {
      head_.weight = embedding_.weight;
      head_.split = Split::kColumn;
      head_.tp = &params_.tp();
    } else {
      head_ = Linear(params_, name + ".head", arch.hidden, arch.vocab, false, Split::kColumn);
    }
  }
}

std::vector<Param*> Stage::params_of(int64_t a, int64_t b) {
  std::vector<Param>& all = params_.params();
  std::vector<Param*> out;
  const bool bottom = a <= begin_, top = b >= end_;
  // Projectors have no blocks: everything is their front end.
  const std::size_t blocks_begin = front_params_;
  const std::size_t blocks_end =
      block_params_end_.empty() ? front_params_ : block_params_end_.back();
  const bool tied_head = last() && module_.transformer && module_.transformer->tied_embeddings;
  for (std::size_t i = 0; i < all.size(); ++i) {
    bool in = false;
    if (i < blocks_begin) {
      in = bottom || (top && tied_head);
    } else if (i < blocks_end) {
      const auto block = static_cast<int64_t>(
          std::upper_bound(block_params_end_.begin(), block_params_end_.end(), i) -
          block_params_end_.begin());
      in = begin_ + block >= a && begin_ + block < b;
    } else {
      in = top;
    }
    if (in) out.push_back(&all[i]);
  }
  return out;
}

torch::Tensor Stage::run_blocks(torch::Tensor x, const AttentionInputs& in, Cuts* cuts) const {
  if (cuts == nullptr || !cuts->checkpoint) return run_layers(x, in, cuts);
  cuts->stack_inputs.push_back(x);
  cuts->stack_attention.push_back(in);
  torch::Tensor h;
  {
    torch::NoGradGuard no_activations;
    h = run_layers(x, in, cuts);
  }
  torch::Tensor leaf = h.detach();
  leaf.set_requires_grad(x.requires_grad() || trainable());
  cuts->stack_leaves.push_back(leaf);
  return leaf;
}

void Stage::rerun(Cuts& cuts) const {
  cuts.stack_outputs.clear();
  for (std::size_t i = 0; i < cuts.stack_inputs.size(); ++i)
    cuts.stack_outputs.push_back(run_layers(cuts.stack_inputs[i], cuts.stack_attention[i], &cuts));
}

torch::Tensor Stage::run_layers(torch::Tensor x, const AttentionInputs& in, Cuts* cuts) const {
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t layer = begin_ + static_cast<int64_t>(i);
    if (cuts != nullptr && cuts->entering) cuts->entering(layer);
    if (cuts != nullptr &&
        std::find(cuts->layers.begin(), cuts->layers.end(), layer) != cuts->layers.end()) {
      cuts->below[layer].push_back(x);
      x = x.detach().requires_grad_(true);
      cuts->above[layer].push_back(x);
    }
    x = blocks_[i].forward(x, in);
  }
  return x;
}

torch::Tensor Stage::encode(const torch::Tensor& input, Cuts* cuts) const {
  torch::Tensor x = input;
  if (first()) {
    x = upload(x).to(activation_dtype());  // pixels, as the data loader made them
    const Patching& p = *module_.patching;
    const int64_t n = x.size(0), c = x.size(1), side = p.image_size / p.patch_size;
    x = x.view({n, c, side, p.patch_size, side, p.patch_size})
            .permute({0, 2, 4, 1, 3, 5})
            .reshape({n, side * side, c * p.patch_size * p.patch_size});
    x = patch_.forward(x);
    if (cls_.defined())
      x = torch::cat(
          {working_copy(cls_, x.scalar_type()).view({1, 1, -1}).expand({n, 1, cls_.size(0)}), x},
          1);
    if (positions_.defined())
      x = x + working_copy(positions_, x.scalar_type()).narrow(0, 0, x.size(1)).unsqueeze(0);
    if (pre_norm_.weight.defined()) x = pre_norm_.forward(x);
  }
  x = run_blocks(x, AttentionInputs{}, cuts);
  if (!last()) return x;
  x = final_norm_.forward(x);
  const Patching& p = *module_.patching;
  if (p.class_token) x = x.narrow(1, 1, x.size(1) - 1);
  if (const int64_t s = p.spatial_merge; s > 1) {
    // Each s x s block of neighbouring patches becomes one token of s²·hidden values (Qwen2-VL's
    // merger, InternVL's pixel shuffle), blocks in row-major order.
    const int64_t n = x.size(0), side = p.image_size / p.patch_size, h = x.size(2);
    x = x.reshape({n, side / s, s, side / s, s, h})
            .permute({0, 1, 3, 2, 4, 5})
            .reshape({n, (side / s) * (side / s), s * s * h});
  }
  return x.reshape({-1, x.size(2)});
}

std::vector<int64_t> Stage::audio_tokens(const std::vector<torch::Tensor>& windows) const {
  // conv1: kernel 3, stride 1, padding 1 (frames kept); conv2: kernel 3, stride `downsampling`,
  // padding 1.
  const int64_t stride = module_.audio->downsampling;
  std::vector<int64_t> tokens;
  for (const torch::Tensor& mel : windows) tokens.push_back((mel.size(1) - 1) / stride + 1);
  return tokens;
}

torch::Tensor Stage::encode_audio(const std::vector<torch::Tensor>& windows,
                                  const torch::Tensor& input, Cuts* cuts) const {
  const AudioFrontEnd& a = *module_.audio;
  std::vector<torch::Tensor> xs;  // per window (1, T, H)
  if (first()) {
    const auto dtype = activation_dtype();
    for (const torch::Tensor& window : windows) {
      const torch::Tensor mel = upload(window).to(dtype);
      torch::Tensor x =
          torch::gelu(torch::conv1d(mel.unsqueeze(0), working_copy(conv1_weight_, dtype),
                                    working_copy(conv1_bias_, dtype), 1, 1));
      // GELU after the transpose: LibTorch 1.13's CPU GELU backward misreads a transposed
      // gradient of a contiguous input (garbage conv gradients), not a contiguous gradient of a
      // transposed input.
      x = torch::gelu(torch::conv1d(x, working_copy(conv2_weight_, dtype),
                                    working_copy(conv2_bias_, dtype), a.downsampling, 1)
                          .transpose(1, 2));
      xs.push_back(x + working_copy(positions_, dtype).narrow(0, 0, x.size(1)).unsqueeze(0));
    }
  } else {
    // The previous stage's windows, their tokens back to back.
    int64_t at = 0;
    for (const int64_t n : audio_tokens(windows)) {
      xs.push_back(input.narrow(0, at, n).unsqueeze(0));
      at += n;
    }
  }
  std::vector<torch::Tensor> out;
  for (torch::Tensor x : xs) {
    x = run_blocks(x, AttentionInputs{}, cuts);
    if (!last()) {
      out.push_back(x.squeeze(0));  // on to the next stage
      continue;
    }
    if (a.pooling > 1)
      x = torch::avg_pool1d(x.transpose(1, 2), {a.pooling}, {a.pooling}, {0}, /*ceil_mode=*/true)
              .transpose(1, 2);
    out.push_back(final_norm_.forward(x.squeeze(0)));  // after pooling, as Qwen2-Audio does
  }
  if (out.empty()) return torch::zeros({0, module_.transformer->hidden}, activation_options());
  return torch::cat(out, 0);
}

torch::Tensor Stage::project(const torch::Tensor& input) const {
  torch::Tensor x = input_norm_.weight.defined() ? input_norm_.forward(input) : input;
  if (module_.projector->layers == 1) return fc1_.forward(x);
  x = torch::gelu(fc1_.forward(x));
  for (const Linear& l : middle_) x = torch::gelu(l.forward(x));
  return fc2_.forward(x);
}

torch::Tensor Stage::embed(const torch::Tensor& ids, const torch::Tensor& text_slots,
                           const torch::Tensor& media, const torch::Tensor& media_slots,
                           const torch::Tensor& media_rows, const torch::Tensor& local,
                           const AttentionInputs& in) const {
  const int64_t hidden = module_.transformer->hidden;
  torch::Tensor h = torch::zeros({ids.size(0), hidden}, activation_options());
  if (in.sequence_parallel() && module_.inputs.empty()) {
    // Text alone: each rank's partial rows, reduce-scattered to its share.
    h = h.index_copy(0, text_slots, embedding_.forward_partial(ids.index_select(0, text_slots)));
    return reduce_scatter_to_rows(h.index_select(0, local), *in.sp, in.sp_rows);
  }
  h = h.index_copy(0, text_slots, embedding_.forward(ids.index_select(0, text_slots)));
  if (media_slots.size(0) > 0) h = h.index_copy(0, media_slots, media.index_select(0, media_rows));
  h = h.index_select(0, local);
  // The sequence whole on every TP rank, then each rank's share.
  return in.sequence_parallel() ? scatter_rows(h, *in.sp, in.sp_rows) : h;
}

torch::Tensor Stage::blocks(const torch::Tensor& h, const AttentionInputs& in, Cuts* cuts) const {
  return run_blocks(h.unsqueeze(0), in, cuts).squeeze(0);
}

torch::Tensor Stage::loss_sum(const torch::Tensor& h, const torch::Tensor& targets,
                              const AttentionInputs& in) const {
  // The logits in the activations' dtype; the loss computes in fp32 (layers.hpp). Under
  // sequence parallelism the head gathers every rank's rows of its input.
  const torch::Tensor normed = final_norm_.forward(h);
  const torch::Tensor logits =
      in.sequence_parallel() ? gathered({&head_}, normed, in)[0] : head_.forward(normed);
  return vocab_parallel_cross_entropy(logits, targets, head_.tp->rank * logits.size(1), *head_.tp)
      .sum();
}

Stage& find_stage(const Stages& stages, int module, int chunk, int64_t rank) {
  const auto it = stages.find({module, chunk});
  TESSERA_CHECK(it != stages.end(), "no stage of module " + std::to_string(module) + " chunk " +
                                        std::to_string(chunk) + " on rank " + std::to_string(rank));
  return *it->second;
}

}  // namespace tessera::exec

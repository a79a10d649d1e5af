// The Worker's compute ops: forward, and the input- and weight-gradient backward (whole or by
// gradient-bucket piece).
#include "exec/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "exec/device.hpp"
#include "exec/worker_internal.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

void Worker::forward(const Op& op) {
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  Stage& st = stage(op.module, op.chunk);
  const ModuleSpec& spec = st.module();
  const ModelSpec& model = scenario_.model;
  Slot& slot = slots_[key];
  // A module's input from a module on this rank: the producer's output, cut from its graph
  // (the producer's own B op continues from the gradient this op's B computes).
  torch::Tensor remote_order;  // rows of a linked input in this micro-batch's sample order
  auto from_producer = [&](const std::string& name) {
    const int producer = module_index(model, name);
    for (auto& [k, other] : stages_)
      if (k.first == producer && other->last()) {
        const torch::Tensor& out =
            slots_.at({producer, k.second, op.microbatch, op.sub_microbatch}).output;
        torch::Tensor leaf = out.detach();
        leaf.set_requires_grad(out.requires_grad());
        return leaf;
      }
    // On other ranks (a non-colocated projector of its own): the leaf of the rows its links
    // brought (whose gradient goes back along them), taken in this micro-batch's sample order.
    TESSERA_CHECK(boundary_.linked(), name + " does not run on rank " + std::to_string(rank_));
    const Boundary& b = assembled(producer, op.microbatch);
    std::vector<int64_t> rows;
    for (int32_t sample : samples_for(op.module, op.microbatch)) {
      const auto [first, n] = b.rows.at(sample);
      for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
    }
    remote_order = device_indices(rows);
    return b.leaf;
  };
  std::vector<torch::Tensor> inputs;
  std::vector<torch::Tensor> entrain_parts;  // Entrain: the LLM's media rows, per input
  std::vector<torch::Tensor> dip_parts;      // DIP: each input's sub-micro-batches, joined
  // Colocated: the LLM's micro-batches take their rows from the producers' whole-batch outputs.
  const bool whole_batch_inputs = spec.role == ModuleRole::kLlm && st.first() &&
                                  !received_.count(key) &&
                                  plan_.placement != Placement::kHomogeneous;
  // The rows of each input: the colocated boundary's (whole batch), or the non-colocated one's
  // (this micro-batch, assembled from the links).
  // Each LLM micro-batch selects its rows from the boundary (under Entrain from the one or two
  // encoder micro-batches holding them, below).
  const bool boundary_rows = whole_batch_inputs && !(entrain_ && boundary_.linked());
  auto input_boundary = [&](int producer) -> Boundary& {
    return boundary_.linked() ? assembled(producer, op.microbatch) : boundary(producer);
  };
  if (!st.first() || (spec.role == ModuleRole::kLlm && received_.count(key))) {
    inputs.push_back(received_.at(key));
  } else if (boundary_rows) {
    for (const std::string& name : spec.inputs)
      inputs.push_back(input_boundary(module_index(model, name)).leaf);
  } else if (dip_ && spec.role == ModuleRole::kLlm) {
    // The pieces' outputs in order are the micro-batch's media rows; the pieces are the leaves.
    for (const std::string& name : spec.inputs) {
      const int producer = module_index(model, name);
      std::vector<torch::Tensor> pieces;
      for (int sub = 0;; ++sub) {
        const auto it = dip_received_.find({producer, 0, op.microbatch, sub});
        if (it == dip_received_.end()) break;
        pieces.push_back(it->second);
        inputs.push_back(it->second);
      }
      dip_parts.push_back(pieces.empty()
                              ? torch::zeros({0, spec.transformer->hidden}, activation_options())
                              : torch::cat(pieces, 0));
    }
  } else if (entrain_ && spec.role == ModuleRole::kLlm) {
    // Each input's rows from two encoder micro-batches; the leaves are what backward targets.
    for (const std::string& name : spec.inputs)
      entrain_parts.push_back(entrain_rows(module_index(model, name), op.microbatch, inputs));
  } else if (spec.role != ModuleRole::kEncoder) {
    for (const std::string& name : spec.inputs) inputs.push_back(from_producer(name));
  }
  const bool needs_graph =
      st.trainable() || std::any_of(inputs.begin(), inputs.end(),
                                    [](const torch::Tensor& t) { return t.requires_grad(); });
  // A frozen module with nothing trainable before it keeps no graph.
  torch::AutoGradMode graph(needs_graph);
  Cuts* cuts = nullptr;
  if (recomputed_.count(key) && needs_graph) {
    // Full recomputation: no activations kept now; the R op runs the layers again (and cuts
    // them for a backward in pieces then).
    slot.cuts = Cuts{};
    slot.cuts.checkpoint = true;
    cuts = &slot.cuts;
  } else if (const auto it = cuts_.find(key); it != cuts_.end() && needs_graph) {
    slot.cuts = Cuts{};
    slot.cuts.layers = it->second;
    cuts = &slot.cuts;
  }
  if (const auto pieces = forward_pieces_.find(key); pieces != forward_pieces_.end()) {
    // In pieces: each waits for its parameters' gather as the layers reach it.
    if (cuts == nullptr) {
      slot.cuts = Cuts{};
      cuts = &slot.cuts;
    }
    cuts->entering = [this, &pieces = pieces->second,
                      running = current_op_](int64_t layer) mutable {
      const auto piece = pieces.find(layer);
      if (piece == pieces.end() || piece_times_.count(piece->second)) return;
      piece_times_[running].second = elapsed();
      const Op& next =
          program_->ranks[static_cast<std::size_t>(rank_)][static_cast<std::size_t>(piece->second)];
      gather_ahead(next);
      await_gathers(next);
      piece_times_[piece->second].first = elapsed();
      running = piece->second;
    };
  }
  torch::Tensor out;
  switch (spec.role) {
    case ModuleRole::kEncoder: {
      const std::vector<int32_t> samples = samples_for(op.module, op.microbatch);
      if (spec.modality == Modality::kAudio)
        out =
            st.encode_audio(audio_windows(op), inputs.empty() ? torch::Tensor() : inputs[0], cuts);
      else if (!inputs.empty())
        out = st.encode(inputs[0], cuts);
      else if (dip_) {
        // This sub-micro-batch's images of the LLM micro-batch.
        const DipPiece piece =
            dip_pieces(op.module, op.microbatch).at(static_cast<std::size_t>(op.sub_microbatch));
        out =
            st.encode(micro_batch_pieces(scenario_.model, spec, batch_,
                                         my_micro_batches_[static_cast<std::size_t>(op.microbatch)])
                          .narrow(0, piece.first, piece.count),
                      cuts);
      } else if (const MediaAssignment* media = media_for(op.module); media != nullptr) {
        out = st.encode(
            media_item_pieces(scenario_.model, spec, batch_,
                              (*media)[static_cast<std::size_t>((*places_)[op.module].dp_rank)]),
            cuts);
      } else {
        out = st.encode(micro_batch_pieces(scenario_.model, spec, batch_, samples), cuts);
      }
      break;
    }
    case ModuleRole::kProjector:
      out = st.project(remote_order.defined() ? inputs.at(0).index_select(0, remote_order)
                                              : inputs.at(0));
      break;
    case ModuleRole::kLlm: {
      const MicroBatch& b = micro_batch(op.microbatch);
      // The contract with the lowering: this op processes the tokens the Program says (with
      // CP, the Program charges each rank an even share).
      const int64_t cp = b.attention.cp != nullptr ? b.attention.cp->size() : 1;
      TESSERA_CHECK(cp > 1 || b.layout.tokens == op.tokens,
                    op_name(*program_, op) + ": the micro-batch has " +
                        std::to_string(b.layout.tokens) + " tokens, the Program " +
                        std::to_string(op.tokens));
      const auto local = device_indices(b.local);
      torch::Tensor h;
      if (st.first() && !received_.count(key)) {
        const int64_t hidden = spec.transformer->hidden;
        // The LLM's inputs in order (llm_layout numbers media rows the same way); at a
        // colocated boundary, each input's rows of this micro-batch's samples.
        // (Colocated Entrain: the whole-batch boundary serves the LLM's level-2 micro-batches.)
        std::vector<torch::Tensor> parts = dip_                         ? dip_parts
                                           : entrain_ && !boundary_rows ? entrain_parts
                                                                        : inputs;
        if (boundary_rows)
          for (std::size_t i = 0; i < inputs.size(); ++i) {
            const Boundary& bd = input_boundary(module_index(model, spec.inputs[i]));
            std::vector<int64_t> rows;
            for (int32_t sample : b.samples) {
              const auto [first_row, count] = bd.rows.at(sample);
              for (int64_t r = 0; r < count; ++r) rows.push_back(first_row + r);
            }
            parts[i] = inputs[i].index_select(0, device_indices(rows));
          }
        const torch::Tensor media =
            parts.empty() ? torch::zeros({0, hidden}, activation_options()) : torch::cat(parts, 0);
        h = st.embed(b.layout.ids, b.layout.text_slots, media, b.layout.media_slots,
                     b.layout.media_rows, local, b.attention);
      } else {
        h = inputs.at(0);
      }
      h = st.blocks(h, b.attention, cuts);
      if (st.last()) {
        out = st.loss_sum(h, b.layout.targets.index_select(0, local), b.attention) /
              static_cast<double>(batch_.targets);
        if (places_->llm_tp_index() == 0) loss_sum_ += out.detach().to(torch::kFloat64);
      } else {
        out = h;
      }
      break;
    }
    case ModuleRole::kGenerator:
      TESSERA_CHECK(false, "generators are not in the executor yet");
  }
  slot.inputs = inputs;  // all of them: a producer finds its gradient by input position
  slot.output = out;
}

torch::Tensor Worker::output_gradient(const Op& op, Slot& slot) {
  Stage& st = stage(op.module, op.chunk);
  if (boundary_.linked() && consumer_of(op.module) >= 0) {
    absorb_self_links(op.module);
  }
  torch::Tensor grad = slot.output_grad;
  if (st.module().role == ModuleRole::kLlm && st.last()) {
    grad = torch::ones_like(slot.output);
  } else if (!grad.defined() && boundary_.whole.count(op.module)) {
    // A colocated boundary without a regroup: this rank's rows of the accumulated gradient.
    const Boundary& bd = boundary_.whole.at(op.module);
    grad = bd.leaf.grad().defined() ? bd.leaf.grad().narrow(0, bd.mine_first, bd.mine_rows)
                                    : torch::zeros_like(slot.output);
  } else if (!grad.defined() && boundary_.entrain_leaves.count({op.module, op.microbatch})) {
    // Entrain: accumulated over the LLM micro-batches that took this micro-batch's rows.
    const torch::Tensor& leaf = boundary_.entrain_leaves.at({op.module, op.microbatch});
    grad = leaf.grad().defined() ? leaf.grad() : torch::zeros_like(slot.output);
  } else if (!grad.defined()) {
    // The consumer on this rank computed it: the gradient of its input from this module.
    const std::string& name = st.module().name;
    for (std::size_t c = 0; c < scenario_.model.modules.size() && !grad.defined(); ++c) {
      const auto& inputs = scenario_.model.modules[c].inputs;
      const auto it = std::find(inputs.begin(), inputs.end(), name);
      if (it == inputs.end()) continue;
      for (auto& [k, other] : stages_)
        if (k.first == static_cast<int>(c) && other->first()) {
          const auto found = slots_.find({k.first, k.second, op.microbatch, op.sub_microbatch});
          if (found != slots_.end() && !found->second.input_grads.empty())
            grad = found->second.input_grads.at(static_cast<std::size_t>(it - inputs.begin()));
        }
    }
    TESSERA_CHECK(grad.defined(), "no output gradient for " + op_name(*program_, op));
  }
  return grad;
}

void Worker::recompute(const Op& op) {
  Slot& slot = slots_.at({op.module, op.chunk, op.microbatch, op.sub_microbatch});
  if (!slot.cuts.checkpoint) return;  // no graph was needed (nothing trains, nothing flows back)
  // Fully sharded, each unit has its R op after its gather, top unit first: the top one reruns
  // the whole chunk (the parameters stay allocated here), the others have nothing left to do.
  if ((op.flags & kOpFullySharded) != 0 &&
      op.first_layer + op.layers < stage(op.module, op.chunk).end())
    return;
  slot.cuts.entering = nullptr;  // the parameters are here since the forward
  if (const auto it = cuts_.find({op.module, op.chunk, op.microbatch, op.sub_microbatch});
      it != cuts_.end())
    slot.cuts.layers = it->second;
  stage(op.module, op.chunk).rerun(slot.cuts);
}

void Worker::backward(const Op& op, bool weights) {
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  Stage& st = stage(op.module, op.chunk);
  Slot& slot = slots_.at(key);
  const bool has_w = has_w_.count(key) > 0;
  if (!slot.output.defined() || !slot.output.requires_grad()) {
    // Nothing flowed through (a frozen module whose micro-batch has no media): zero gradients
    // for the producers.
    if (!weights && slot.input_grads.empty())
      for (const torch::Tensor& in : slot.inputs) slot.input_grads.push_back(torch::zeros_like(in));
    return;
  }
  // A gradient bucket's piece runs layers [a, b) only: from the cut at b (or the stage's
  // output) down to the cut at a (or the stage's inputs).
  int64_t a = st.begin(), b = st.end();
  if ((op.flags & kOpGradientBucket) != 0) {
    a = op.first_layer;
    b = op.first_layer + op.layers;
  }
  const bool top = b == st.end(), bottom = a == st.begin();
  std::vector<torch::Tensor> outputs, grads;
  if (top && slot.cuts.checkpoint) {
    // Recomputed layers: the back end's gradient down to the leaves the layers' outputs became
    // (with its parameters'), then on from the layers run again.
    if (!weights) {
      const torch::Tensor grad = output_gradient(op, slot);
      if (slot.output.grad_fn()) {
        std::vector<torch::Tensor> leaves;
        for (const torch::Tensor& leaf : slot.cuts.stack_leaves)
          if (leaf.requires_grad()) leaves.push_back(leaf);
        for (const Param* p : st.params_of(st.end(), st.end()))
          if (p->tensor.requires_grad()) leaves.push_back(p->tensor);
        if (!leaves.empty()) torch::autograd::backward({slot.output}, {grad}, false, false, leaves);
      } else {
        slot.cuts.stack_leaves.at(0).mutable_grad() = grad;  // the output is the layers' own
      }
    }
    outputs = slot.cuts.stack_outputs;
    for (const torch::Tensor& leaf : slot.cuts.stack_leaves)
      grads.push_back(leaf.grad().defined() ? leaf.grad() : torch::zeros_like(leaf));
  } else if (top) {
    outputs = {slot.output};
    grads = {output_gradient(op, slot)};
  } else {
    outputs = slot.cuts.below.at(b);
    grads = slot.cut_grads.at(b);
  }
  const std::vector<torch::Tensor>& starts = bottom ? slot.inputs : slot.cuts.above.at(a);
  std::vector<torch::Tensor> targets;
  if (!weights)
    for (const torch::Tensor& in : starts)
      if (in.requires_grad()) targets.push_back(in);
  if (weights || !has_w)
    for (const Param* p : st.params_of(a, b))
      if (p->tensor.requires_grad()) targets.push_back(p->tensor);
  if (!targets.empty())
    torch::autograd::backward(outputs, grads, /*retain_graph=*/!weights && has_w,
                              /*create_graph=*/false, targets);
  if (!weights) {
    std::vector<torch::Tensor> start_grads;
    for (const torch::Tensor& in : starts)
      start_grads.push_back(in.grad().defined() ? in.grad() : torch::zeros_like(in));
    if (bottom)
      slot.input_grads = start_grads;
    else
      slot.cut_grads[a] = start_grads;
  }
  if (bottom && (weights || !has_w)) {
    slot.output = torch::Tensor();
    slot.inputs.clear();
    slot.cuts = Cuts{};
    slot.cut_grads.clear();
  }
}

}  // namespace tessera::exec

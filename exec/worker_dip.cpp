// The Worker under schedule dip: sub-micro-batch pieces and their boundary messages (the
// schedules themselves are searched ahead by DipPrefetcher, dip_prefetch.hpp).
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

const std::vector<Worker::DipPiece>& Worker::dip_pieces(int encoder, int mb) {
  const auto key = std::make_pair(encoder, mb);
  if (const auto it = dip_pieces_.find(key); it != dip_pieces_.end()) return it->second;
  const ModuleSpec& spec = scenario_.model.modules[static_cast<std::size_t>(encoder)];
  std::vector<const Sample*> samples;
  for (int32_t i : my_micro_batches_[static_cast<std::size_t>(mb)])
    samples.push_back(&batch_.batch.samples[static_cast<std::size_t>(i)]);
  // The lowering's cut (dip_schedule.hpp): each piece's first item (an image or a clip).
  const auto items = dip_media_items(scenario_.model, spec, samples);
  const std::vector<std::size_t> first = dip_piece_starts(
      scenario_.model, spec, samples, items, plan_.layout.vpp, scenario_.workload.max_seq_len);
  // Each item's encoder pieces (a clip's temporal steps) and LLM rows.
  std::vector<MediaItem> sizes;
  for (const auto& [owner, item] : items)
    sizes.push_back(media_items(scenario_.model, spec, item).at(0));
  auto& out = dip_pieces_[key];
  int64_t piece = 0;
  for (std::size_t j = 0; j < first.size(); ++j) {
    const std::size_t end = j + 1 < first.size() ? first[j + 1] : items.size();
    DipPiece d{piece, 0, 0};
    for (std::size_t i = first[j]; i < end; ++i) {
      d.count += sizes[i].pieces;
      d.llm_rows += sizes[i].llm_tokens;
    }
    piece += d.count;
    out.push_back(d);
  }
  return out;
}

std::vector<torch::Tensor> Worker::audio_windows(const Op& op) {
  if (const MediaAssignment* media = media_for(op.module); media != nullptr)
    return media_item_audio(batch_,
                            (*media)[static_cast<std::size_t>((*places_)[op.module].dp_rank)]);
  if (!dip_) return micro_batch_audio(batch_, samples_for(op.module, op.microbatch));
  const std::vector<torch::Tensor> all =
      micro_batch_audio(batch_, my_micro_batches_[static_cast<std::size_t>(op.microbatch)]);
  const DipPiece piece =
      dip_pieces(op.module, op.microbatch).at(static_cast<std::size_t>(op.sub_microbatch));
  const auto first = all.begin() + piece.first;
  return {first, first + piece.count};
}

void Worker::dip_boundary(const Op& op) {
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  if (op.kind == OpKind::kSend) {
    torch::Tensor t;
    if (op.phase == Phase::kF) {
      t = slots_.at(key).output;
    } else {
      const torch::Tensor& leaf = dip_received_.at(key);
      t = leaf.grad().defined() ? leaf.grad() : torch::zeros_like(leaf);
    }
    messages_.send(op, t.detach());
    return;
  }
  torch::Tensor t;
  if (op.phase == Phase::kF) {
    // The encoder behind this projector, and the piece's rows for the LLM.
    const ModelSpec& model = scenario_.model;
    const ModuleSpec* encoder =
        source_encoder(model, model.modules[static_cast<std::size_t>(op.module)]);
    const int64_t rows = dip_pieces(module_index(model, encoder->name), op.microbatch)
                             .at(static_cast<std::size_t>(op.sub_microbatch))
                             .llm_rows;
    t = torch::zeros(
        {rows, model.modules[static_cast<std::size_t>(places_->llm())].transformer->hidden},
        activation_options());
  } else {
    t = torch::zeros_like(slots_.at(key).output);
  }
  messages_.receive(op, t);
  if (op.phase == Phase::kF) {
    t.set_requires_grad(sends_grad_.count(key) > 0);
    dip_received_[key] = t;
  } else {
    slots_.at(key).output_grad = t;
  }
}

}  // namespace tessera::exec

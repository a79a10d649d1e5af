// From a drawn batch to micro-batches, and what each module computes for a set of samples:
// its tokens and its attention work under the multimodal mask (docs/ALGORITHMS.md §2:
// text attends causally to every earlier token of its sample, media tokens bidirectionally
// within their own image / tile / clip).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shared/layout/parallel_plan.hpp"
#include "shared/model/batch.hpp"

namespace tessera {

struct ModuleWork {
  int64_t samples = 0;
  int64_t tokens = 0;          // tokens the module processes (its own sequence)
  double attention_pairs = 0;  // (query, key) pairs its attention computes, summed over samples
  int64_t output_tokens = 0;   // tokens it hands on (projector/encoder: to the LLM)
  int64_t text_tokens = 0;     // LLM: text tokens in its sequences (embedded by its vocabulary)
};

// One media item of a sample as an encoder takes it: `pieces` separate encoder sequences (tiles,
// audio windows, a fixed-size encoder's video frames in temporal steps) of `piece_tokens` each,
// the `merged_tokens` the encoder hands its projector (after merging or pooling), and the
// `llm_tokens` it becomes in the LLM's sequence (as many, unless the projector resamples).
struct MediaItem {
  int64_t piece_tokens = 0;
  int64_t pieces = 0;
  int64_t llm_tokens = 0;
  int64_t merged_tokens = 0;
};
// The media items of `sample` that `encoder` turns into tokens, in the order the encoder and the
// LLM take them: its images where it is the image encoder, then its videos where it is the
// video encoder (one ViT may be both), then its audio clips where it is the audio encoder.
std::vector<MediaItem> media_items(const ModelSpec& model, const ModuleSpec& encoder,
                                   const Sample& sample);
// The encoder whose tokens `module` (an encoder, or a projector fed by one) carries; null for
// others.
const ModuleSpec* source_encoder(const ModelSpec& model, const ModuleSpec& module);
// The distinct encoders of `model` in the order their media enter a sample's LLM sequence:
// the image encoder, the video encoder (when another), the audio encoder.
std::vector<const ModuleSpec*> media_encoders(const ModelSpec& model);

// With `pad_to_longest` (ParallelPlan::pad_to_longest), an LLM's samples are padded to the
// longest of them: `tokens` counts the pads, each pad attends to itself alone (one pair), and
// `text_tokens` and `output_tokens` stay the samples' own.
// REQUIRES: samples only carry media the model has encoders for (validate_scenario).
ModuleWork module_work(const ModelSpec& model, const ModuleSpec& module,
                       std::span<const Sample* const> samples, int64_t max_seq_len,
                       bool pad_to_longest = false);

// samples of [replica][micro-batch], as indices into Batch::samples. Arrival order deals the
// batch to replicas in contiguous blocks and cuts each block into micro-batches; sorted order
// first sorts each replica's block by LLM sequence length, so micro-batches hold similar lengths.
using MicrobatchAssignment = std::vector<std::vector<std::vector<int32_t>>>;
MicrobatchAssignment assign_microbatches(const Batch& batch, const ModelSpec& model,
                                         int64_t replicas, int64_t microbatches,
                                         MicrobatchPolicy policy, int64_t max_seq_len);

// The samples (indices into Batch::samples) that replica `replica` of a module with `dp`
// data-parallel replicas handles in LLM micro-batch `mb` (-1: all of them), related to the LLM's
// assignment by the ratio of data-parallel degrees: with k times more replicas each takes every
// k-th sample of an LLM replica's batch (fan-in); with k times fewer each takes k LLM replicas'
// micro-batches (fan-out). REQUIRES: dp and the LLM's replica count divide one another.
std::vector<int32_t> replica_samples(const MicrobatchAssignment& llm, int64_t dp, int64_t replica,
                                     int32_t mb);

// One media item of a sample: the `item`-th of media_items(model, encoder, that sample).
struct MediaPiece {
  int32_t sample = 0;
  int32_t item = 0;
  bool operator==(const MediaPiece&) const = default;
};
// The media items each replica of an encoder with `dp` replicas (a multiple of the LLM's)
// encodes under encoder_data_parallel media: the k = dp / LLM-dp replicas that feed one LLM
// replica share the items of its samples, each micro-batch's items dealt largest first to the
// replica with the least encoder work so far (longest-processing-time first, the work of an item
// its forward FLOPs). Each replica's items come in the LLM replica's order: by micro-batch, then
// sample, then item.
using MediaAssignment = std::vector<std::vector<MediaPiece>>;
MediaAssignment assign_media(const Batch& batch, const ModelSpec& model, const ModuleSpec& encoder,
                             const MicrobatchAssignment& llm, int64_t dp);
// The media of `sample` that `items` (indices into media_items(model, encoder, sample)) name, as
// a sample of their own without text.
Sample media_subset(const ModelSpec& model, const ModuleSpec& encoder, const Sample& sample,
                    std::span<const int32_t> items);

}  // namespace tessera

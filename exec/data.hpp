// What the executor trains on, and how a micro-batch becomes tensors.
// Data sets: `synthetic` draws the workload's samples (the same draws as the simulator, via
// draw_batch) and fills them with seeded random pixels and token ids; `shapes` generates images
// of coloured shapes with an 8-token caption, which a model can learn.
// Layout of a micro-batch in the LLM: its samples packed back to back into one sequence, each
// with its media tokens first, then its text, truncated at max_seq_len (as module_work counts);
// the attention mask is the multimodal one of docs/ALGORITHMS.md §2 within each sample.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/layers.hpp"

#include "shared/layout/microbatch.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/model/batch.hpp"

namespace tessera::exec {

enum class DatasetKind { kSynthetic, kShapes };

struct SampleData {
  std::vector<int64_t> text;          // token ids (length Sample::text_tokens)
  std::vector<torch::Tensor> images;  // (C, S, S) each, S = the encoder's image_size
  std::vector<torch::Tensor> videos;  // (F, C, S, S) each: a clip's F frames
  // Per audio clip, its encoder windows: (mel_bins, frames) log-mel features each, padded to
  // max_seconds when the front end pads (audio_tokens() counts the same windows).
  std::vector<std::vector<torch::Tensor>> audio;
};

struct TrainBatch {
  Batch batch;                   // shapes, for lower()
  std::vector<SampleData> data;  // content, same order
  int64_t targets = 0;           // predicted text tokens in the whole batch (loss normalizer)
};

// Checks that the executor can run `model` (image and video encoders with fixed resize, their
// patches optionally spanning several frames and their tokens merged s x s; Whisper-style audio
// encoders; projectors; a decoder LLM). Returns a problem, or "".
std::string executor_support(const ModelSpec& model);

// Checks that the executor can run `plan` (validated against `model`). Returns a problem, or "".
std::string executor_plan_support(const ParallelPlan& plan, const ModelSpec& model);

// REQUIRES: scenario validated, executor_support(model) empty.
TrainBatch make_batch(const Scenario& scenario, DatasetKind kind, int64_t iteration);

// The LLM sequence of a micro-batch.
struct LlmLayout {
  int64_t tokens = 0;
  torch::Tensor ids;          // (T) text token id, 0 at media positions
  torch::Tensor positions;    // (T) position within its sample (rotary)
  torch::Tensor targets;      // (T) next text token, -1 where none
  torch::Tensor text_slots;   // positions holding text
  torch::Tensor media_slots;  // positions holding media tokens
  torch::Tensor media_rows;   // for each media slot, its row in the micro-batch's projector output
  std::vector<int32_t> sample;  // per position: sample (index in the micro-batch)
  std::vector<int32_t> item;    // per position: media item (micro-batch-wide) or -1 for text
};

// The layout's tensors, built on the CPU, moved to this process's device (device.hpp).
void move_to_device(LlmLayout& layout);

// Media rows come from the LLM's inputs concatenated in the order of ModuleSpec::inputs, each
// input's rows being its modality's items in sample order. With `pad_to_longest`
// (ParallelPlan::pad_to_longest) the sequence also holds the pads that bring every sample to the
// longest one's length, as module_work() counts them: at the end, each attending to itself alone,
// predicting nothing.
LlmLayout llm_layout(const ModelSpec& model, const TrainBatch& batch,
                     const std::vector<int32_t>& samples, int64_t max_seq_len,
                     bool pad_to_longest = false);

// Tokens a sample's media that `encoder` encodes become in the LLM sequence (before
// truncation): the rows the encoder's projector produces for it.
int64_t llm_media_tokens(const ModelSpec& model, const ModuleSpec& encoder, const Sample& sample);

// The LLM's additive attention masks, 0 where a query attends to a key and -inf elsewhere, built
// on this process's device in the activation dtype: text attends causally to its own sample, a
// media token to the tokens of its own item, both ways.
// The layout's positions `queries` against `keys`: (Lq, Lk).
torch::Tensor attention_bias(const LlmLayout& layout, const std::vector<int64_t>& queries,
                             const std::vector<int64_t>& keys);
// The whole layout against itself (no context parallelism) as blocks, one per sample, each run
// of consecutive samples of one length batched.
std::vector<AttentionBlocks> attention_blocks(const LlmLayout& layout);

// The pieces `encoder` runs for the samples, (P, C·T, S, S) with T its temporal_patch: per
// sample (in order) its media_items() — an image as one piece (repeated T times over time), a
// clip as ceil(F / T) pieces of T frames each (the last frame repeated to fill the last).
// (0, C·T, S, S) when none.
torch::Tensor micro_batch_pieces(const ModelSpec& model, const ModuleSpec& encoder,
                                 const TrainBatch& batch, const std::vector<int32_t>& samples);
// The same for media items one by one (encoder_data_parallel media), in the order given.
torch::Tensor media_item_pieces(const ModelSpec& model, const ModuleSpec& encoder,
                                const TrainBatch& batch, const std::vector<MediaPiece>& items);

// Audio encoder windows of the micro-batch, in sample and clip order.
std::vector<torch::Tensor> micro_batch_audio(const TrainBatch& batch,
                                             const std::vector<int32_t>& samples);
// The same for recordings one by one (encoder_data_parallel media), in the order given.
std::vector<torch::Tensor> media_item_audio(const TrainBatch& batch,
                                            const std::vector<MediaPiece>& items);

}  // namespace tessera::exec

// Drawing batches from a workload and counting their tokens through a model's encoders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

struct Batch {
  int64_t iteration = 0;
  std::vector<Sample> samples;  // global_batch samples, in arrival order
};

// The samples of `iteration`: the same for the same (workload, iteration) on every machine.
// Parametric: each sample drawn from its own stream derived from (seed, iteration, index).
// Manifest: samples taken in a per-epoch shuffled order of the manifest.
// REQUIRES: workload validated.
Batch draw_batch(const WorkloadSpec& workload, int64_t iteration);

// Tokens of one sample for a given model.
struct SampleTokens {
  int64_t text = 0;
  // Per modality: tokens the LLM sees, and the sequence the encoder runs on.
  int64_t image_llm = 0, image_encoder = 0;
  int64_t audio_llm = 0, audio_encoder = 0;
  int64_t video_llm = 0, video_encoder = 0;
  // Media tokens reaching the LLM through cross-attention instead of the sequence (Mllama).
  int64_t cross_attention = 0;
  int64_t llm_sequence = 0;  // text + media tokens in the LLM sequence (before truncation)
};

// REQUIRES: the model has an encoder for every modality the sample carries (checked by
// validate_scenario).
SampleTokens sample_tokens(const ModelSpec& model, const Sample& sample);

// Summary statistics of a quantity over samples.
struct Stats {
  int64_t count = 0;
  double mean = 0, min = 0, max = 0, p50 = 0, p90 = 0;
};
Stats summarize(std::vector<double> values);

}  // namespace tessera

// A plan as Megatron-LM trains it: the model shape, the parallel layout, batching,
// recomputation, optimizer overlap and precision as Megatron-LM's training arguments, and the
// same values as the keyword arguments of megatron-core's configuration classes (which a test
// hands to megatron-core itself). What Megatron-LM cannot express is said in notes, never
// dropped silently.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shared/base/json_reader.hpp"
#include "shared/layout/scenario.hpp"

namespace tessera {

struct MegatronExport {
  // Training arguments in order, each a flag and its value ("" for a switch).
  std::vector<std::pair<std::string, std::string>> arguments;
  // A non_colocated plan of one encoder beside the LLM: the module grids as Megatron-LM's MIMO
  // example (examples/mimo/pretrain_mimo.py) takes them — the encoder's TP and DP from rank 0,
  // the LLM's span offset and TP, CP, PP, DP, EP and expert TP. Empty otherwise.
  std::vector<std::pair<std::string, std::string>> mimo_arguments;
  // Keyword arguments of megatron-core's classes: "transformer_config" (TransformerConfig, or
  // MLATransformerConfig where "multi_latent_attention" is true), "model" (GPTModel's
  // vocab_size, max_sequence_length, position_embedding_type,
  // share_embeddings_and_output_weights), "ddp_config" (DistributedDataParallelConfig) and
  // "batch" (global and micro batch, data-parallel size).
  Json config;
  // What the plan holds that these arguments do not carry: the encoders of a multimodal model
  // and their grids, Entrain's assignment, DIP's schedules, a stage split Megatron-LM cannot
  // state, options priced for another stack. Each names the plan field.
  std::vector<std::string> notes;
  // Non-empty: the plan cannot be written as Megatron-LM arguments at all (why).
  std::string refusal;
};

// REQUIRES: `plan` validated against the scenario, its frozen-aware stage split resolved.
MegatronExport megatron_export(const Scenario& scenario, const ParallelPlan& plan);

// The arguments as a shell command line: `pretrain_gpt.py` and one flag per line.
std::string megatron_command_line(const MegatronExport& e);

}  // namespace tessera

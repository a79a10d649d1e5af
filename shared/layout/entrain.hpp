// Entrain's hierarchical micro-batch assignment (docs/ALGORITHMS.md §4; the formulation
// is ours, from the paper's abstract). Within each data-parallel replica's share of the batch:
// level 1 deals the samples to the M micro-batches by encoder work, largest first, each to the
// least-loaded micro-batch (LPT), so every micro-batch brings the encoders about the same work;
// level 2 walks those micro-batches in schedule order against the LLM-work target
// τ = (replica's LLM work) / M and defers a micro-batch's excess — its samples, largest LLM work
// first, while the micro-batch stays above τ·(1 + slack) — to the next micro-batch. A sample
// moves at most once, and only when that lowers the larger of the two micro-batches' LLM work,
// so level 2 never raises the iteration's largest micro-batch (our guard: deferring blindly
// piles the excess onto the last micro-batch) and every sample reaches the LLM in its own
// micro-batch or the next. Nothing leaves the
// iteration, so the gradient is unchanged.
// The encoders run the level-1 micro-batches, the LLM the level-2 ones: a deferred sample's
// encoder output waits one or more micro-batches for the LLM.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shared/layout/microbatch.hpp"
#include "shared/model/batch.hpp"
#include "shared/program/program.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

struct EntrainAssignment {
  MicrobatchAssignment encoder;  // level 1: [replica][micro-batch] samples, ascending
  MicrobatchAssignment llm;      // level 2: the same, with LLM excess deferred
};

// FLOPs a sample brings one module in `phases` (default: the forward), counted as the lowering
// counts them (phase_flops; 0 without a transformer or media for it).
inline constexpr Phase kForwardOnly[] = {Phase::kF};
double sample_module_flops(const ModelSpec& model, const ModuleSpec& module, const Sample& sample,
                           int64_t max_seq_len, std::span<const Phase> phases = kForwardOnly);

// Entrain's static layout: the encoders' share of the training work, from the mean over the
// first `batches` drawn global batches (whose sums are stable where single samples are not).
// Work per module = its F, B and W FLOPs as the lowering counts them (F and B when it only passes
// a gradient back to something trainable before it; F alone when nothing before it trains). Devices
// split in this proportion let encoders and LLM take about equally long per iteration. REQUIRES:
// batches >= 1.
double encoder_work_share(const ModelSpec& model, const WorkloadSpec& workload, int64_t batches);

// Replicas take contiguous blocks of the batch as in arrival order. With no encoder work in a
// replica's block (text only), level 1 deals by LLM work instead. A micro-batch never ends up
// empty when the replica has at least M samples. REQUIRES: replicas, microbatches >= 1; slack >= 0.
EntrainAssignment entrain_assignment(const Batch& batch, const ModelSpec& model, int64_t replicas,
                                     int64_t microbatches, int64_t max_seq_len,
                                     double slack = 0.05);

}  // namespace tessera

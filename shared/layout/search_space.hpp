// SearchSpace: the plans a sweep may consider (used by `tessera sweep`). Every list is a set of
// candidate values; an empty `gpus` means the scenario cluster's device count.
#pragma once

#include <cstdint>
#include <vector>

#include "shared/layout/parallel_plan.hpp"

namespace tessera {

struct SearchSpace {
  std::vector<Placement> placements = {Placement::kHomogeneous, Placement::kColocated,
                                       Placement::kNonColocated};
  std::vector<int64_t> gpus;
  std::vector<int64_t> tp = {1, 2, 4, 8};
  std::vector<int64_t> cp = {1, 2};
  std::vector<int64_t> pp = {1, 2, 4, 8};
  std::vector<int64_t> vpp = {1, 2};
  std::vector<int64_t> micro_batch_sizes = {1, 2, 4};
  // Expert parallelism of an LLM with experts (each value dividing its experts and cp·dp);
  // ignored for a dense one.
  std::vector<int64_t> ep = {1, 2, 4, 8};
  // Expert tensor parallelism of those plans (JSON "tp" or 1; 0 here stands for "tp"): the routed
  // experts split over the plan's TP as the dense layers are, or whole on each rank (EP carved
  // out of tp·cp·dp, each TP rank routing its own tokens; tried where tp > 1 with sequence
  // parallelism, Megatron-LM's expert_tensor_parallel_size 1).
  std::vector<int64_t> etp = {0};
  // The expert dispatch of those plans where EP > 1: each dispatcher listed (alltoall, Megatron-
  // LM's; deepep, a token sent once to each other node holding its experts), each with and
  // without the all-to-alls overlapped with another micro-batch's compute (moe_a2a_overlap).
  // Default: the all-to-all dispatcher, not overlapped.
  std::vector<MoeDispatcher> moe_dispatchers = {MoeDispatcher::kAllToAll};
  std::vector<bool> moe_a2a_overlap = {false};
  // Pipeline stages of each encoder's own in non-colocated plans (its share of the devices is
  // tp · encoder_pp · dp). Default 1: with data parallelism beside it, pipelining an encoder rarely
  // pays and it triples the non-colocated candidates; `tessera stages` searches stage counts
  // per module exhaustively for pipeline-only layouts.
  std::vector<int64_t> encoder_pp = {1};
  // Context parallelism of each encoder in colocated and non-colocated plans: every media item's
  // tokens split over cp ranks, keys and values gathered per layer — for items too long for one
  // rank (long videos and recordings, very large images). Default 1; where no plan of the space
  // fits in memory, the sweep tries kEncoderCpFallback by itself before giving up.
  std::vector<int64_t> encoder_cp = {1};
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kFull};
  // Sequence parallelism (applies where tp > 1) and the distributed optimizer, each value tried.
  std::vector<bool> sequence_parallel = {true};
  std::vector<bool> distributed_optimizer = {true};
  // Fully sharded data parallelism (ZeRO-3, FSDP2), tried with the distributed optimizer where
  // there are replicas to shard over, in homogeneous (outside schedule dip) and non-colocated
  // plans. Default off: it trades a gather of every unit's weights per micro-batch for memory.
  std::vector<bool> fully_sharded = {false};
  // FP8 recipes tried for every plan (none, delayed, current); with the distributed optimizer an
  // FP8 plan keeps and gathers its layers' weights in FP8 (fp8_param_gather), as NeMo's recipes
  // do. Default: none.
  std::vector<Fp8Recipe> fp8 = {Fp8Recipe::kNone};
  // The training software every plan runs on (not searched: the stack the user trains with).
  Framework framework = Framework::kMegatron;
  // Pipelined plans are tried with each (plans without a pipeline have nothing to split).
  std::vector<StageSplit> stage_splits = {StageSplit::kFrozenAware, StageSplit::kUniform};
  // Plans with context parallelism are tried with each. Default makespan alone: it keeps the
  // zigzag or uniform split itself where those leave the busiest rank less work.
  std::vector<CpSplit> cp_splits = {CpSplit::kMakespan};
  // Micro-batching policies every plan is tried with (sorted, entrain).
  std::vector<MicrobatchPolicy> microbatching = {MicrobatchPolicy::kArrival};
  // Schedules of pipelined homogeneous plans: 1f1b (interleaved_1f1b where vpp > 1) and dip
  // (encoder segments on the LLM's stages, searched per batch; slower to estimate).
  std::vector<Schedule> homogeneous_schedules = {Schedule::k1F1B};
  // Where a module's heads do not divide its TP, the plan is tried with each of these (pad;
  // replicate only in homogeneous plans); empty: such plans are refused.
  std::vector<IndivisibleHeads> indivisible_heads = {IndivisibleHeads::kPad,
                                                     IndivisibleHeads::kReplicate};
  // Colocated plans whose encoders have more replicas than the LLM are tried with each (whole
  // samples per replica, or the samples' media items dealt by work: encoder_data_parallel).
  std::vector<EncoderDataParallel> encoder_data_parallel = {EncoderDataParallel::kSamples,
                                                            EncoderDataParallel::kMedia};
  int64_t top_k = 16;  // best plans by the analytic estimate that get a full simulation
  // Two-stage search: the best `refine.top` plans of the first ranking, and each placement
  // family's best, are estimated again with the costlier techniques — each micro-batching policy
  // listed, DIP (pipelined homogeneous plans of models with encoders), with each policy too, and
  // each CP split listed (plans with cp > 1) — and ranked with the rest.
  struct Refine {
    int64_t top = 16;  // 0: no second stage
    std::vector<MicrobatchPolicy> microbatching = {MicrobatchPolicy::kSorted,
                                                   MicrobatchPolicy::kEntrain};
    bool dip = true;
    std::vector<CpSplit> cp_splits = {CpSplit::kUniform, CpSplit::kZigzag};
    bool operator==(const Refine&) const = default;
  } refine;

  bool operator==(const SearchSpace&) const = default;
};

// The encoder CP a sweep offers where nothing fits with the space's own.
inline const std::vector<int64_t> kEncoderCpFallback = {2, 4, 8};

SearchSpace read_search_space(const Json& json, const std::string& file, const std::string& path,
                              Diagnostics& diag);
Json to_json(const SearchSpace& space);

}  // namespace tessera

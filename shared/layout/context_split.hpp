// Which tokens of a packed sequence each context-parallel rank holds: computed once here, so the
// executor shards tokens the way the lowering charges them (docs/ALGORITHMS.md §2).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shared/layout/parallel_plan.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

// One token of a packed LLM sequence, for the multimodal mask: its sample (in the micro-batch)
// and its media item (micro-batch-wide), or -1 for text.
struct TokenTag {
  int32_t sample = 0;
  int32_t item = -1;
  bool operator==(const TokenTag&) const = default;
};

// The LLM sequence of `samples` packed as the executor packs it: sample after sample, each its
// media first (images, then audio clips, cut at max_seq_len) and then its text.
std::vector<TokenTag> llm_token_tags(const ModelSpec& model, std::span<const Sample* const> samples,
                                     int64_t max_seq_len);

// The keys a query attends under the multimodal mask: a text token every earlier token of its
// sample (causal), a media token every token of its own item (both ways). One interval each.
struct KeySpan {
  int64_t first = 0, last = 0;  // inclusive
};
std::vector<KeySpan> attended_keys(std::span<const TokenTag> tags);

// Token indices per CP rank, each list ascending. kUniform: contiguous, nearly even blocks.
// kZigzag: the sequence cut into 2·cp nearly even chunks, rank i holding chunks i and
// 2·cp−1−i (balances a causal mask). kMakespan (Cornstarch): 128-token query blocks costed by
// their non-empty 128×32 attention tiles plus their linear work (`linear_tiles` tiles per full
// block), dealt longest first to the least-loaded rank (token counts may differ); the zigzag or
// uniform split instead when that leaves the most loaded rank less work (few blocks per rank are
// coarse), and uniform when the sequence has fewer than 128·cp tokens. REQUIRES: cp >= 1.
std::vector<std::vector<int64_t>> context_split(CpSplit policy, std::span<const TokenTag> tags,
                                                int64_t cp, double linear_tiles = 1);
// A full block's linear work in attention tiles for a transformer: the FLOPs of its
// projections and MLP over those of one 128×32 tile of scores and weighted values.
double cp_linear_tiles(const TransformerArch& arch);
// The same by token count only (uniform and zigzag need no more; makespan falls back to
// uniform). REQUIRES: cp >= 1, tokens >= 0.
std::vector<std::vector<int64_t>> context_split(CpSplit policy, int64_t tokens, int64_t cp);

// Longest processing time first: items (by index) in descending cost, each to the bin with the
// least load so far (ties: the lowest bin). Each bin's items ascending. REQUIRES: bins >= 1.
std::vector<std::vector<int64_t>> lpt_assign(const std::vector<double>& costs, int64_t bins);

// (query, key) pairs each CP rank's queries attend: its attention work.
std::vector<double> cp_attention_work(std::span<const TokenTag> tags,
                                      const std::vector<std::vector<int64_t>>& split);

}  // namespace tessera

// Which tokens of a sequence each context-parallel rank holds: computed once here, so the
// executor shards tokens the way the lowering charges them (../shared/ALGORITHMS.md §2).
#pragma once

#include <cstdint>
#include <vector>

#include "shared/parallel_plan.hpp"

namespace tessera {

// Token indices per CP rank, each list ascending. kUniform: contiguous, nearly even blocks.
// kZigzag: the sequence cut into 2·cp nearly even chunks, rank i holding chunks i and
// 2·cp−1−i (balances a causal mask). kMakespan: not yet (token-workload balancing, issue 9):
// uniform. REQUIRES: cp >= 1, tokens >= 0.
std::vector<std::vector<int64_t>> context_split(CpSplit policy, int64_t tokens, int64_t cp);

}  // namespace tessera

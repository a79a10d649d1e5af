// Pipeline schedules as pure tables: the order in which one pipeline stage runs the forward
// and backward of each (micro-batch, chunk). Used by lower(); tested against the textbook.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

struct ScheduleItem {
  int32_t microbatch = 0;
  int32_t chunk = 0;  // virtual pipeline chunk (interleaved 1F1B)
  bool backward = false;
  bool operator==(const ScheduleItem&) const = default;
};

// GPipe: every forward, then every backward (last micro-batch first).
std::vector<ScheduleItem> gpipe_order(int32_t microbatches);
// 1F1B with `warmup` forwards before the steady one-forward-one-backward phase. Standard 1F1B:
// warmup = min(p - stage - 1, m). Graph-aware 1F1B (non-colocated DAGs): warmup =
// min(depth - position - 1, m), position and depth from graph_depths().
std::vector<ScheduleItem> one_f_one_b_order(int32_t microbatches, int32_t warmup);
// Megatron's interleaved 1F1B with `chunks` virtual stages per rank.
// REQUIRES: microbatches % stages == 0.
std::vector<ScheduleItem> interleaved_order(int32_t microbatches, int32_t stages, int32_t stage,
                                            int32_t chunks);
// A stage with no backward (a frozen module with nothing trainable before it): forwards only.
std::vector<ScheduleItem> forward_only_order(int32_t microbatches);

}  // namespace tessera

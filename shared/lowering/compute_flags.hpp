// How a compute op's kernels run under a plan (Op::flags): the one rule the lowering and the
// frozen-aware stage split's pricer share, so that both price the same op alike.
#pragma once

#include <cstdint>

#include "shared/layout/parallel_plan.hpp"
#include "shared/program/program.hpp"

namespace tessera {

// The flags of a compute op of phase `phase` under `plan`, for a module split over `tp` ranks:
// `layers`, whether the op holds transformer layers; `trainable`, whether its module trains;
// `sequence_parallel`, whether its layers run under sequence parallelism
// (sequence_parallel_for()).
// The op's contents (kOpHead, kOpFrontEnd) and its place in a schedule (gradient buckets, fully
// sharded units) are the lowering's to add.
uint32_t compute_op_flags(const ParallelPlan& plan, Phase phase, int64_t tp, bool layers,
                          bool trainable, bool sequence_parallel);

}  // namespace tessera

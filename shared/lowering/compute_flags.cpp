#include "shared/lowering/compute_flags.hpp"

namespace tessera {

uint32_t compute_op_flags(const ParallelPlan& plan, Phase phase, int64_t tp, bool layers,
                          bool trainable, bool sequence_parallel) {
  uint32_t flags = 0;
  if (sequence_parallel && tp > 1) flags |= kOpSequenceParallel;
  if (!plan.flash_attention) flags |= kOpUnfusedAttention;
  if (!plan.fused_kernels) flags |= kOpEagerElementwise;
  if (plan.framework == Framework::kPytorch) flags |= kOpPytorchKernels;
  if (plan.fp8 != Fp8Recipe::kNone && layers) {
    flags |= kOpFp8;
    if (plan.fp8 == Fp8Recipe::kCurrent) flags |= kOpFp8CurrentScaling;
    if (plan.fp8 == Fp8Recipe::kBlockwise) flags |= kOpFp8BlockScaling;
  }
  if (plan.tp_comm_overlap && sequence_parallel && tp > 1) flags |= kOpTpCommOverlap;
  if (plan.moe_dispatcher != MoeDispatcher::kAllToAll && layers) flags |= kOpDeepEpDispatch;
  if (plan.moe_dispatcher == MoeDispatcher::kHybridEp && layers) flags |= kOpHybridEpDispatch;
  if (!plan.moe_permute_fusion && layers) flags |= kOpUnfusedPermute;
  if (plan.recompute == Recompute::kSelective && phase == Phase::kB) {
    const std::pair<RecomputeModule, OpFlag> bits[] = {
        {kRecomputeCoreAttn, kOpAttentionRecompute},
        {kRecomputeLayernorm, kOpLayernormRecompute},
        {kRecomputeMlaUpProj, kOpMlaUpProjRecompute},
        {kRecomputeMoeAct, kOpMoeActRecompute},
        {kRecomputeMlp, kOpMlpRecompute},
        {kRecomputeMoe, kOpMoeRecompute},
        {kRecomputeSharedExperts, kOpSharedExpertRecompute}};
    for (const auto& [m, flag] : bits)
      if ((plan.recompute_modules & m) != 0) flags |= flag;
  }
  if (plan.recompute == Recompute::kPerOp && phase == Phase::kR) flags |= kOpPerOpRecompute;
  // Every schedule runs a trainable module's W right after its B.
  if (plan.tp_backward_overlap && phase == Phase::kB && trainable && tp > 1)
    flags |= kOpTpGradOverlap;
  return flags;
}

}  // namespace tessera

// The optimizer's two passes over every gradient, in as few kernels as the torch at hand allows:
// the global norm's sum of squares and the AdamW step (Loshchilov & Hutter's decoupled weight
// decay, torch's formulation). Under torch 2 each is one multi-tensor kernel (`_foreach_norm`,
// `_fused_adamw_`), as Megatron-LM's and PyTorch's fused optimizers run them; Debian's torch
// 1.13 has neither and takes the per-tensor form. The state lives in a torch::optim::AdamW, so
// checkpoints save and load it the same way on both.
#pragma once

#include <vector>

#include "exec/torch_api.hpp"

namespace tessera::exec {

// Σ weights[i] · ‖grads[i]‖², as a 0-dim fp64 tensor on the gradients' device (read once by the
// caller). Under torch 2 the norms accumulate in fp32; under 1.13 in fp64.
torch::Tensor weighted_squared_norm(const std::vector<torch::Tensor>& grads,
                                    const std::vector<double>& weights);

// One AdamW step of every parameter of `optimizer` that has a gradient, the gradients first
// multiplied by `scale` (the clipping coefficient, ≤ 1).
void adamw_step(torch::optim::AdamW& optimizer, double scale = 1.0);

}  // namespace tessera::exec

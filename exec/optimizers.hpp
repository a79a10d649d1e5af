// One rank's optimizers and the gradients they step. Per module it holds either one AdamW over
// the module's trainable parameters here, or the distributed optimizer's slices (ShardedOptimizer;
// a module's routed experts apart from the rest when EP splits them), never both. Each iteration:
// the gradients start at zero (start_iteration); the Program's data-parallel collectives reduce
// them, some in the background (reduce, sum_over_tp, gather); once every reduction has landed,
// the global gradient norm and the loss are summed over the world (synchronize); then each module
// steps with the clipping coefficient that norm gives (step).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/comm.hpp"
#include "exec/sharded_optimizer.hpp"
#include "exec/stage.hpp"
#include "shared/program/program.hpp"

namespace tessera::exec {

// How many ranks hold copies of a module's gradients, for counting each once in the norm.
struct GradientCopies {
  int64_t dense = 1;           // ranks holding the same shard (data- times context-parallel)
  int64_t experts = 1;         // ranks holding the same routed expert (expert-data-parallel)
  bool experts_split = false;  // routed experts split over EP ranks: reduced and stepped apart
};

struct OptimizerSettings {
  torch::optim::AdamWOptions adamw{1e-3};
  double clip = 1.0;         // global gradient-norm clipping; 0 turns it off
  bool distributed = false;  // the distributed optimizer (ZeRO-1; fully sharded, ZeRO-3)
};

class Optimizers {
 public:
  // `program`: an iteration's Program (every iteration's has the same collectives, so the
  // distributed optimizer's buckets and groups come from the first). `copies`: per module.
  // `stages` outlives this object; its parameters are those stepped.
  Optimizers(Stages& stages, const Program& program, int64_t rank,
             std::vector<GradientCopies> copies, const OptimizerSettings& settings);

  // A new iteration: every trainable gradient zero, nothing reduced, the norm not yet summed.
  void start_iteration();
  // A data-parallel gradient collective of `program` (an all-reduce or reduce-scatter of a bucket
  // or of the whole module; an all-gather goes to gather) over `comm`.
  void reduce(const Program& program, const Op& op, const Comm& comm);
  // Gradients partial on each TP rank, summed over `comm`: key/value heads replicated over TP
  // ranks (kOpKvReplicas), or the weights sequence parallelism applies to each rank's rows
  // (kOpSequencePartial).
  void sum_over_tp(const Op& op, const Comm& comm);
  // The distributed optimizer's all-gather `op` of updated parameters; a bucket's in the
  // background (returned: the ops that depend on it wait for it).
  std::vector<PendingCollective> gather(const Program& program, const Op& op, const Comm& comm);
  // Waits for the reductions in flight; sums the squared gradient norm (each distinct gradient
  // once) and `loss_sum` over `world`. Once per iteration, before any step.
  void synchronize(const torch::Tensor& loss_sum, const Comm& world);
  bool synchronized() const { return synchronized_; }
  // One AdamW step of `module`'s parameters here (none: nothing to do), gradients clipped.
  void step(int module);

  double loss() const { return loss_; }            // the world's loss sum (after synchronize)
  double grad_norm() const { return grad_norm_; }  // before clipping (after synchronize)
  // Bytes of optimizer state held here: AdamW's two fp32 moments of what this rank steps.
  int64_t state_bytes() const;
  void save(torch::serialize::OutputArchive& archive);
  // REQUIRES: `archive` saved by an Optimizers of the same plan and rank (`path` names it in
  // errors).
  void load(torch::serialize::InputArchive& archive, const std::string& path);

 private:
  std::vector<ShardedOptimizer::Bucket> buckets(const Program& p, int module, bool experts,
                                                bool frozen);
  std::vector<torch::Tensor> trainable(int module) const;
  bool experts_split(int module) const {
    return copies_[static_cast<std::size_t>(module)].experts_split;
  }
  Stage& stage(int module, int chunk) const { return find_stage(stages_, module, chunk, rank_); }
  void finish_reductions();

  Stages& stages_;
  int64_t rank_;
  std::vector<GradientCopies> copies_;
  double clip_;
  std::map<int, std::unique_ptr<torch::optim::AdamW>> adamw_;  // per module
  // Per (module, its routed experts): the distributed optimizer's slices.
  std::map<std::pair<int, bool>, std::unique_ptr<ShardedOptimizer>> shards_;
  std::vector<PendingCollective> reductions_;  // gradient buckets being reduced in the background
  bool synchronized_ = false;
  double clip_coefficient_ = 1, loss_ = 0, grad_norm_ = 0;
};

}  // namespace tessera::exec

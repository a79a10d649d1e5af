// The Worker's gradients and optimizers: data-parallel reductions (whole or by bucket, in the
// background), the global norm, AdamW steps and the distributed optimizer's gathers.
#include "exec/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "exec/adamw.hpp"
#include "exec/device.hpp"
#include "exec/worker_internal.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

std::vector<ShardedOptimizer::Bucket> Worker::optimizer_buckets(const Program& p, int module,
                                                                bool experts, bool frozen) {
  const bool split = experts_split(module);
  const auto held = [&](const Param& prm) {
    return (frozen || prm.tensor.requires_grad()) && (!split || prm.expert == experts);
  };
  std::vector<Param*> all;  // the module's trainable parameters on this rank, in order
  for (auto& [key, st] : stages_)
    if (key.first == module)
      for (Param& prm : st->params())
        if (held(prm)) all.push_back(&prm);
  std::vector<ShardedOptimizer::Bucket> buckets;
  // Each parameter belongs to the last bucket reduced that holds it: a tied embedding's
  // gradient is complete only once the bottom piece has run.
  std::map<const Param*, std::size_t> home;
  std::set<std::pair<int64_t, int64_t>> seen;  // (chunk, first layer): a unit's ops recur
  for (const Op& op : p.ranks[static_cast<std::size_t>(rank_)])
    if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp && op.module == module &&
        (op.flags & kOpGradientBucket) != 0 &&
        (op.collective == CollectiveKind::kReduceScatter || (op.flags & kOpFullySharded) != 0) &&
        ((op.flags & kOpRoutedExperts) != 0) == (split && experts) &&
        seen.insert({op.chunk, op.first_layer}).second) {
      for (const Param* prm :
           stage(module, op.chunk).params_of(op.first_layer, op.first_layer + op.layers))
        if (held(*prm)) home[prm] = buckets.size();
      buckets.push_back({op.chunk, op.first_layer, {}, {}});
    }
  if (buckets.empty()) buckets.push_back({});  // the whole module
  for (const Param* prm : all) {
    std::size_t b = 0;
    if (!home.empty()) {
      const auto it = home.find(prm);
      TESSERA_CHECK(it != home.end(), prm->name + " is in no gradient bucket of the Program");
      b = it->second;
    }
    buckets[b].params.push_back(prm->tensor);
    // Elements of TP-replicated parameters exist on every TP rank: they count 1/tp each.
    buckets[b].norm_shares.push_back(1.0 / static_cast<double>(prm->tp_copies));
  }
  return buckets;
}

void Worker::reduce_gradients(const Op& op) {
  TESSERA_CHECK(
      op.purpose == Purpose::kDp,
      op_name(*program_, op) + ": only data-parallel collectives are in the executor so far");
  if (op.collective == CollectiveKind::kAllGather) return gather_parameters(op);
  TESSERA_CHECK(op.collective == CollectiveKind::kAllReduce ||
                    op.collective == CollectiveKind::kReduceScatter,
                op_name(*program_, op) + ": unexpected gradient collective");
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  const bool bucketed = (op.flags & kOpGradientBucket) != 0;
  // Routed experts' gradients are reduced apart, over their own replicas (kOpRoutedExperts).
  const bool experts = (op.flags & kOpRoutedExperts) != 0;
  const bool split = experts_split(op.module);
  const auto reduced_here = [&](const Param& p) {
    return p.tensor.requires_grad() && (!split || p.expert == experts);
  };
  if (op.collective == CollectiveKind::kReduceScatter) {
    // The sharded optimizer: each rank receives the sum of its slices only; a bucket's in the
    // background while the backward goes on.
    for (PendingCollective& r :
         shards_.at({op.module, split && experts})->reduce_scatter(op, comm, bucketed))
      reductions_.push_back(std::move(r));
    return;
  }
  if (bucketed && comm.size() > 1) {
    // One bucket, summed in the background while the backward goes on; the global norm waits.
    std::vector<torch::Tensor> grads, flat;
    for (Param* p :
         stage(op.module, op.chunk).params_of(op.first_layer, op.first_layer + op.layers))
      if (reduced_here(*p)) {
        grads.push_back(p->tensor.mutable_grad());
        flat.push_back(grads.back().reshape({-1}));
      }
    if (flat.empty()) return;
    std::vector<at::Tensor> tensors{to_wire(comm, torch::cat(flat).to(gradient_reduction_dtype()))};
    reductions_.push_back({comm.group->allreduce(tensors), [grads, sum = tensors[0]]() mutable {
                             int64_t at = 0;
                             for (torch::Tensor& g : grads) {
                               g.copy_(sum.narrow(0, at, g.numel()).view_as(g));
                               at += g.numel();
                             }
                           }});
    return;
  }
  std::vector<torch::Tensor> params;
  for (auto& [key, st] : stages_)
    if (key.first == op.module)
      for (const Param& p : st->params())
        if (reduced_here(p)) params.push_back(p.tensor);
  if (params.empty()) return;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) grads.push_back(p.grad().view({-1}));
  torch::Tensor flat = torch::cat(grads).to(gradient_reduction_dtype());
  // Buckets of at most 25 MB, as DDP and Megatron reduce them.
  constexpr int64_t kBucket = 25 * 1000 * 1000 / 4;
  for (int64_t begin = 0; begin < flat.numel(); begin += kBucket) {
    torch::Tensor bucket = flat.narrow(0, begin, std::min(kBucket, flat.numel() - begin));
    all_reduce(comm, bucket);
  }
  int64_t at = 0;
  for (torch::Tensor& p : params) {
    const int64_t n = p.numel();
    p.mutable_grad().copy_(flat.narrow(0, at, n).view_as(p));
    at += n;
  }
}

void Worker::sum_kv_replicas(const Op& op) {
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  std::vector<torch::Tensor> grads, flat;
  const auto collect = [&](Stage& st, int64_t a, int64_t b) {
    for (Param* p : st.params_of(a, b))
      if (p->kv_replica && p->tensor.requires_grad()) {
        grads.push_back(p->tensor.mutable_grad());
        flat.push_back(grads.back().reshape({-1}));
      }
  };
  if ((op.flags & kOpGradientBucket) != 0)
    collect(stage(op.module, op.chunk), op.first_layer, op.first_layer + op.layers);
  else
    for (auto& [key, st] : stages_)
      if (key.first == op.module) collect(*st, st->begin(), st->end());
  if (flat.empty()) return;
  torch::Tensor sum = torch::cat(flat).to(gradient_reduction_dtype());
  all_reduce(comm, sum);
  int64_t at = 0;
  for (torch::Tensor& g : grads) {
    g.copy_(sum.narrow(0, at, g.numel()).view_as(g));
    at += g.numel();
  }
}

void Worker::finish_reductions() {
  for (PendingCollective& r : reductions_) r.finish();
  reductions_.clear();
}

void Worker::synchronize_norm_and_loss() {
  finish_reductions();
  // Each distinct gradient counted once: a shard held by `copies` ranks contributes 1/copies.
  // Summed on the device, read once.
  torch::Tensor norm2 = torch::zeros({}, on_device(torch::kFloat64));
  for (auto& [m, sh] : shards_) norm2 += sh->norm_squared();
  std::vector<torch::Tensor> grads;
  std::vector<double> shares;
  for (auto& [key, st] : stages_) {
    const auto m = static_cast<std::size_t>(key.first);
    if (shards_.count({key.first, false})) continue;
    for (const Param& p : st->params()) {
      if (!p.tensor.requires_grad()) continue;
      grads.push_back(p.tensor.grad());
      shares.push_back(1.0 / static_cast<double>(p.tp_copies * (p.expert ? edp_[m] : dpcp_[m])));
    }
  }
  if (!grads.empty()) norm2 += weighted_squared_norm(grads, shares);
  torch::Tensor t = torch::stack({norm2, loss_sum_});
  all_reduce(groups_.world(), t);
  grad_norm_ = std::sqrt(t[0].item<double>());
  loss_ = t[1].item<double>();
  clip_coefficient_ = options_.clip > 0 ? std::min(1.0, options_.clip / (grad_norm_ + 1e-6)) : 1.0;
  synchronized_ = true;
}

void Worker::optimizer_step(const Op& op) {
  if (!synchronized_) synchronize_norm_and_loss();
  if (const auto shard = shards_.find({op.module, false}); shard != shards_.end()) {
    shard->second->step(clip_coefficient_);
    if (const auto experts = shards_.find({op.module, true}); experts != shards_.end())
      experts->second->step(clip_coefficient_);
    return;
  }
  const auto it = optimizers_.find(op.module);
  if (it == optimizers_.end()) return;
  adamw_step(*it->second, clip_coefficient_);
}

void Worker::gather_parameters(const Op& op) {
  const auto shard =
      shards_.find({op.module, experts_split(op.module) && (op.flags & kOpRoutedExperts) != 0});
  TESSERA_CHECK(shard != shards_.end(), op_name(*program_, op) + ": no sharded optimizer here");
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  // A bucket's gather (overlap_param_gather) runs in the background: the ops that depend on it
  // wait for it.
  const bool bucket = (op.flags & kOpGradientBucket) != 0;
  std::vector<PendingCollective> pending = shard->second->all_gather(op, comm, bucket);
  if (!pending.empty()) gathers_[current_op_] = std::move(pending);
}

void Worker::gather_ahead(const Op& piece) {
  const auto& ops = program_->ranks[static_cast<std::size_t>(rank_)];
  const int32_t running = current_op_;
  for (const int32_t dep : piece.deps) {
    const Op& g = ops[static_cast<std::size_t>(dep)];
    if (dep <= running || (g.flags & kOpFullySharded) == 0 || g.kind != OpKind::kCollective ||
        !gathered_early_.insert(dep).second)
      continue;
    current_op_ = dep;  // its pending gather is keyed by its own op
    gather_parameters(g);
    current_op_ = running;
  }
}

void Worker::await_gathers(const Op& op) {
  for (const int32_t dep : op.deps) {
    const auto it = gathers_.find(dep);
    if (it == gathers_.end()) continue;
    for (PendingCollective& g : it->second) g.finish();
    gathers_.erase(it);
  }
}

}  // namespace tessera::exec

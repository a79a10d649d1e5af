#include "exec/optimizers.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "exec/adamw.hpp"
#include "exec/device.hpp"
#include "shared/base/check.hpp"

namespace tessera::exec {

namespace {

// A distributed optimizer's name in a checkpoint: its module's index, ".experts" for the
// module's routed experts.
std::string shard_name(const std::pair<int, bool>& key) {
  return std::to_string(key.first) + (key.second ? ".experts" : "");
}

}  // namespace

Optimizers::Optimizers(Stages& stages, const Program& p, int64_t rank,
                       std::vector<GradientCopies> copies, const OptimizerSettings& settings)
    : stages_(stages), rank_(rank), copies_(std::move(copies)), clip_(settings.clip) {
  const auto& ops = p.ranks[static_cast<std::size_t>(rank_)];
  for (std::size_t m = 0; m < copies_.size(); ++m) {
    const int module = static_cast<int>(m);
    std::vector<torch::Tensor> params = trainable(module);
    // Fully sharded, a frozen module's weights are sharded too: its units are gathered as the
    // Program says, with nothing to step.
    const bool frozen_sharded =
        params.empty() && std::any_of(ops.begin(), ops.end(), [&](const Op& op) {
          return op.kind == OpKind::kCollective && op.module == module &&
                 (op.flags & kOpFullySharded) != 0;
        });
    if (params.empty() && !frozen_sharded) continue;
    if (!settings.distributed) {
      adamw_[module] = std::make_unique<torch::optim::AdamW>(params, settings.adamw);
      continue;
    }
    // The slices this rank owns among the group of the Program's gradient reduce-scatters: the
    // module's data(-context)-parallel group, and its routed experts' replicas.
    for (const bool experts :
         experts_split(module) ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      int64_t parts = 1, index = 0;
      for (const Op& op : ops)
        if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp && op.module == module &&
            ((op.flags & kOpRoutedExperts) != 0) == experts) {
          const RankList& g = p.groups[static_cast<std::size_t>(op.group)];
          parts = static_cast<int64_t>(g.size());
          index = std::find(g.begin(), g.end(), rank_) - g.begin();
        }
      shards_[{module, experts}] =
          std::make_unique<ShardedOptimizer>(buckets(p, module, experts, frozen_sharded), parts,
                                             index, settings.adamw, frozen_sharded);
    }
  }
}

std::vector<torch::Tensor> Optimizers::trainable(int module) const {
  std::vector<torch::Tensor> out;
  for (auto& [key, st] : stages_)
    if (key.first == module)
      for (const Param& p : st->params())
        if (p.tensor.requires_grad()) out.push_back(p.tensor);
  return out;
}

std::vector<ShardedOptimizer::Bucket> Optimizers::buckets(const Program& p, int module,
                                                          bool experts, bool frozen) {
  const bool split = experts_split(module);
  const auto held = [&](const Param& prm) {
    return (frozen || prm.tensor.requires_grad()) && (!split || prm.expert == experts);
  };
  std::vector<Param*> all;  // the module's parameters this optimizer holds here, in order
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

void Optimizers::start_iteration() {
  TESSERA_CHECK(reductions_.empty(), "gradient reductions left over from the last iteration");
  for (auto& [m, sh] : shards_) sh->start_iteration();
  // Gradients start at zero every iteration, so every plan steps every parameter.
  for (auto& [key, st] : stages_)
    for (Param& prm : st->params())
      if (prm.tensor.requires_grad()) prm.tensor.mutable_grad() = torch::zeros_like(prm.tensor);
  synchronized_ = false;
}

void Optimizers::reduce(const Program& program, const Op& op, const Comm& comm) {
  TESSERA_CHECK(op.collective == CollectiveKind::kAllReduce ||
                    op.collective == CollectiveKind::kReduceScatter,
                op_name(program, op) + ": unexpected gradient collective");
  TESSERA_CHECK(!synchronized_, op_name(program, op) + ": a gradient reduced after the norm");
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
    const auto shard = shards_.find({op.module, split && experts});
    TESSERA_CHECK(shard != shards_.end(),
                  op_name(program, op) + ": no distributed optimizer for it here");
    for (PendingCollective& r : shard->second->reduce_scatter(op, comm, bucketed))
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

void Optimizers::sum_over_tp(const Op& op, const Comm& comm) {
  std::vector<torch::Tensor> grads, flat;
  const bool kv = (op.flags & kOpKvReplicas) != 0;
  const auto collect = [&](Stage& st, int64_t a, int64_t b) {
    for (Param* p : st.params_of(a, b))
      if ((kv ? p->kv_replica : p->sequence_partial) && p->tensor.requires_grad()) {
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

std::vector<PendingCollective> Optimizers::gather(const Program& program, const Op& op,
                                                  const Comm& comm) {
  const auto shard =
      shards_.find({op.module, experts_split(op.module) && (op.flags & kOpRoutedExperts) != 0});
  TESSERA_CHECK(shard != shards_.end(), op_name(program, op) + ": no sharded optimizer here");
  return shard->second->all_gather(op, comm, (op.flags & kOpGradientBucket) != 0);
}

void Optimizers::finish_reductions() {
  for (PendingCollective& r : reductions_) r.finish();
  reductions_.clear();
}

void Optimizers::synchronize(const torch::Tensor& loss_sum, const Comm& world) {
  TESSERA_CHECK(!synchronized_, "the gradient norm summed twice in one iteration");
  finish_reductions();
  // Each distinct gradient counted once: a shard held by `copies` ranks contributes 1/copies.
  // Summed on the device, read once.
  torch::Tensor norm2 = torch::zeros({}, on_device(torch::kFloat64));
  for (auto& [m, sh] : shards_) norm2 += sh->norm_squared();
  std::vector<torch::Tensor> grads;
  std::vector<double> shares;
  for (auto& [key, st] : stages_) {
    if (shards_.count({key.first, false})) continue;
    const GradientCopies& c = copies_[static_cast<std::size_t>(key.first)];
    for (const Param& p : st->params()) {
      if (!p.tensor.requires_grad()) continue;
      grads.push_back(p.tensor.grad());
      shares.push_back(1.0 / static_cast<double>(p.tp_copies * (p.expert ? c.experts : c.dense)));
    }
  }
  if (!grads.empty()) norm2 += weighted_squared_norm(grads, shares);
  torch::Tensor t = torch::stack({norm2, loss_sum});
  all_reduce(world, t);
  grad_norm_ = std::sqrt(t[0].item<double>());
  loss_ = t[1].item<double>();
  clip_coefficient_ = clip_ > 0 ? std::min(1.0, clip_ / (grad_norm_ + 1e-6)) : 1.0;
  synchronized_ = true;
}

void Optimizers::step(int module) {
  TESSERA_CHECK(synchronized_, "an optimizer step before the gradient norm was summed");
  if (const auto shard = shards_.find({module, false}); shard != shards_.end()) {
    shard->second->step(clip_coefficient_);
    if (const auto experts = shards_.find({module, true}); experts != shards_.end())
      experts->second->step(clip_coefficient_);
    return;
  }
  const auto it = adamw_.find(module);
  if (it == adamw_.end()) return;
  adamw_step(*it->second, clip_coefficient_);
}

int64_t Optimizers::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& [m, opt] : adamw_)
    for (const auto& group : opt->param_groups())
      for (const torch::Tensor& t : group.params()) bytes += t.numel() * 4 * 2;
  for (const auto& [m, sh] : shards_) bytes += sh->master().numel() * 4 * 2;
  return bytes;
}

void Optimizers::save(torch::serialize::OutputArchive& archive) {
  for (auto& [m, opt] : adamw_) {
    torch::serialize::OutputArchive sub;
    opt->save(sub);
    archive.write("optimizer/" + std::to_string(m), sub);
  }
  // The distributed optimizer's slices hold the latest parameters (with overlap_param_gather
  // the parameters are gathered from them only as the next step begins).
  for (auto& [key, sh] : shards_) {
    torch::serialize::OutputArchive sub;
    sh->adam().save(sub);
    archive.write("optimizer/" + shard_name(key), sub);
    archive.write("shard/" + shard_name(key), sh->master().detach());
  }
}

void Optimizers::load(torch::serialize::InputArchive& archive, const std::string& path) {
  torch::NoGradGuard no_grad;
  for (auto& [m, opt] : adamw_) {
    torch::serialize::InputArchive sub;
    archive.read("optimizer/" + std::to_string(m), sub);
    opt->load(sub);
  }
  for (auto& [key, sh] : shards_) {
    torch::serialize::InputArchive sub;
    archive.read("optimizer/" + shard_name(key), sub);
    sh->adam().load(sub);
    torch::Tensor master;
    archive.read("shard/" + shard_name(key), master);
    TESSERA_CHECK(
        master.sizes() == sh->master().sizes(),
        path + ": the distributed optimizer's slice " + shard_name(key) + " has another shape");
    sh->master().detach().copy_(master);
  }
}

}  // namespace tessera::exec

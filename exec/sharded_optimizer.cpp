#include "exec/sharded_optimizer.hpp"

#include <algorithm>

#include "exec/adamw.hpp"
#include "exec/device.hpp"
#include "shared/base/check.hpp"

namespace tessera::exec {

namespace {

torch::Tensor flattened(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& t : tensors) flat.push_back(t.detach().reshape({-1}));
  return torch::cat(flat);
}

// Writes `values` (at least as long as the tensors together) into `tensors`, in order; untracked:
// through their data, without bumping their autograd versions.
void scatter_into(std::vector<torch::Tensor>& tensors, const torch::Tensor& values,
                  bool untracked = false) {
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (torch::Tensor& t : tensors) {
    const torch::Tensor part = values.narrow(0, at, t.numel()).view_as(t);
    if (untracked)
      t.data().copy_(part);
    else
      t.copy_(part);
    at += t.numel();
  }
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(std::vector<Bucket> buckets, int64_t parts, int64_t index,
                                   const torch::optim::AdamWOptions& options, bool frozen)
    : buckets_(std::move(buckets)), parts_(parts), index_(index), frozen_(frozen) {
  std::vector<torch::Tensor> master, weights;
  int64_t offset = 0;
  for (const Bucket& b : buckets_) {
    Slice s;
    for (const torch::Tensor& t : b.params) s.numel += t.numel();
    s.size = (s.numel + parts_ - 1) / parts_;
    s.offset = offset;
    offset += s.size;
    slices_.push_back(s);
    // This rank's slice of the bucket, zero past its end.
    const int64_t begin = index_ * s.size;
    const int64_t n = std::max<int64_t>(0, std::min(s.size, s.numel - begin));
    torch::Tensor slice = torch::zeros({s.size}, on_device()),
                  weight = torch::zeros({s.size}, on_device());
    std::vector<torch::Tensor> shares;
    for (std::size_t i = 0; i < b.params.size(); ++i)
      shares.push_back(torch::full({b.params[i].numel()}, b.norm_shares.at(i), on_device()));
    if (n > 0) {
      slice.narrow(0, 0, n).copy_(flattened(b.params).narrow(0, begin, n));
      weight.narrow(0, 0, n).copy_(torch::cat(shares).narrow(0, begin, n));
    }
    master.push_back(slice);
    weights.push_back(weight);
  }
  master_ = torch::cat(master);
  norm_weight_ = torch::cat(weights);
  master_.set_requires_grad(true);
  adam_ = std::make_unique<torch::optim::AdamW>(std::vector<torch::Tensor>{master_}, options);
}

std::vector<std::size_t> ShardedOptimizer::selected(const Op& op) const {
  std::vector<std::size_t> out;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if ((op.flags & kOpGradientBucket) == 0 ||
        (buckets_[b].chunk == op.chunk && buckets_[b].first_layer == op.first_layer))
      out.push_back(b);
  TESSERA_CHECK(!out.empty(), "no parameters of bucket L" + std::to_string(op.first_layer) +
                                  " of chunk " + std::to_string(op.chunk) + " on this rank");
  return out;
}

torch::Tensor ShardedOptimizer::padded_gradients(std::size_t b) const {
  const Slice& s = slices_[b];
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& t : buckets_[b].params) grads.push_back(t.grad());
  torch::Tensor flat = torch::zeros({s.size * parts_}, on_device());
  flat.narrow(0, 0, s.numel).copy_(flattened(grads));
  return flat;
}

std::vector<PendingCollective> ShardedOptimizer::reduce_scatter(const Op& op, const Comm& comm,
                                                                bool background) {
  if (!grad_.defined()) grad_ = torch::zeros_like(master_);
  const bool accumulate = (op.flags & kOpFullySharded) != 0;
  // The slice's sum lands in `into`: stored, or (a unit's, every micro-batch) added.
  const auto land = [accumulate](torch::Tensor into, const torch::Tensor& sum) {
    if (accumulate)
      into.add_(sum);
    else
      into.copy_(sum);
  };
  std::vector<PendingCollective> pending;
  for (const std::size_t b : selected(op)) {
    const Slice s = slices_[b];
    torch::Tensor into = grad_.narrow(0, s.offset, s.size);
    const torch::Tensor padded = padded_gradients(b).to(gradient_reduction_dtype());
    if (accumulate)  // the next micro-batch's backward starts from zero
      for (torch::Tensor& t : buckets_[b].params) t.mutable_grad().zero_();
    if (!background || comm.size() < 2) {
      land(into, exec::reduce_scatter(comm, padded));
      continue;
    }
    torch::Tensor flat = to_wire(comm, padded);
    if (comm.group->getBackendName() == "gloo") {
      // Gloo (torch 1.13) has no reduce-scatter: the whole bucket is summed, this rank keeps
      // its slice.
      std::vector<at::Tensor> tensors{flat};
      const int64_t begin = index_ * s.size;
      pending.push_back(
          {comm.group->allreduce(tensors), [flat, into, begin, size = s.size, land]() mutable {
             land(into, flat.narrow(0, begin, size));
           }});
      continue;
    }
    std::vector<std::vector<at::Tensor>> in(1);
    for (int64_t i = 0; i < parts_; ++i) in[0].push_back(flat.narrow(0, i * s.size, s.size));
    std::vector<at::Tensor> out{torch::empty({s.size}, flat.options())};
    pending.push_back(
        {comm.group->reduce_scatter(out, in), [out, into, land]() mutable { land(into, out[0]); }});
  }
  return pending;
}

const torch::Tensor& ShardedOptimizer::gradient() {
  if (!grad_.defined()) {
    // Nothing was reduced (a group of one): this rank's slices of the local gradients.
    grad_ = torch::zeros_like(master_);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const Slice& s = slices_[b];
      grad_.narrow(0, s.offset, s.size)
          .copy_(padded_gradients(b).narrow(0, index_ * s.size, s.size));
    }
  }
  return grad_;
}

double ShardedOptimizer::norm_squared() {
  if (frozen_) return 0;  // a frozen module's weights: no gradient
  // Reduced slices are disjoint within the group; TP-replicated elements count 1/tp.
  return (gradient().to(torch::kFloat64).pow(2) * norm_weight_).sum().item<double>();
}

void ShardedOptimizer::step(double clip) {
  master_.mutable_grad() = gradient();
  adamw_step(*adam_, clip);
  if (parts_ > 1) return;  // the all-gather writes the parameters
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    scatter_into(buckets_[b].params, master_.narrow(0, slices_[b].offset, slices_[b].size));
}

std::vector<PendingCollective> ShardedOptimizer::all_gather(const Op& op, const Comm& comm,
                                                            bool background) {
  std::vector<PendingCollective> pending;
  const bool untracked = (op.flags & kOpFullySharded) != 0;
  for (const std::size_t b : selected(op)) {
    const Slice s = slices_[b];
    const torch::Tensor mine = master_.narrow(0, s.offset, s.size).detach().contiguous();
    const torch::Tensor wired = to_wire(comm, mine);
    std::vector<torch::Tensor> params = buckets_[b].params;  // handles of the same tensors
    if (!background || comm.size() < 2) {
      const std::vector<int64_t> rows(static_cast<std::size_t>(comm.size()), s.size);
      scatter_into(params, all_gather_rows(comm, mine, rows), untracked);
      continue;
    }
    std::vector<std::vector<at::Tensor>> out(1);
    for (int i = 0; i < comm.size(); ++i) out[0].push_back(torch::empty({s.size}, wired.options()));
    std::vector<at::Tensor> in{wired};
    auto work = comm.group->allgather(out, in);
    pending.push_back({work, [out, params, untracked]() mutable {
                         scatter_into(params, torch::cat(out[0]), untracked);
                       }});
  }
  return pending;
}

}  // namespace tessera::exec

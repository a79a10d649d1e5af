// The distributed optimizer (ZeRO-1 in Megatron-LM's layout) of one module on one rank: the
// module's data(-context)-parallel group shares its AdamW state, each rank keeping the fp32 master
// copy and moments of one slice of every bucket of parameters. A bucket is one of the Program's
// gradient buckets (overlap_grad_reduce), or the whole module when its gradients are reduced at
// once. A bucket's gradients are reduce-scattered into the slices, each rank steps its slice, and
// the slices are all-gathered back into the parameters. Fully sharded (ZeRO-3), a bucket is a unit:
// its parameters are gathered before each use, and its gradients reduce-scattered after every
// micro-batch's backward, accumulating in the slice; a frozen module's weights are sharded the
// same way, with nothing to step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/comm.hpp"
#include "shared/program/program.hpp"

namespace tessera::exec {

// A collective running in the background, and what to do with its result once it has finished.
struct PendingCollective {
  c10::intrusive_ptr<c10d::Work> work;
  std::function<void()> done;
  void finish() {
    work->wait();
    done();
  }
};

class ShardedOptimizer {
 public:
  struct Bucket {
    int64_t chunk = -1, first_layer = -1;  // the gradient bucket's; -1: the whole module
    std::vector<torch::Tensor> params;     // in a fixed order, the same on every rank
    std::vector<double> norm_shares;       // per parameter: 1 / the TP ranks holding a copy
  };
  // `parts` ranks share the state; this rank's index among them is `index`.
  ShardedOptimizer(std::vector<Bucket> buckets, int64_t parts, int64_t index,
                   const torch::optim::AdamWOptions& options, bool frozen = false);

  // A new iteration: no gradient reduced yet.
  void start_iteration() { grad_ = torch::Tensor(); }
  // The data-parallel reduce-scatter `op` (of one bucket, or of every bucket when it is not a
  // bucket's): each bucket's gradients summed over `comm` into this rank's slice. In the
  // background when `background` (returned; its finish() stores the slice), else at once. A fully
  // sharded unit's (kOpFullySharded) adds to the slice and zeroes the local gradients it took.
  std::vector<PendingCollective> reduce_scatter(const Op& op, const Comm& comm, bool background);
  // This slice's contribution to the squared global gradient norm (each element weighted by its
  // norm share). With no reduce-scatter (a group of one) the local gradients are the sums.
  double norm_squared();
  // One AdamW step of this rank's slice with its gradient times `clip`. A group of one writes the
  // result to the parameters at once; otherwise the all-gather does.
  void step(double clip);
  // The all-gather `op` (one bucket's, or every bucket's): each bucket's parameters from the
  // group's slices. In the background when `background`. A fully sharded unit's gather writes
  // values the parameters already hold within a step, so it leaves their autograd versions alone
  // (a forward of a later micro-batch gathers while earlier ones wait for their backward).
  std::vector<PendingCollective> all_gather(const Op& op, const Comm& comm, bool background);

  int64_t parts() const { return parts_; }
  torch::Tensor& master() { return master_; }
  torch::optim::AdamW& adam() { return *adam_; }

 private:
  struct Slice {
    int64_t numel = 0;   // the bucket's elements
    int64_t size = 0;    // one rank's slice: numel padded to `parts` equal slices
    int64_t offset = 0;  // where this rank's slice lies in master_
  };
  std::vector<std::size_t> selected(const Op& op) const;  // the buckets `op` covers
  torch::Tensor padded_gradients(std::size_t b) const;    // (size * parts)
  const torch::Tensor& gradient();                        // (this rank's slices)

  std::vector<Bucket> buckets_;
  std::vector<Slice> slices_;
  int64_t parts_ = 1, index_ = 0;
  bool frozen_ = false;
  torch::Tensor master_;       // fp32 master copy of this rank's slices, bucket after bucket
  torch::Tensor grad_;         // their reduced gradient
  torch::Tensor norm_weight_;  // each element's norm share
  std::unique_ptr<torch::optim::AdamW> adam_;
};

}  // namespace tessera::exec

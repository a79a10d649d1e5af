// The Worker's gradient and parameter collectives: each handed to this rank's Optimizers, and the
// distributed optimizer's parameter gathers in the background, which the ops that use their
// parameters wait for.
#include "exec/runtime.hpp"

#include "shared/base/check.hpp"
#include "shared/lowering/lower.hpp"

namespace tessera::exec {

void Worker::gradient_collective(const Op& op) {
  if (op.purpose == Purpose::kNorm) return optimizers_->synchronize(loss_sum_, groups_.world());
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  if (op.purpose == Purpose::kTp && (op.flags & (kOpKvReplicas | kOpSequencePartial)) != 0)
    return optimizers_->sum_over_tp(op, comm);
  TESSERA_CHECK(
      op.purpose == Purpose::kDp,
      op_name(*program_, op) + ": only data-parallel collectives are in the executor so far");
  if (op.collective == CollectiveKind::kAllGather) return gather_parameters(op);
  optimizers_->reduce(*program_, op, comm);
}

void Worker::gather_parameters(const Op& op) {
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  // A bucket's gather (overlap_param_gather) runs in the background: the ops that depend on it
  // wait for it.
  std::vector<PendingCollective> pending = optimizers_->gather(*program_, op, comm);
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

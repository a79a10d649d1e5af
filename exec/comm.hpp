// Process groups of one worker and the autograd-aware collectives the parallel layers use.
// A group is named by its global ranks (as in Program::groups and rank_groups()); a group of one
// rank has no process group and every collective on it is the identity.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "exec/torch_compat.hpp"
#include "shared/program/program.hpp"

namespace tessera::exec {

// Collectives run on this thread while a record is installed are appended to it (steady-clock
// seconds), so the trace can show them inside the op that ran them.
struct CommRecord {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double start_s = 0, finish_s = 0;
  double bytes = 0;
};
void record_collectives(std::vector<CommRecord>* into);  // nullptr stops recording

struct Comm {
  std::vector<int64_t> ranks;                 // global ranks, in group order
  int rank = 0;                               // this worker's index in `ranks`
  c10::intrusive_ptr<CollectiveGroup> group;  // null for a group of one
  int size() const { return static_cast<int>(ranks.size()); }
};

class Groups {
 public:
  // `loopback`: every rank on this host (bind 127.0.0.1); else the interface that reaches the
  // master.
  Groups(c10::intrusive_ptr<c10d::Store> store, int world_rank, int world_size,
         std::chrono::milliseconds timeout, bool loopback);
  // Creates the process groups of `groups` that contain this rank. Every worker must pass the
  // same list (in the same order): group creation is a rendezvous among the members.
  void create(const std::vector<std::vector<int64_t>>& groups);
  // REQUIRES: created (or a group of one, or the world).
  const Comm& get(const std::vector<int64_t>& ranks) const;
  const Comm& world() const { return *world_; }
  int world_rank() const { return world_->rank; }

 private:
  c10::intrusive_ptr<CollectiveGroup> make(const std::vector<int64_t>& ranks, int rank);

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  bool loopback_;
  std::unique_ptr<Comm> world_;
  std::map<std::vector<int64_t>, std::unique_ptr<Comm>> groups_;
};

// Blocking collectives (no autograd).
void all_reduce(const Comm& comm, torch::Tensor& t, c10d::ReduceOp op = c10d::ReduceOp::SUM);
// Concatenates every member's `t` along dim 0; members may hold different row counts, given in
// `rows` (every member passes the same `rows`).
torch::Tensor all_gather_rows(const Comm& comm, const torch::Tensor& t,
                              const std::vector<int64_t>& rows);

// Broadcasts `t` from member `root` to every member (in place).
void broadcast(const Comm& comm, torch::Tensor& t, int root = 0);

// Sums `t` (members' equal-sized tensors, a multiple of the group size long) over the group and
// returns this member's contiguous 1/size of the sum.
torch::Tensor reduce_scatter(const Comm& comm, const torch::Tensor& t);

// Sends rows [Σ send_rows[<i], + send_rows[i]) of `t` to member i and returns the rows received,
// member by member: recv_rows[i] from member i (what member i sends this one).
torch::Tensor all_to_all_rows(const Comm& comm, const torch::Tensor& t,
                              const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows);

// Autograd-aware (Megatron's f and g): identity forward / all-reduce backward, and the reverse.
torch::Tensor copy_to_group(const torch::Tensor& x, const Comm& comm);
torch::Tensor reduce_from_group(const torch::Tensor& x, const Comm& comm);
// all_gather_rows forward; backward sums the gradient over the members and keeps this member's
// rows (a reduce-scatter).
torch::Tensor gather_rows(const torch::Tensor& x, const Comm& comm,
                          const std::vector<int64_t>& rows);
// all_to_all_rows forward; backward sends each row's gradient back where the row came from.
torch::Tensor exchange_rows(const torch::Tensor& x, const Comm& comm,
                            const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows);

}  // namespace tessera::exec

// Process groups of one worker and the autograd-aware collectives the parallel layers use.
// A group is named by its global ranks (as in Program::groups and rank_groups()); a group of one
// rank has no process group and every collective on it is the identity.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include "exec/torch_api.hpp"

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
  // Where the group's tensors must be: the CPU for Gloo (which then carries GPU tensors through
  // host memory: several ranks sharing one GPU), the rank's GPU for NCCL.
  torch::Device wire{torch::kCPU};
  int size() const { return static_cast<int>(ranks.size()); }
};

// How a job's ranks talk: Gloo (any device), or NCCL (one GPU per rank).
enum class Transport { kGloo, kNccl };

// `t` as `comm` takes it (itself when it is so already): on the group's device, and for Gloo
// bf16 widened to fp32 (Gloo of torch 1.13 reduces no bf16; widening is exact). The collectives
// below move their tensors so, and back to the caller's device and dtype after.
torch::Tensor to_wire(const Comm& comm, const torch::Tensor& t);
torch::TensorOptions wire_options(const Comm& comm, const torch::Tensor& t);

class Groups {
 public:
  // `loopback`: every rank on this host (bind 127.0.0.1); else the interface that reaches the
  // master. kNccl: every group but the host group is NCCL's, on this process's device.
  Groups(c10::intrusive_ptr<c10d::Store> store, int world_rank, int world_size,
         std::chrono::milliseconds timeout, bool loopback, Transport transport = Transport::kGloo);
  // Creates the process groups of `groups` that contain this rank. Every worker must pass the
  // same list (in the same order): group creation is a rendezvous among the members.
  void create(const std::vector<std::vector<int64_t>>& groups);
  // REQUIRES: created (or a group of one, or the world).
  const Comm& get(const std::vector<int64_t>& ranks) const;
  const Comm& world() const { return *world_; }
  // Where messages from rank `from` to rank `to` travel: the world under Gloo (tags keep them
  // apart), or under NCCL a two-rank group of that direction alone, made when first asked for
  // (NCCL makes its communicators lazily): each direction queues on its own stream, so a send
  // waiting for its receive never holds up a receive the other way (1F1B's crossing messages).
  const Comm& channel(int from, int to);
  // The world over Gloo, for the small host-side exchanges (metrics, flags, checkpoints): the
  // world itself unless the transport is NCCL.
  const Comm& host() const { return host_ ? *host_ : *world_; }
  int world_rank() const { return world_->rank; }

 private:
  // `kind` names the group in the store: a channel's two ranks differ from their group's.
  std::unique_ptr<Comm> make(const std::vector<int64_t>& ranks, int rank, Transport transport,
                             const std::string& kind = "group");

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  bool loopback_;
  Transport transport_;
  std::unique_ptr<Comm> world_, host_;
  std::map<std::vector<int64_t>, std::unique_ptr<Comm>> groups_;
  std::map<std::pair<int, int>, std::unique_ptr<Comm>> channels_;
};

// Point to point over `comm` (a Groups::channel) with the global rank `peer`: a send in flight
// (the tensor it reads held with it), and a blocking receive into `t`. Program tags are 64-bit;
// both ends fold them alike into the int a process group takes (NCCL ignores it: a pair's
// messages arrive in the order they were sent, which SendOrder makes the receiver's).
struct PendingSend {
  c10::intrusive_ptr<c10d::Work> work;
  torch::Tensor tensor;
};
PendingSend send(const Comm& comm, const torch::Tensor& t, int peer, int64_t tag);
void recv(const Comm& comm, torch::Tensor& t, int peer, int64_t tag);

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
// Sums `t` (every member's the same shape, sum(rows) rows) over the group and returns this
// member's rows of the sum: rows[i] for member i, in member order.
torch::Tensor reduce_scatter_rows(const Comm& comm, const torch::Tensor& t,
                                  const std::vector<int64_t>& rows);

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
// Sequence parallelism (Megatron-LM's), `rows[i]` the tokens member i holds between the layers:
// this member's rows of x, whole on every member (forward), its gradient all-gathered
// (backward).
torch::Tensor scatter_rows(const torch::Tensor& x, const Comm& comm,
                           const std::vector<int64_t>& rows);
// reduce_scatter_rows of partial sums (forward), the gradient all-gathered (backward): a
// row-parallel linear's output, a vocabulary-parallel embedding's.
torch::Tensor reduce_scatter_to_rows(const torch::Tensor& x, const Comm& comm,
                                     const std::vector<int64_t>& rows);
// Column-parallel linears sharing one input held in rows (one to three: Q, K, V; gate, up; the
// LM head): the input all-gathered once, each output x·wᵢᵀ + bᵢ of every row (forward); in the
// backward the input gathered again for the weights' gradients and the input's gradient, summed
// over the linears, reduce-scattered to its rows, as Megatron-LM's linears do. `weights` in the
// input's dtype, (out, in); `biases` undefined where a linear has none.
std::vector<torch::Tensor> gathered_linears(const torch::Tensor& x, const Comm& comm,
                                            const std::vector<int64_t>& rows,
                                            const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases);
// `total` rows dealt to `parts` members, the first total % parts one more.
std::vector<int64_t> sequence_rows(int64_t total, int64_t parts);
// all_to_all_rows forward; backward sends each row's gradient back where the row came from.
torch::Tensor exchange_rows(const torch::Tensor& x, const Comm& comm,
                            const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows);

}  // namespace tessera::exec

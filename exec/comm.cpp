#include "exec/comm.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "exec/cuda.hpp"
#include "exec/device.hpp"
#include "shared/base/check.hpp"

namespace tessera::exec {

Groups::Groups(c10::intrusive_ptr<c10d::Store> store, int world_rank, int world_size,
               std::chrono::milliseconds timeout, bool loopback, Transport transport)
    : store_(std::move(store)), timeout_(timeout), loopback_(loopback), transport_(transport) {
  std::vector<int64_t> everyone;
  for (int r = 0; r < world_size; ++r) everyone.push_back(r);
  world_ = make(everyone, world_rank, transport);
  if (transport != Transport::kGloo) host_ = make(everyone, world_rank, Transport::kGloo);
}

const Comm& Groups::channel(int from, int to) {
  if (transport_ != Transport::kNccl) return *world_;
  auto& c = channels_[{from, to}];
  if (!c) c = make({from, to}, world_->rank == from ? 0 : 1, transport_, "channel");
  return *c;
}

std::unique_ptr<Comm> Groups::make(const std::vector<int64_t>& ranks, int rank, Transport transport,
                                   const std::string& kind) {
  auto comm = std::make_unique<Comm>();
  comm->ranks = ranks;
  comm->rank = rank;
  if (ranks.size() < 2) return comm;
  std::string name = transport == Transport::kNccl ? "nccl-" + kind : kind;
  for (int64_t r : ranks) name += "." + std::to_string(r);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name + "/", store_);
  const int size = static_cast<int>(ranks.size());
  if (transport == Transport::kNccl) {
    comm->group = make_nccl_group(prefixed, rank, size, timeout_);
    comm->wire = device_setting().device;
    return comm;
  }
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->timeout = timeout_;
  options->devices.push_back(loopback_
                                 ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                 : c10d::ProcessGroupGloo::createDefaultDevice());
  comm->group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
  return comm;
}

torch::TensorOptions wire_options(const Comm& comm, const torch::Tensor& t) {
  const bool widen = comm.wire.is_cpu() && t.scalar_type() == torch::kBFloat16;
  return t.options().device(comm.wire).dtype(widen ? torch::kFloat32 : t.scalar_type());
}

torch::Tensor to_wire(const Comm& comm, const torch::Tensor& t) {
  const auto options = wire_options(comm, t);
  return t.device() == options.device() && t.scalar_type() == options.dtype() ? t : t.to(options);
}

namespace {
// TESSERA_P2P_IN_ORDER=1 sends every message with one tag, so that Gloo too matches a pair's
// messages in order, as NCCL does: the executor tests run so to check SendOrder on the CPU.
int fold_tag(int64_t tag) {
  static const bool in_order = [] {
    const char* v = std::getenv("TESSERA_P2P_IN_ORDER");
    return v != nullptr && std::string(v) == "1";
  }();
  if (in_order) return 0;
  return static_cast<int>((static_cast<uint64_t>(tag) ^ (static_cast<uint64_t>(tag) >> 31)) &
                          0x7fffffffULL);
}

// `peer`'s index in `comm`.
int member(const Comm& comm, int peer) {
  const auto it = std::find(comm.ranks.begin(), comm.ranks.end(), peer);
  TESSERA_CHECK(it != comm.ranks.end(), "rank " + std::to_string(peer) + " is not in the channel");
  return static_cast<int>(it - comm.ranks.begin());
}
}  // namespace

PendingSend send(const Comm& comm, const torch::Tensor& t, int peer, int64_t tag) {
  std::vector<at::Tensor> tensors{to_wire(comm, t.contiguous())};
  return {comm.group->send(tensors, member(comm, peer), fold_tag(tag)), tensors[0]};
}

void recv(const Comm& comm, torch::Tensor& t, int peer, int64_t tag) {
  std::vector<at::Tensor> tensors{to_wire(comm, t)};
  comm.group->recv(tensors, member(comm, peer), fold_tag(tag))->wait();
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

void Groups::create(const std::vector<std::vector<int64_t>>& groups) {
  for (const auto& ranks : groups) {
    if (ranks.size() < 2 || groups_.count(ranks) || ranks == world_->ranks) continue;
    const auto me = std::find(ranks.begin(), ranks.end(), world_->rank);
    if (me == ranks.end()) continue;
    groups_.emplace(ranks, make(ranks, static_cast<int>(me - ranks.begin()), transport_));
  }
}

const Comm& Groups::get(const std::vector<int64_t>& ranks) const {
  if (ranks == world_->ranks) return *world_;
  if (const auto it = groups_.find(ranks); it != groups_.end()) return *it->second;
  TESSERA_CHECK(ranks.size() == 1 && ranks.front() == world_->rank,
                "a process group this rank is not part of, or that was never created");
  static thread_local Comm alone;
  alone.ranks = ranks;
  alone.rank = 0;
  return alone;
}

namespace {

thread_local std::vector<CommRecord>* recording = nullptr;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// When a collective starts (0 when nothing records).
double start_s() {
  return recording != nullptr ? now_s() : 0;
}

// Waits for a collective's work; with a record installed, appends what it was and how long it
// took.
void wait_recorded(const c10::intrusive_ptr<c10d::Work>& work, CollectiveKind kind, double bytes,
                   double start) {
  work->wait();
  if (recording != nullptr) recording->push_back({kind, start, now_s(), bytes});
}

}  // namespace

void record_collectives(std::vector<CommRecord>* into) {
  recording = into;
}

namespace {

// Sums `t` over the group in place, recorded as `as` with t's size: an all-reduce standing for
// a reduce-scatter where the backend has none.
void sum_recorded_as(const Comm& comm, torch::Tensor& t, CollectiveKind as) {
  std::vector<at::Tensor> tensors{to_wire(comm, t)};
  const double start = start_s();
  wait_recorded(comm.group->allreduce(tensors, c10d::AllreduceOptions()), as,
                static_cast<double>(t.numel() * t.element_size()), start);
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

// Where this member's rows start: rows[i] for member i, in member order.
int64_t first_row(const Comm& comm, const std::vector<int64_t>& rows) {
  int64_t begin = 0;
  for (int i = 0; i < comm.rank; ++i) begin += rows[static_cast<std::size_t>(i)];
  return begin;
}

}  // namespace

void all_reduce(const Comm& comm, torch::Tensor& t, c10d::ReduceOp op) {
  if (comm.size() < 2) return;
  std::vector<at::Tensor> tensors{to_wire(comm, t)};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  const double start = start_s();
  wait_recorded(comm.group->allreduce(tensors, options), CollectiveKind::kAllReduce,
                static_cast<double>(t.numel() * t.element_size()), start);
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

torch::Tensor all_gather_rows(const Comm& comm, const torch::Tensor& t,
                              const std::vector<int64_t>& rows) {
  if (comm.size() < 2) return t;
  const int64_t most = *std::max_element(rows.begin(), rows.end());
  std::vector<int64_t> shape = t.sizes().vec();
  if (most == 0) return t.narrow(0, 0, 0).clone();  // nothing anywhere (every member knows)
  shape[0] = most;
  const auto options = wire_options(comm, t);
  torch::Tensor padded = torch::zeros(shape, options);
  padded.narrow(0, 0, t.size(0)).copy_(t);
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < comm.size(); ++i) out[0].push_back(torch::empty(shape, options));
  std::vector<at::Tensor> in{padded};
  // Recorded as the Program sizes an all-gather (NCCL-tests' size): the gathered rows, in the
  // caller's dtype (Gloo may widen them on the wire).
  int64_t gathered = 0;
  for (const int64_t r : rows) gathered += r;
  const int64_t row_values = t.size(0) > 0 ? t.numel() / t.size(0) : padded.numel() / most;
  const double start = start_s();
  wait_recorded(comm.group->allgather(out, in), CollectiveKind::kAllGather,
                static_cast<double>(gathered * row_values * t.element_size()), start);
  std::vector<torch::Tensor> parts;
  for (int i = 0; i < comm.size(); ++i)
    parts.push_back(
        out[0][static_cast<std::size_t>(i)].narrow(0, 0, rows[static_cast<std::size_t>(i)]));
  return torch::cat(parts, 0).to(t.options());
}

void broadcast(const Comm& comm, torch::Tensor& t, int root) {
  if (comm.size() < 2 || t.numel() == 0) return;
  std::vector<at::Tensor> tensors{to_wire(comm, t)};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  const double start = start_s();
  wait_recorded(comm.group->broadcast(tensors, options), CollectiveKind::kBroadcast,
                static_cast<double>(t.numel() * t.element_size()), start);
  if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
}

torch::Tensor reduce_scatter(const Comm& comm, const torch::Tensor& t) {
  if (comm.size() < 2) return t.clone();
  const int64_t part = t.numel() / comm.size();
  if (comm.group->getBackendName() == "gloo") {
    // Gloo (torch 1.13) has no reduce-scatter: all-reduce and keep this member's part (recorded
    // as the reduce-scatter it stands for).
    torch::Tensor sum = t.clone();
    sum_recorded_as(comm, sum, CollectiveKind::kReduceScatter);
    return sum.narrow(0, comm.rank * part, part).clone();
  }
  const torch::Tensor w = to_wire(comm, t);
  std::vector<std::vector<at::Tensor>> in(1);
  for (int i = 0; i < comm.size(); ++i) in[0].push_back(w.narrow(0, i * part, part).contiguous());
  std::vector<at::Tensor> out{torch::empty({part}, w.options())};
  const double start = start_s();
  wait_recorded(comm.group->reduce_scatter(out, in), CollectiveKind::kReduceScatter,
                static_cast<double>(t.numel() * t.element_size()), start);
  return out[0].to(t.options());
}

torch::Tensor reduce_scatter_rows(const Comm& comm, const torch::Tensor& t,
                                  const std::vector<int64_t>& rows) {
  if (comm.size() < 2) return t;
  const int64_t mine = rows[static_cast<std::size_t>(comm.rank)];
  const bool even = std::all_of(rows.begin(), rows.end(), [&](int64_t r) { return r == mine; });
  if (comm.group->getBackendName() == "gloo" || !even) {
    // Gloo has no reduce-scatter, nor does NCCL take uneven parts: all-reduce, keep this
    // member's rows, recorded as the reduce-scatter it stands for.
    torch::Tensor sum = t.contiguous().clone();
    sum_recorded_as(comm, sum, CollectiveKind::kReduceScatter);
    return sum.narrow(0, first_row(comm, rows), mine).clone();
  }
  const torch::Tensor flat = t.contiguous().reshape({-1});
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = mine;
  return reduce_scatter(comm, flat).view(shape);
}

torch::Tensor all_to_all_rows(const Comm& comm, const torch::Tensor& t,
                              const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) {
  if (comm.size() < 2) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[0] = 0;
  for (int64_t r : recv_rows) shape[0] += r;
  torch::Tensor in = to_wire(comm, t.contiguous());
  torch::Tensor out = torch::empty(shape, in.options());
  std::vector<int64_t> out_counts = recv_rows, in_counts = send_rows;
  const double start = start_s();
  wait_recorded(comm.group->alltoall_base(out, in, out_counts, in_counts),
                CollectiveKind::kAllToAll, static_cast<double>(t.numel() * t.element_size()),
                start);
  return out.to(t.options());
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Autograd functions carry their Comm as an address: Comms live as long as the worker.
int64_t handle(const Comm& comm) {
  return reinterpret_cast<intptr_t>(&comm);
}
const Comm& comm_of(AutogradContext* ctx) {
  return *reinterpret_cast<const Comm*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    torch::Tensor g = grads[0].contiguous().clone();
    all_reduce(comm_of(ctx), g);
    return {g, torch::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, int64_t comm) {
    torch::Tensor y = x.contiguous().clone();
    all_reduce(*reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm)), y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

struct GatherRows : torch::autograd::Function<GatherRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t comm,
                               std::vector<int64_t> rows) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["rows"] = rows;
    return all_gather_rows(*reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm)),
                           x.contiguous(), rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_rows(comm_of(ctx), grads[0], ctx->saved_data["rows"].toIntVector()),
            torch::Tensor(), torch::Tensor()};
  }
};

struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t comm,
                               std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return all_to_all_rows(*reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm)), x,
                           send_rows, recv_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_to_all_rows(comm_of(ctx), grads[0], ctx->saved_data["recv"].toIntVector(),
                            ctx->saved_data["send"].toIntVector()),
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The backward of ScatterRows and ReduceScatterToRows: the rows' gradients all-gathered.
variable_list gathered_gradient(AutogradContext* ctx, const variable_list& grads) {
  return {
      all_gather_rows(comm_of(ctx), grads[0].contiguous(), ctx->saved_data["rows"].toIntVector()),
      torch::Tensor(), torch::Tensor()};
}

struct ScatterRows : torch::autograd::Function<ScatterRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t comm,
                               std::vector<int64_t> rows) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["rows"] = rows;
    const Comm& c = *reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm));
    return x.narrow(0, first_row(c, rows), rows[static_cast<std::size_t>(c.rank)]).clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return gathered_gradient(ctx, grads);
  }
};

struct ReduceScatterToRows : torch::autograd::Function<ReduceScatterToRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t comm,
                               std::vector<int64_t> rows) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["rows"] = rows;
    return reduce_scatter_rows(*reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm)), x,
                               rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return gathered_gradient(ctx, grads);
  }
};

// Up to three linears: `linears` of them, their biases where bit i of `biases` is set (the
// others, and the unused weights, empty tensors: autograd takes no undefined input).
struct GatheredLinears : torch::autograd::Function<GatheredLinears> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w0, const torch::Tensor& w1,
                               const torch::Tensor& w2, const torch::Tensor& b0,
                               const torch::Tensor& b1, const torch::Tensor& b2, int64_t comm,
                               std::vector<int64_t> rows, int64_t linears, int64_t biases) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["linears"] = linears;
    ctx->saved_data["biases"] = biases;
    ctx->save_for_backward({x, w0, w1, w2});
    const torch::Tensor full = all_gather_rows(
        *reinterpret_cast<const Comm*>(static_cast<intptr_t>(comm)), x.contiguous(), rows);
    variable_list out;
    const torch::Tensor* w[] = {&w0, &w1, &w2};
    const torch::Tensor* b[] = {&b0, &b1, &b2};
    for (int64_t i = 0; i < linears; ++i) {
      torch::Tensor y = torch::matmul(full, w[i]->t());
      out.push_back((biases >> i) & 1 ? y + *b[i] : y);
    }
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Comm& comm = comm_of(ctx);
    const std::vector<int64_t> rows = ctx->saved_data["rows"].toIntVector();
    const variable_list saved = ctx->get_saved_variables();
    const int64_t has_bias = ctx->saved_data["biases"].toInt();
    const auto linears = static_cast<std::size_t>(ctx->saved_data["linears"].toInt());
    // The input gathered again for the weights' gradients (Megatron-LM keeps only its rows).
    const torch::Tensor full = all_gather_rows(comm, saved[0].contiguous(), rows);
    const torch::Tensor flat = full.reshape({-1, full.size(-1)});
    torch::Tensor input_grad;
    variable_list weight_grads(3), bias_grads(3);
    for (std::size_t i = 0; i < linears && i < grads.size(); ++i) {
      const torch::Tensor& w = saved[i + 1];
      if (!grads[i].defined()) continue;
      const torch::Tensor g = grads[i].reshape({-1, grads[i].size(-1)});
      const torch::Tensor gx = torch::matmul(grads[i], w);
      input_grad = input_grad.defined() ? input_grad + gx : gx;
      weight_grads[i] = torch::matmul(g.t(), flat);
      if ((has_bias >> i) & 1) bias_grads[i] = g.sum(0);
    }
    if (!input_grad.defined()) input_grad = torch::zeros_like(full);
    return {reduce_scatter_rows(comm, input_grad, rows),
            weight_grads[0],
            weight_grads[1],
            weight_grads[2],
            bias_grads[0],
            bias_grads[1],
            bias_grads[2],
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

std::vector<int64_t> sequence_rows(int64_t total, int64_t parts) {
  std::vector<int64_t> rows(static_cast<std::size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) ++rows[static_cast<std::size_t>(i)];
  return rows;
}

torch::Tensor scatter_rows(const torch::Tensor& x, const Comm& comm,
                           const std::vector<int64_t>& rows) {
  if (comm.size() < 2) return x;
  return ScatterRows::apply(x, handle(comm), rows);
}

torch::Tensor reduce_scatter_to_rows(const torch::Tensor& x, const Comm& comm,
                                     const std::vector<int64_t>& rows) {
  if (comm.size() < 2) return x;
  return ReduceScatterToRows::apply(x, handle(comm), rows);
}

std::vector<torch::Tensor> gathered_linears(const torch::Tensor& x, const Comm& comm,
                                            const std::vector<int64_t>& rows,
                                            const std::vector<torch::Tensor>& weights,
                                            const std::vector<torch::Tensor>& biases) {
  TESSERA_CHECK(!weights.empty() && weights.size() <= 3 && biases.size() == weights.size(),
                "gathered_linears takes one to three linears");
  if (comm.size() < 2) {
    std::vector<torch::Tensor> out;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      torch::Tensor y = torch::matmul(x, weights[i].t());
      out.push_back(biases[i].defined() ? y + biases[i] : y);
    }
    return out;
  }
  const torch::Tensor none = torch::empty({0}, x.options());
  std::vector<torch::Tensor> w(3, none), b(3, none);
  int64_t with_bias = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    w[i] = weights[i];
    if (biases[i].defined()) {
      b[i] = biases[i];
      with_bias |= int64_t{1} << i;
    }
  }
  return GatheredLinears::apply(x, w[0], w[1], w[2], b[0], b[1], b[2], handle(comm), rows,
                                static_cast<int64_t>(weights.size()), with_bias);
}

torch::Tensor copy_to_group(const torch::Tensor& x, const Comm& comm) {
  if (comm.size() < 2) return x;
  return CopyToGroup::apply(x, handle(comm));
}

torch::Tensor reduce_from_group(const torch::Tensor& x, const Comm& comm) {
  if (comm.size() < 2) return x;
  return ReduceFromGroup::apply(x, handle(comm));
}

torch::Tensor gather_rows(const torch::Tensor& x, const Comm& comm,
                          const std::vector<int64_t>& rows) {
  if (comm.size() < 2) return x;
  return GatherRows::apply(x, handle(comm), rows);
}

torch::Tensor exchange_rows(const torch::Tensor& x, const Comm& comm,
                            const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows) {
  if (comm.size() < 2) return x;
  return ExchangeRows::apply(x, handle(comm), send_rows, recv_rows);
}

}  // namespace tessera::exec

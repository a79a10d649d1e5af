#include "shared/cost/cost_model.hpp"

#include <algorithm>
#include <cstdlib>

#include "shared/base/check.hpp"
#include "shared/cost/collective_cost.hpp"
#include "shared/cost/kernel_cost.hpp"
#include "shared/cost/overlap_slowdown.hpp"

namespace tessera {

SizeClass size_class(const ModuleSpec& m) {
  const int64_t width = m.transformer ? m.transformer->hidden : m.projector ? m.projector->out : 0;
  return width < 1024 ? SizeClass::kSmall : width < 4096 ? SizeClass::kMedium : SizeClass::kLarge;
}

std::string size_class_name(SizeClass size) {
  switch (size) {
    case SizeClass::kSmall:
      return "small";
    case SizeClass::kMedium:
      return "medium";
    case SizeClass::kLarge:
      return "large";
  }
  return "?";
}

double latency_steps(CollectiveKind kind, int64_t n) {
  if (n <= 1) return 0;
  return kind == CollectiveKind::kAllReduce   ? 2.0 * static_cast<double>(n - 1)
         : kind == CollectiveKind::kBroadcast ? 1.0
                                              : static_cast<double>(n - 1);
}

CostParams default_cost_params(const ClusterSpec& cluster) {
  CostParams p;
  if (cluster.kind == ClusterKind::kCpuLocal) {
    p.default_efficiency = 0.5;
    p.overhead_per_layer_s = 100e-6;
    p.overhead_per_op_s = 50e-6;
    p.bandwidth_efficiency = 1.0;
  }
  // Kernel-priced GPUs: compute beside a collective runs 18.9% slower, the mean slowdown Lee et
  // al. measured over GPT and Llama training on A100, H100, MI250 and MI210 ("Characterizing
  // Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning", 2025,
  // arXiv 2507.03114; overlap_slowdown.hpp).
  if (cluster.kind != ClusterKind::kCpuLocal && cluster.device.kernels)
    p.overlap_slowdown = kMeasuredOverlapSlowdown;
  return p;
}

double bus_factor(CollectiveKind kind, int64_t n) {
  if (n <= 1) return 0;
  const double ring = static_cast<double>(n - 1) / static_cast<double>(n);
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2 * ring;
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllToAll:
      return ring;
    case CollectiveKind::kBroadcast:
      return 1;
  }
  return 1;
}

CostModel::CostModel(const ClusterSpec& cluster, DType dtype, CostParams params,
                     const ModelSpec& model)
    : cluster_(cluster), dtype_(dtype), params_(std::move(params)) {
  if (cluster_.device.kernels) modules_ = model.modules;
  for (const ModuleSpec& m : model.modules) {
    roles_.push_back(m.role);
    sizes_.push_back(size_class(m));
  }
}

// The fit of the op's (role, phase, size class); else the same role and phase in the nearest
// size class; a W with no fit of its own takes its B's (fused backward, see ComputeFit).
const ComputeFit* CostModel::compute_fit(const Op& op) const {
  if (params_.compute_fits.empty() || op.module < 0 ||
      static_cast<std::size_t>(op.module) >= roles_.size())
    return nullptr;
  const ModuleRole role = roles_[static_cast<std::size_t>(op.module)];
  const SizeClass size = sizes_[static_cast<std::size_t>(op.module)];
  auto nearest = [&](Phase phase) {
    const ComputeFit* best = nullptr;
    int distance = 0;
    for (const ComputeFit& f : params_.compute_fits) {
      if (f.role != role || f.phase != phase) continue;
      const int d = std::abs(static_cast<int>(f.size) - static_cast<int>(size));
      if (best == nullptr || d < distance) {
        best = &f;
        distance = d;
      }
    }
    return best;
  };
  const ComputeFit* fit = nearest(op.phase);
  return fit == nullptr && op.phase == Phase::kW ? nearest(Phase::kB) : fit;
}

// The fit of (kind, group size, locality); else the same kind and locality at the nearest size
// (the latency and bus bandwidth carry over through the ring formula).
const LinkFit* CostModel::collective_fit(CollectiveKind kind, int64_t n, bool local) const {
  const LinkFit* best = nullptr;
  int64_t distance = 0;
  for (const LinkFit& f : params_.collective_fits) {
    if (f.kind != kind || f.local != local) continue;
    const int64_t d = std::abs(f.group_size - n);
    if (best == nullptr || d < distance) {
      best = &f;
      distance = d;
    }
  }
  return best;
}

const LinkFit* CostModel::p2p_fit(bool local) const {
  for (const LinkFit& f : params_.p2p_fits)
    if (f.local == local) return &f;
  return nullptr;
}

double nested_calls(const Op& op) {
  double calls = 0;
  for (const NestedCollective& n : op.nested)
    if (n.purpose != Purpose::kPp) calls += n.count;
  return calls;
}

double spread_draw(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  // splitmix64 over the four coordinates.
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (uint64_t v : {a, b, c, d}) {
    x ^= v + 0x9e3779b97f4a7c15ULL + (x << 6) + (x >> 2);
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    x ^= x >> 31;
  }
  return static_cast<double>(x >> 11) / 9007199254740992.0;
}

double spread_factor(const std::vector<double>& spread, double u) {
  if (spread.empty()) return 1;
  const double k = static_cast<double>(spread.size());
  const double pos = std::clamp(u * k - 0.5, 0.0, k - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, spread.size() - 1);
  return spread[lo] + (spread[hi] - spread[lo]) * (pos - static_cast<double>(lo));
}

const std::vector<double>* CostModel::compute_spread(const Op& op) const {
  if (op.kind == OpKind::kOptimizerStep)
    return params_.optimizer_fit && !params_.optimizer_fit->stats.spread.empty()
               ? &params_.optimizer_fit->stats.spread
               : nullptr;
  const ComputeFit* f = compute_fit(op);
  return f != nullptr && !f->stats.spread.empty() ? &f->stats.spread : nullptr;
}

const std::vector<double>* CostModel::collective_spread(CollectiveKind kind,
                                                        const RankList& group) const {
  const LinkFit* f = collective_fit(kind, static_cast<int64_t>(group.size()), same_node(group));
  return f != nullptr && !f->stats.spread.empty() ? &f->stats.spread : nullptr;
}

const std::vector<double>* CostModel::p2p_spread(int64_t from, int64_t to) const {
  const LinkFit* f = p2p_fit(same_node({from, to}));
  return f != nullptr && !f->stats.spread.empty() ? &f->stats.spread : nullptr;
}

bool CostModel::calibrated_collective(CollectiveKind kind, const RankList& group) const {
  return collective_fit(kind, static_cast<int64_t>(group.size()), same_node(group)) != nullptr;
}

bool CostModel::calibrated_p2p(int64_t from, int64_t to) const {
  return p2p_fit(same_node({from, to})) != nullptr;
}

bool CostModel::same_node(const RankList& group) const {
  if (cluster_.kind == ClusterKind::kCpuLocal || group.empty()) return true;
  const int64_t node = group.front() / cluster_.devices_per_node;
  return std::all_of(group.begin(), group.end(),
                     [&](int64_t r) { return r / cluster_.devices_per_node == node; });
}

double CostModel::collective_s(CollectiveKind kind, const RankList& group, double bytes,
                               Transport transport) const {
  const int64_t n = static_cast<int64_t>(group.size());
  if (n <= 1 || bytes <= 0) return 0;
  const bool local = same_node(group);
  if (const LinkFit* f = collective_fit(kind, n, local))
    return latency_steps(kind, n) * f->latency_s +
           bus_factor(kind, n) * bytes / f->bandwidth_bytes_per_s;
  if (!cluster_.intra_node_collectives.empty())
    return nccl_collective_s(cluster_, kind, n, group_span(cluster_, group), bytes,
                             nic_efficiency(), transport);
  const LinkSpec& link = local ? cluster_.intra_node : cluster_.inter_node.link;
  double efficiency = params_.bandwidth_efficiency;
  double latency = latency_steps(kind, n) * link.latency_s;
  if (!local && kind == CollectiveKind::kAllToAll) {
    const AllToAllRate a2a = all_to_all_rate(cluster_.inter_node, transport, efficiency, latency,
                                             group_span(cluster_, group).nodes);
    efficiency = a2a.efficiency;
    latency = a2a.latency_s;
  }
  double bandwidth = link.bandwidth_bytes_per_s * efficiency;
  if (!local) bandwidth /= std::max(1.0, cluster_.inter_node.oversubscription);
  return latency + bus_factor(kind, n) * bytes / bandwidth;
}

double CostModel::collective_s(const Program& program, const NestedCollective& nested) const {
  return collective_s(nested.kind, program.groups[static_cast<std::size_t>(nested.group)],
                      nested.bytes, nested.transport);
}

double CostModel::p2p_s(int64_t from, int64_t to, double bytes) const {
  const bool local = same_node({from, to});
  if (const LinkFit* f = p2p_fit(local)) return f->latency_s + bytes / f->bandwidth_bytes_per_s;
  const LinkSpec& link = local ? cluster_.intra_node : cluster_.inter_node.link;
  double bandwidth =
      link.bandwidth_bytes_per_s * (local ? params_.bandwidth_efficiency : nic_efficiency());
  if (!local) bandwidth /= std::max(1.0, cluster_.inter_node.oversubscription);
  return link.latency_s + bytes / bandwidth;
}

double CostModel::nic_efficiency() const {
  return cluster_.inter_node.efficiency > 0 ? cluster_.inter_node.efficiency
                                            : params_.bandwidth_efficiency;
}

double CostModel::efficiency(const Op& op) const {
  if (op.module >= 0 && static_cast<std::size_t>(op.module) < roles_.size()) {
    const auto it =
        params_.efficiency.find({roles_[static_cast<std::size_t>(op.module)], op.phase});
    if (it != params_.efficiency.end()) return it->second;
  }
  return params_.default_efficiency;
}

double CostModel::compute_s(const Program& program, const Op& op) const {
  return compute_only_s(program, op) + nested_s(program, op);
}

double CostModel::compute_s(const Program& program, int32_t rank, std::size_t index) const {
  const Op& op = program.ranks[static_cast<std::size_t>(rank)][index];
  return compute_only_s(program, rank, index) + nested_s(program, op);
}

double CostModel::compute_only_s(const Program& program, const Op& op) const {
  return shared_compute_s(program, op, dedicated_compute_s(op));
}

double CostModel::compute_only_s(const Program& program, int32_t rank, std::size_t index) const {
  const std::vector<Op>& ops = program.ranks[static_cast<std::size_t>(rank)];
  return shared_compute_s(program, ops[index], dedicated_compute_s(ops, index));
}

double CostModel::shared_compute_s(const Program& program, const Op& op, double dedicated) const {
  double seconds = dedicated;
  // The nested collectives' seconds that run beside the compute part and hide behind it.
  double hidden = 0;
  if ((op.flags & kOpTpCommOverlap) != 0 && op.tp > 1) {
    // The GEMMs run in tp chunks, each chunk's all-gather or reduce-scatter beside the next
    // chunk's GEMM: all of the TP traffic but one chunk's hides behind the compute, as far as
    // the compute lasts. Taken off the compute part; the collectives keep their own time.
    const double chunks = static_cast<double>(op.tp);
    hidden = std::min(seconds, nested_s(program, op, Purpose::kTp) * (chunks - 1) / chunks);
  } else {
    if ((op.flags & kOpTpGradOverlap) != 0 && op.tp > 1)
      hidden = std::min(seconds, hidden_input_gradient_s(program, op));
    hidden += std::min(seconds - hidden, hidden_regather_s(program, op));
  }
  if ((op.flags & kOpEpCommOverlap) != 0) {
    // The all-to-alls run while other micro-batches compute, as far as their compute lasts:
    // taken off the compute part, the collectives keep their own time.
    hidden += std::min(seconds - hidden, nested_s(program, op, Purpose::kEp));
  }
  // The compute that ran beside them is slowed (overlap_slowdown.hpp).
  seconds += slowed_s(hidden, hidden, params_.overlap_slowdown) - hidden;
  // cpu-local ranks share the machine's cores.
  if (cluster_.kind == ClusterKind::kCpuLocal && program.world > cluster_.cores)
    return seconds * static_cast<double>(program.world) / static_cast<double>(cluster_.cores);
  return seconds;
}

double CostModel::nested_s(const Program& program, const Op& op,
                           std::optional<Purpose> purpose) const {
  double seconds = 0;
  for (const NestedCollective& n : op.nested)
    if (!purpose || n.purpose == *purpose) seconds += n.count * collective_s(program, n);
  return seconds;
}

bool CostModel::kernel_priced(const Op& op) const {
  return cluster_.device.kernels && op.module >= 0 &&
         static_cast<std::size_t>(op.module) < modules_.size() && compute_fit(op) == nullptr;
}

double CostModel::hidden_input_gradient_s(const Program& program, const Op& op) const {
  // Each column-parallel matrix's input-gradient collective (all-reduce; reduce-scatter under
  // sequence parallelism: the layer stack's 2 per layer) runs beside that matrix's weight-gradient
  // GEMM, hiding as much of it as the GEMM lasts. Only kernel-level pricing knows the GEMM's time;
  // it comes off the compute part, the collective keeps its own time (as for tp_comm_overlap).
  if (!kernel_priced(op)) return 0;
  const CollectiveKind kind = (op.flags & kOpSequenceParallel) != 0 ? CollectiveKind::kReduceScatter
                                                                    : CollectiveKind::kAllReduce;
  const NestedCollective* grad = nullptr;
  for (const NestedCollective& n : op.nested)
    if (n.purpose == Purpose::kTp && n.kind == kind && n.count == 2 * op.layers) grad = &n;
  if (grad == nullptr) return 0;
  const double call = collective_s(program, *grad);
  return column_parallel_hidden_s(modules_[static_cast<std::size_t>(op.module)], op, Phase::kW,
                                  cluster_.device, peak_flops(cluster_, dtype_),
                                  static_cast<double>(dtype_bytes(dtype_)), params_.kernel_tuning,
                                  call);
}

double CostModel::hidden_regather_s(const Program& program, const Op& op) const {
  // The lowering nests the second gather after the backward's own all-gathers (those of the
  // row-parallel outputs' gradients), as many calls as they: a B op whose last TP all-gather
  // follows another of its count has it last (the embedding's and the head's gathers under
  // sequence parallelism come first).
  if (op.phase != Phase::kB || op.tp <= 1 || !kernel_priced(op)) return 0;
  const NestedCollective* regather = nullptr;
  for (const NestedCollective& n : op.nested)
    if (n.purpose == Purpose::kTp && n.kind == CollectiveKind::kAllGather) regather = &n;
  if (regather == nullptr) return 0;
  int gathers = 0;
  for (const NestedCollective& n : op.nested)
    if (n.purpose == Purpose::kTp && n.kind == CollectiveKind::kAllGather &&
        n.count == regather->count)
      ++gathers;
  if (gathers < 2) return 0;
  return column_parallel_hidden_s(modules_[static_cast<std::size_t>(op.module)], op, Phase::kB,
                                  cluster_.device, peak_flops(cluster_, dtype_),
                                  static_cast<double>(dtype_bytes(dtype_)), params_.kernel_tuning,
                                  collective_s(program, *regather));
}

namespace {

// What a ComputeFit prices of a compute op (FLOPs with the expert wait).
ComputeWork compute_work(const Op& op) {
  return {op.flops + op.expert_wait_flops, static_cast<double>(op.tokens * op.layers), op.logits,
          nested_calls(op), static_cast<double>(op.layers)};
}

}  // namespace

double CostModel::dedicated_compute_s(const Op& op) const {
  if (op.kind == OpKind::kOptimizerStep) {
    if (const auto& f = params_.optimizer_fit)
      return f->overhead_s + op.memory_bytes / f->bandwidth_bytes_per_s;
    if (cluster_.device.kernels)
      return kernel_optimizer_s(cluster_.device, op.memory_bytes, params_.kernel_tuning);
    return params_.overhead_per_op_s +
           op.memory_bytes / cluster_.device.memory_bandwidth_bytes_per_s;
  }
  TESSERA_CHECK(op.kind == OpKind::kCompute);
  if (const ComputeFit* f = compute_fit(op)) {
    const ComputeWork work = compute_work(op);
    const bool fused = op.phase == Phase::kW && f->phase == Phase::kB;
    return fused ? work.flops * f->seconds_per_flop : fitted_compute_s(*f, work);
  }
  if (cluster_.device.kernels && op.module >= 0 &&
      static_cast<std::size_t>(op.module) < modules_.size())
    return kernel_compute_s(modules_[static_cast<std::size_t>(op.module)], op, cluster_.device,
                            peak_flops(cluster_, dtype_), static_cast<double>(dtype_bytes(dtype_)),
                            params_.kernel_tuning);
  double seconds =
      fixed_compute_s(op) + static_cast<double>(op.layers) * params_.overhead_per_layer_s;
  if (const double priced = op.flops + op.expert_wait_flops; priced > 0)
    seconds += priced / (peak_flops(cluster_, dtype_) * efficiency(op));
  return seconds;
}

double CostModel::dedicated_compute_s(const std::vector<Op>& ops, std::size_t index) const {
  // A W priced by its B's fit (it has none of its own: the measured runs fused it too).
  const auto joint = [&](std::size_t w) {
    const ComputeFit* f = fused_with_backward(ops, w) ? compute_fit(ops[w]) : nullptr;
    return f != nullptr && f->phase == Phase::kB ? f : nullptr;
  };
  const Op& op = ops[index];
  if (op.kind == OpKind::kCompute) {
    if (joint(index) != nullptr) return 0;
    if (index + 1 < ops.size())
      if (const ComputeFit* f = joint(index + 1)) {
        ComputeWork work = compute_work(op);
        work.flops += compute_work(ops[index + 1]).flops;
        return fitted_compute_s(*f, work);
      }
  }
  return dedicated_compute_s(op);
}

double fitted_compute_s(const ComputeFit& f, const ComputeWork& work) {
  const double device = f.overhead_s + work.flops * f.seconds_per_flop +
                        work.token_layers * f.seconds_per_token_layer +
                        work.logits * f.seconds_per_logit + work.calls * f.seconds_per_nested_call +
                        work.layers * f.seconds_per_layer;
  return std::max(device, host_floor_s(f.host_seconds_per_layer, work.layers));
}

double host_floor_s(double per_layer, double layers) {
  return per_layer * std::max(1.0, layers);
}

double CostModel::fixed_compute_s(const Op& op) const {
  if (const ComputeFit* f = compute_fit(op))
    return op.phase == Phase::kW && f->phase == Phase::kB ? 0 : f->overhead_s;
  if (cluster_.device.kernels) return 0;  // launches are part of each kernel's price
  return params_.overhead_per_op_s;
}

RankMemory parameter_memory(double parameters, bool trainable, int64_t optimizer_shards,
                            DType dtype, bool fully_sharded, int64_t gradient_bytes) {
  const auto shards = static_cast<double>(std::max<int64_t>(1, optimizer_shards));
  const double held = fully_sharded ? parameters / shards : parameters;
  RankMemory m;
  m.weight_bytes = held * static_cast<double>(dtype_bytes(dtype));
  if (trainable) {
    m.gradient_bytes = held * static_cast<double>(gradient_bytes);
    m.optimizer_bytes = parameters * 12.0 / shards;
  }
  return m;
}

}  // namespace tessera

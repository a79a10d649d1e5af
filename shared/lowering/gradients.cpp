// Lowering: parameter memory, gradient buckets, gradient reductions and optimizer steps.
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

void Lowering::account_memory(int64_t rank, const std::vector<int>& module_list) {
  RankMemory& mem = p_.memory[static_cast<std::size_t>(rank)];
  // fully_sharded: the largest unit whole, twice (the one running and the next, prefetched),
  // and its unsharded gradients before their reduce-scatter.
  double unit_weights = 0, unit_gradients = 0;
  for (int i : module_list) {
    const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    const ModuleInfo& owner = grid_of(m);
    const Coord x = owner.coord(rank);
    const double params = parameters_on(m, x), experts = split_expert_parameters_on(m, x);
    // The distributed optimizer shards state over the replicas of each parameter: dp·cp of
    // them, (tp / etp)·dp·cp / ep of a routed expert; fully sharded, the weights and gradients
    // too.
    const ModuleLayout& l = owner.layout;
    const int64_t replicas = l.dp * l.cp;
    const int64_t shards = plan_.distributed_optimizer ? replicas : 1;
    const int64_t expert_shards =
        plan_.distributed_optimizer ? replicas * (split_tp(m) / split_etp(m)) / l.ep : 1;
    const bool full = sharded(m, x);
    const int64_t gradient = kept_gradient_bytes(plan_, model_.dtype);
    for (const RankMemory& add : {parameter_memory(params - experts, m.flow.trainable, shards,
                                                   model_.dtype, full, gradient),
                                  parameter_memory(experts, m.flow.trainable, expert_shards,
                                                   model_.dtype, full, gradient)}) {
      mem.weight_bytes += add.weight_bytes;
      mem.gradient_bytes += add.gradient_bytes;
      mem.optimizer_bytes += add.optimizer_bytes;
    }
    // FP8: the layers' weights also in FP8, and transposed for the input-gradient GEMM (Hopper
    // runs FP8 GEMMs on the TN layout only): two bytes more per parameter; kept in FP8 only
    // (fp8_param_gather), the FP8 copy and its transpose replace the 16-bit weight.
    if (!full && !plan_.fp8_param_gather)
      for (const auto& [a, b] : held_layers(m, x))
        mem.weight_bytes += 2 * fp8_layer_parameters(m, a, b);
    if (!full) continue;
    for (const LayerRange& layers : held_layers(m, x))
      for (const auto& [a, b] : sharded_units(m, layers)) {
        unit_weights = std::max(unit_weights, bucket_bytes(m, a, b, weight_value_bytes()));
        if (m.flow.trainable) unit_gradients = std::max(unit_gradients, bucket_bytes(m, a, b, 4));
      }
  }
  mem.weight_bytes += 2 * unit_weights;
  mem.gradient_bytes += unit_gradients;
}

bool Lowering::sharded(const ModuleInfo& m, const Coord& x) {
  return plan_.fully_sharded &&
         p_.groups[static_cast<std::size_t>(dpcp_group(grid_of(m), x))].size() > 1;
}

std::vector<LayerRange> Lowering::sharded_units(const ModuleInfo& m, LayerRange layers) const {
  std::vector<LayerRange> units = gradient_buckets(m, layers);
  if (units.empty()) units.push_back(layers);
  return units;
}

int32_t Lowering::gather_unit(int64_t rank, const ModuleInfo& m, const Coord& x, int64_t k_chunk,
                              int32_t mb, const LayerRange& unit, Phase phase, int32_t after) {
  const ModuleInfo& owner = grid_of(m);
  Op g = collective_op(CollectiveKind::kAllGather, Purpose::kDp, phase, m.index,
                       dpcp_group(owner, x), 0);
  g.stage = static_cast<int16_t>(x.p);
  g.chunk = chunk_of(m, k_chunk);
  g.microbatch = mb;
  g.first_layer = static_cast<int32_t>(unit.first);
  g.layers = static_cast<int32_t>(unit.second - unit.first);
  g.flags |= kOpGradientBucket | kOpFullySharded;
  if (after >= 0) g.deps = {after};
  const double value = gathered_value_bytes(m, unit.first, unit.second);
  return emit_dp_collectives(rank, g, owner, x, bucket_bytes(m, unit.first, unit.second, value),
                             bucket_expert_bytes(m, unit.first, unit.second, value))
      .back();
}

int32_t Lowering::prefetched_gather(int64_t rank, const ModuleInfo& m, const Coord& x,
                                    int64_t k_chunk, int32_t mb,
                                    const std::vector<LayerRange>& units, std::size_t u,
                                    Phase phase, std::vector<int32_t>& gathers) {
  const int32_t after = last_compute(rank);
  while (gathers.size() < std::min(u + 2, units.size()))
    gathers.push_back(gather_unit(rank, m, x, k_chunk, mb, units[gathers.size()], phase, after));
  return gathers[u];
}

std::vector<LayerRange> Lowering::gradient_buckets(const ModuleInfo& m, int64_t k) const {
  return gradient_buckets(m, m.chunk_layers[static_cast<std::size_t>(k)]);
}

std::vector<LayerRange> Lowering::gradient_buckets(const ModuleInfo& m, LayerRange layers) const {
  const auto [a, b] = layers;
  const double limit = plan_.grad_bucket_mb * 1e6;
  std::vector<LayerRange> pieces;
  int64_t end = b;
  for (int64_t l = b - 1; l >= a; --l)
    if (l == a || bucket_bytes(m, l, end, weight_value_bytes()) >= limit) {
      pieces.emplace_back(l, end);
      end = l;
    }
  return pieces;
}

bool Lowering::reduces_in_buckets(const ModuleInfo& m, const Coord& x) {
  return plan_.overlap_grad_reduce && m.flow.trainable && m.spec->transformer &&
         p_.groups[static_cast<std::size_t>(dpcp_group(grid_of(m), x))].size() > 1;
}

void Lowering::reduce_bucket(int64_t rank, const ModuleInfo& m, const Coord& xm, int64_t k_chunk,
                             const LayerRange& piece, uint32_t flags, int32_t mb, int32_t after) {
  Op c = collective_op(
      plan_.distributed_optimizer ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
      Purpose::kDp, Phase::kF, m.index, dpcp_group(grid_of(m), xm), 0);
  c.stage = static_cast<int16_t>(xm.p);
  c.chunk = chunk_of(m, k_chunk);
  c.microbatch = mb;
  c.first_layer = static_cast<int32_t>(piece.first);
  c.layers = static_cast<int32_t>(piece.second - piece.first);
  c.flags |= flags;
  // The sum of replicated key/value gradients waits for the piece, then this.
  if (after >= 0) c.deps = {after};
  int32_t dep = sum_kv_replicas(rank, m, xm, bucket_kv_bytes(m, piece.first, piece.second), c);
  c.deps.clear();
  if (dep >= 0) c.deps = {dep};
  dep = sum_sequence_partial(rank, m, xm,
                             bucket_sequence_partial_bytes(m, piece.first, piece.second), c);
  c.deps.clear();
  if (dep >= 0) c.deps = {dep};
  const double value = gradient_value_bytes();
  for (int32_t id :
       emit_dp_collectives(rank, c, m, xm, bucket_bytes(m, piece.first, piece.second, value),
                           bucket_expert_bytes(m, piece.first, piece.second, value)))
    bucket_reductions_[rank][m.index].push_back(id);
}

int32_t Lowering::backward_in_buckets(int64_t rank, const ModuleInfo& m, int64_t k_chunk,
                                      int32_t mb, int32_t sub, std::span<const Sample* const> s,
                                      std::vector<int32_t> deps,
                                      std::vector<std::pair<LayerRange, int32_t>>* deferred) {
  const Coord xm = grid_of(m).coord(rank);
  int32_t last = -1;
  auto run = [&](Phase phase, const LayerRange* piece) {
    Op op = compute(m, rank, static_cast<int32_t>(k_chunk), mb, phase, s, piece);
    op.sub_microbatch = sub;
    if (piece != nullptr) op.flags |= kOpGradientBucket;
    op.deps = deps;
    last = emit(rank, op);
    deps = {last};
  };
  if (recomputes(m)) run(Phase::kR, nullptr);
  for (const LayerRange& piece : gradient_buckets(m, k_chunk)) {
    run(Phase::kB, &piece);
    run(Phase::kW, &piece);
    if (deferred != nullptr)
      deferred->emplace_back(piece, last);
    else
      reduce_bucket(rank, m, xm, k_chunk, piece, kOpGradientBucket, -1, last);
  }
  return last;
}

std::vector<std::pair<LayerRange, int32_t>> Lowering::gather_buckets_at_start(int64_t rank,
                                                                              const ModuleInfo& m,
                                                                              const Coord& x,
                                                                              int64_t k_chunk) {
  std::vector<std::pair<LayerRange, int32_t>> out;
  const std::vector<LayerRange> pieces = gradient_buckets(m, k_chunk);
  for (auto piece = pieces.rbegin(); piece != pieces.rend(); ++piece) {
    Op g = collective_op(CollectiveKind::kAllGather, Purpose::kDp, Phase::kF, m.index,
                         dpcp_group(grid_of(m), x), 0);
    g.stage = static_cast<int16_t>(x.p);
    g.chunk = chunk_of(m, k_chunk);
    g.first_layer = static_cast<int32_t>(piece->first);
    g.layers = static_cast<int32_t>(piece->second - piece->first);
    g.flags |= kOpGradientBucket;
    const double value = gathered_value_bytes(m, piece->first, piece->second);
    // The piece's forward waits for the last gather (the others precede it).
    out.emplace_back(*piece, emit_dp_collectives(
                                 rank, g, m, x, bucket_bytes(m, piece->first, piece->second, value),
                                 bucket_expert_bytes(m, piece->first, piece->second, value))
                                 .back());
  }
  gathered_at_start_[rank].insert(m.index);
  return out;
}

int32_t Lowering::forward_in_pieces(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                                    int32_t sub, std::span<const Sample* const> s,
                                    std::vector<int32_t> deps,
                                    const std::vector<LayerRange>& pieces,
                                    const std::function<int32_t(std::size_t)>& gather) {
  double stash = 0;
  int32_t last = -1;
  for (std::size_t u = 0; u < pieces.size(); ++u) {
    const int32_t gathered = gather(u);
    Op op = compute(m, rank, static_cast<int32_t>(k_chunk), mb, Phase::kF, s, &pieces[u]);
    op.sub_microbatch = sub;
    op.flags |= kOpGradientBucket;
    op.deps = deps;
    op.deps.push_back(gathered);
    stash += op.stash_bytes;
    op.stash_bytes = 0;
    last = emit(rank, op);
    deps = {last};
  }
  if (last >= 0)
    p_.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(last)].stash_bytes = stash;
  return last;
}

int32_t Lowering::forward_in_pieces(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                                    int32_t sub, std::span<const Sample* const> s,
                                    std::vector<int32_t> deps,
                                    const std::vector<std::pair<LayerRange, int32_t>>& gathered) {
  std::vector<LayerRange> pieces;
  for (const auto& [piece, gather] : gathered) pieces.push_back(piece);
  return forward_in_pieces(rank, m, k_chunk, mb, sub, s, std::move(deps), pieces,
                           [&](std::size_t u) { return gathered[u].second; });
}

int32_t Lowering::forward_units(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                                int32_t sub, std::span<const Sample* const> s,
                                std::vector<int32_t> deps) {
  const Coord xm = grid_of(m).coord(rank);
  std::vector<LayerRange> units =
      sharded_units(m, m.chunk_layers[static_cast<std::size_t>(k_chunk)]);
  std::reverse(units.begin(), units.end());
  std::vector<int32_t> gathers;
  return forward_in_pieces(
      rank, m, k_chunk, mb, sub, s, std::move(deps), units, [&](std::size_t u) {
        return prefetched_gather(rank, m, xm, k_chunk, mb, units, u, Phase::kF, gathers);
      });
}

int32_t Lowering::backward_units(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                                 int32_t sub, std::span<const Sample* const> s,
                                 std::vector<int32_t> deps) {
  const Coord xm = grid_of(m).coord(rank);
  const std::vector<LayerRange> units =
      sharded_units(m, m.chunk_layers[static_cast<std::size_t>(k_chunk)]);
  const uint32_t flags = kOpGradientBucket | kOpFullySharded;
  std::vector<int32_t> gathers;
  int32_t last = -1;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const LayerRange& unit = units[u];
    auto run = [&](Phase phase) {
      Op op = compute(m, rank, static_cast<int32_t>(k_chunk), mb, phase, s, &unit);
      op.sub_microbatch = sub;
      op.flags |= flags;
      op.deps = deps;
      last = emit(rank, op);
      deps = {last};
    };
    deps.push_back(prefetched_gather(rank, m, xm, k_chunk, mb, units, u, Phase::kB, gathers));
    if (recomputes(m) && unit.first < recompute_end(m, static_cast<int32_t>(k_chunk)))
      run(Phase::kR);
    run(Phase::kB);
    if (!m.flow.trainable) continue;
    run(Phase::kW);
    // One reduce-scatter of the unit per micro-batch.
    reduce_bucket(rank, m, xm, k_chunk, unit, flags, mb, last);
  }
  return last;
}

void Lowering::gradient_reduction(int64_t rank, const std::vector<int>& module_list) {
  account_memory(rank, module_list);
  // Every gradient is reduced before any optimizer step: the step clips by the norm of all
  // gradients (Megatron's global clipping), so it waits for all of them.
  std::vector<Op> reductions;
  std::vector<int32_t> reduced;  // index of each reduction (or the last compute op)
  const auto bucketed = bucket_reductions_.find(rank);
  for (int i : module_list) {
    const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    if (!m.flow.trainable) continue;
    const ModuleInfo& owner = grid_of(m);
    const Coord x = owner.coord(rank);
    const double bytes = gradient_value_bytes();
    Op shape = collective_op(
        plan_.distributed_optimizer ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
        Purpose::kDp, Phase::kF, i, dpcp_group(owner, x), 0);
    shape.stage = static_cast<int16_t>(x.p);
    const std::vector<Op> ops = dp_collectives(shape, owner, x, parameters_on(m, x) * bytes,
                                               split_expert_parameters_on(m, x) * bytes);
    reductions.insert(reductions.end(), ops.begin(), ops.end());
    if (bucketed != bucket_reductions_.end())
      if (const auto it = bucketed->second.find(i); it != bucketed->second.end()) {
        // Reduced bucket by bucket during its last backward.
        reduced.insert(reduced.end(), it->second.begin(), it->second.end());
        continue;
      }
    double kv_bytes = 0, partial_bytes = 0;
    for (const auto& [a, b] : held_layers(m, x)) {
      kv_bytes += bucket_kv_bytes(m, a, b);
      partial_bytes += bucket_sequence_partial_bytes(m, a, b);
    }
    Op kv = shape;
    kv.deps.clear();
    if (const int32_t last = last_compute(rank); last >= 0) kv.deps = {last};
    int32_t dep = sum_kv_replicas(rank, m, x, kv_bytes, kv);
    kv.deps.clear();
    if (dep >= 0) kv.deps = {dep};
    dep = sum_sequence_partial(rank, m, x, partial_bytes, kv);
    for (Op c : ops) {
      if (dep >= 0) c.deps = {dep};
      // A group of one has nothing to reduce.
      const bool alone = p_.groups[static_cast<std::size_t>(c.group)].size() == 1;
      reduced.push_back(alone ? dep : emit(rank, c));
    }
  }
  // The global gradient norm (and the loss) is all-reduced over every rank before any step:
  // each rank's steps wait for the slowest rank's gradients.
  if (p_.world > 1 &&
      std::any_of(flow_.begin(), flow_.end(), [](const GradientFlow& f) { return f.trainable; })) {
    if (norm_group_ < 0) {
      RankList world(static_cast<std::size_t>(p_.world));
      std::iota(world.begin(), world.end(), 0);
      norm_group_ = group(std::move(world));
    }
    Op norm = collective_op(CollectiveKind::kAllReduce, Purpose::kNorm, Phase::kF, -1, norm_group_,
                            16);  // two fp64 numbers
    for (int32_t r : reduced)
      if (r >= 0) norm.deps.push_back(r);
    if (const int32_t dep = last_compute(rank); dep >= 0) norm.deps.push_back(dep);
    std::sort(norm.deps.begin(), norm.deps.end());
    norm.deps.erase(std::unique(norm.deps.begin(), norm.deps.end()), norm.deps.end());
    reduced = {emit(rank, norm)};
  }
  // One optimizer step per module (a module's routed experts, reduced apart, step with it).
  const auto shards_of = [&](const Op& c) {
    return static_cast<int64_t>(p_.groups[static_cast<std::size_t>(c.group)].size());
  };
  for (std::size_t k = 0; k < reductions.size(); ++k) {
    const Op& c = reductions[k];
    if ((c.flags & kOpRoutedExperts) != 0) continue;
    const std::size_t end =
        k + 1 < reductions.size() && (reductions[k + 1].flags & kOpRoutedExperts) != 0 ? k + 2
                                                                                       : k + 1;
    // Adam reads and writes fp32 master weights and two moments, reads the gradient and writes
    // the 16-bit weight: ~ (12 + 12 + 4 + 2) bytes per parameter it owns.
    double step_bytes = 0;
    for (std::size_t j = k; j < end; ++j)
      step_bytes += reductions[j].message_bytes / gradient_value_bytes() * 30.0 /
                    static_cast<double>(plan_.distributed_optimizer ? shards_of(reductions[j]) : 1);
    Op step;
    step.kind = OpKind::kOptimizerStep;
    step.stream = StreamKind::kCompute;
    step.module = c.module;
    step.stage = c.stage;
    step.memory_bytes = step_bytes;
    for (int32_t r : reduced)
      if (r >= 0) step.deps.push_back(r);
    std::sort(step.deps.begin(), step.deps.end());
    step.deps.erase(std::unique(step.deps.begin(), step.deps.end()), step.deps.end());
    const int32_t stepped = emit(rank, step);
    const auto at_start = gathered_at_start_.find(rank);
    const bool gathered = at_start != gathered_at_start_.end() && at_start->second.count(c.module);
    for (std::size_t j = k; j < end; ++j)
      if (plan_.distributed_optimizer && !plan_.fully_sharded && shards_of(reductions[j]) > 1 &&
          !gathered) {
        Op gather = reductions[j];
        gather.collective = CollectiveKind::kAllGather;
        // The weights as the gather carries them: the model's dtype, or FP8 for the layers'.
        const ModuleInfo& gm = modules_[static_cast<std::size_t>(c.module)];
        double values = 0, bytes = 0;
        for (const auto& [a, b] : held_layers(gm, grid_of(gm).coord(rank))) {
          values += bucket_bytes(gm, a, b, 1);
          bytes += bucket_bytes(gm, a, b, gathered_value_bytes(gm, a, b));
        }
        gather.message_bytes = reductions[j].message_bytes / gradient_value_bytes() *
                               (values > 0 ? bytes / values : weight_value_bytes());
        gather.deps = {stepped};
        emit(rank, gather);
      }
  }
}

}  // namespace tessera::lowering

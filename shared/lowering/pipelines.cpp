// Lowering: homogeneous and non-colocated placements, as pipelines of modules.
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

void Lowering::lower_pipelines() {
  const bool homogeneous = plan_.placement == Placement::kHomogeneous;
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  // Modules that own ranks: the LLM alone (homogeneous) or every module without a host.
  std::vector<int> owners;
  for (const ModuleInfo& m : modules_)
    if (homogeneous ? m.index == llm_ : m.host < 0) owners.push_back(m.index);
  // Homogeneous: every other module runs in the LLM's first stage, in topological order.
  std::vector<int> prefix;
  if (homogeneous)
    for (const ModuleSpec* s : topological_order(model_))
      if (s != llm.spec && s->role != ModuleRole::kGenerator)
        prefix.push_back(static_cast<int>(s - model_.modules.data()));
  std::vector<int> homogeneous_suffix;  // a generator after the LLM runs in its last stage
  if (homogeneous)
    for (const ModuleSpec* s : topological_order(model_))
      if (s->role == ModuleRole::kGenerator)
        homogeneous_suffix.push_back(static_cast<int>(s - model_.modules.data()));

  for (int owner_index : owners) {
    const ModuleInfo& owner = modules_[static_cast<std::size_t>(owner_index)];
    // Modules borrowing the owner's last stage (non-colocated projectors), in topological order.
    std::vector<int> suffix = homogeneous ? homogeneous_suffix : std::vector<int>{};
    if (!homogeneous)
      for (const ModuleSpec* s : topological_order(model_)) {
        const ModuleInfo& m = modules_[static_cast<std::size_t>(s - model_.modules.data())];
        if (m.host == owner_index) suffix.push_back(m.index);
      }
    // Host modules feeding this one (through borrowed projectors) and consuming from it.
    auto host_of = [&](const std::string& name) {
      const ModuleInfo& m =
          modules_[static_cast<std::size_t>(find_module(model_, name) - model_.modules.data())];
      return m.host >= 0 ? m.host : m.index;
    };
    std::vector<std::pair<int, int>> producers;  // (producer host, producer's last module)
    if (!homogeneous)
      for (const std::string& in : owner.spec->inputs)
        producers.emplace_back(host_of(in),
                               static_cast<int>(find_module(model_, in) - model_.modules.data()));
    std::vector<int> consumers;  // consumer hosts of the owner's (or its suffix's) output
    int last_module = suffix.empty() ? owner_index : suffix.back();
    if (!homogeneous)
      for (const ModuleSpec& s : model_.modules)
        for (const std::string& in : s.inputs)
          if (in == model_.modules[static_cast<std::size_t>(last_module)].name)
            consumers.push_back(host_of(s.name));

    const bool owner_backward = owner.flow.backward();
    bool suffix_backward = false, prefix_backward = false;
    for (int i : suffix) suffix_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();
    for (int i : prefix) prefix_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();

    const int64_t pp = owner.layout.pp, vpp = owner.layout.vpp;
    for (int64_t rank = owner.first; rank < owner.first + owner.layout.size(); ++rank) {
      if (!lowers(rank)) continue;  // a folded Program's represented rank
      const Coord x = owner.coord(rank);
      const bool first_stage = x.p == 0, last_stage = x.p == pp - 1;
      const bool has_backward =
          owner_backward || (last_stage && suffix_backward) || (first_stage && prefix_backward);
      const bool leader = x.t == 0 && x.c == 0;
      // Per (mb, chunk): index of the F compute ops (for the backward's R/B dependencies).
      std::map<std::pair<int32_t, int32_t>, int32_t> forward_done;
      std::map<std::tuple<int32_t, int32_t, int>, int32_t>
          forward_of;  // (mb, chunk, module) -> F op
      const std::vector<ScheduleItem> order = order_for(owner, x.p, has_backward);
      // overlap_grad_reduce: the owner's gradients of each chunk are bucketed and reduced during
      // the chunk's last backward (gradients accumulate locally before it).
      std::map<int32_t, int32_t> last_backward;  // chunk -> its last micro-batch's backward
      const bool overlap = plan_.overlap_grad_reduce && owner.flow.trainable &&
                           owner.spec->transformer &&
                           p_.groups[static_cast<std::size_t>(dpcp_group(owner, x))].size() > 1;
      if (overlap)
        for (const ScheduleItem& item : order)
          if (item.backward) last_backward[item.chunk] = item.microbatch;
      // overlap_param_gather: the step begins with the all-gathers of the parameters the previous
      // step's optimizer updated (the steady state), bucket by bucket in the order the forward
      // needs them, and each chunk's first forward runs in the same pieces, each piece waiting
      // for its own bucket's gather.
      std::map<int32_t, int32_t> first_forward;  // chunk -> its first micro-batch
      // chunk -> its buckets bottom up, each with its gather op
      std::map<int32_t, std::vector<std::pair<LayerRange, int32_t>>> param_gathers;
      if (overlap && plan_.overlap_param_gather) {
        for (const ScheduleItem& item : order) {
          if (item.backward || first_forward.count(item.chunk) > 0) continue;
          first_forward[item.chunk] = item.microbatch;
          const std::vector<LayerRange> pieces = gradient_buckets(owner, item.chunk * pp + x.p);
          for (auto piece = pieces.rbegin(); piece != pieces.rend(); ++piece) {
            Op g = collective_op(CollectiveKind::kAllGather, Purpose::kDp, Phase::kF, owner_index,
                                 dpcp_group(owner, x), 0);
            g.stage = static_cast<int16_t>(x.p);
            g.chunk = static_cast<int16_t>(item.chunk);
            g.first_layer = static_cast<int32_t>(piece->first);
            g.layers = static_cast<int32_t>(piece->second - piece->first);
            g.flags |= kOpGradientBucket;
            const double value = gathered_value_bytes(owner, piece->first, piece->second);
            // The piece's forward waits for the last gather (the others precede it).
            param_gathers[item.chunk].emplace_back(
                *piece,
                emit_dp_collectives(rank, g, owner, x,
                                    bucket_bytes(owner, piece->first, piece->second, value),
                                    bucket_expert_bytes(owner, piece->first, piece->second, value))
                    .back());
          }
        }
        gathered_at_start_[rank].insert(owner_index);
      }
      // Received encoder outputs live from their forward until their backward (or the forward,
      // when no gradient flows back): peak in-flight count times the largest micro-batch.
      double largest_input = 0;
      int32_t in_flight = 0, peak_in_flight = 0;
      for (const ScheduleItem& item : order) {
        const int32_t mb = item.microbatch;
        const int64_t k = item.chunk * pp + x.p;  // virtual stage
        const bool first_virtual = k == 0, last_virtual = k == owner.chunks() - 1;
        const auto& samples = samples_of(owner_index, x.d, mb);
        Op about;
        about.module = static_cast<int16_t>(owner_index);
        about.stage = static_cast<int16_t>(x.p);
        about.chunk = static_cast<int16_t>(item.chunk);
        about.microbatch = mb;
        const double act_bytes =
            stage_message_bytes(owner, work_of(owner_index, samples).tokens,
                                owner.spec->transformer ? owner.spec->transformer->hidden : 0);
        std::vector<int32_t> deps;
        if (!item.backward) {
          // --- inputs
          // What arrives for this micro-batch: the producers' (under Entrain, the encoder
          // micro-batch of this number, whose rows this and the next LLM micro-batch take).
          const auto& arriving = samples_of(owner_index, x.d, mb, true);
          if (first_virtual && !producers.empty()) {
            double input = 0;
            for (const auto& [producer_host, producer_last] : producers)
              input += boundary_bytes(producer_last, owner_index, arriving);
            largest_input = std::max(largest_input, input);
            peak_in_flight = std::max(peak_in_flight, ++in_flight);
            if (!owner.flow.needs_input_grad) --in_flight;
          }
          if (first_virtual) {
            for (const auto& [producer_host, producer_last] : producers) {
              const ModuleInfo& prod = modules_[static_cast<std::size_t>(producer_host)];
              std::vector<int32_t> received;
              if (leader) {
                for (const Link& link :
                     boundary_links(producer_host, producer_last, owner_index, x.d, false, mb)) {
                  received.push_back(emit(
                      rank, boundary_message(about, OpKind::kRecv, Phase::kF,
                                             prod.rank({0, 0, link.producer, prod.layout.pp - 1}),
                                             producer_last, owner_index, link, mb)));
                }
              }
              share_boundary(rank, owner, x, Phase::kF, producer_last, mb,
                             boundary_bytes(producer_last, owner_index, arriving), received, deps);
            }
          } else {
            const int64_t prev_k = k - 1;
            const int64_t from = owner.rank({x.t, x.c, x.d, prev_k % pp});
            // Sends were emitted by the earlier stage when it ran this item (see below).
            deps.push_back(receive(
                rank, stage_message(about, OpKind::kRecv, Phase::kF, from, owner, x, act_bytes,
                                    MessageTag::stage(owner_index, prev_k, false, mb).packed())));
          }
          // --- compute
          int32_t last = -1;
          auto run = [&](const ModuleInfo& m, int64_t chunk_index, Phase phase,
                         std::span<const Sample* const> s, const LayerRange* piece = nullptr,
                         int32_t gather = -1) {
            Op op = compute(m, rank, static_cast<int32_t>(chunk_index), mb, phase, s, piece);
            op.deps = deps;
            if (gather >= 0) {
              op.deps.push_back(gather);
              op.flags |= kOpGradientBucket;
            }
            last = emit(rank, op);
            deps = {last};
            forward_of[{mb, item.chunk, m.index}] = last;
          };
          // Piece by piece, bottom up, each piece after its gather (`gather(u)` gives it, and may
          // emit it); the activations the pieces stash are the whole forward's, kept (and freed
          // by the backward) as one, from the last piece on.
          auto run_pieces = [&](const ModuleInfo& m, int64_t chunk_index,
                                std::span<const Sample* const> s,
                                const std::vector<LayerRange>& pieces, const auto& gather) {
            auto& ops = p_.ranks[static_cast<std::size_t>(rank)];
            double stash = 0;
            for (std::size_t u = 0; u < pieces.size(); ++u) {
              run(m, chunk_index, Phase::kF, s, &pieces[u], gather(u));
              stash += ops[static_cast<std::size_t>(last)].stash_bytes;
              ops[static_cast<std::size_t>(last)].stash_bytes = 0;
            }
            ops[static_cast<std::size_t>(last)].stash_bytes = stash;
          };
          // fully_sharded: every unit's weights gathered before it runs, and the next unit's
          // while it runs (FSDP2's prefetch: that gather waits for the compute before).
          auto run_sharded = [&](const ModuleInfo& m, int64_t chunk_index,
                                 std::span<const Sample* const> s) {
            const Coord xm = grid_of(m).coord(rank);
            if (!sharded(m, xm)) return run(m, chunk_index, Phase::kF, s);
            std::vector<LayerRange> units =
                sharded_units(m, m.chunk_layers[static_cast<std::size_t>(chunk_index)]);
            std::reverse(units.begin(), units.end());
            std::vector<int32_t> gathers;
            run_pieces(m, chunk_index, s, units, [&](std::size_t u) {
              return prefetched_gather(rank, m, xm, chunk_index, mb, units, u, Phase::kF, gathers);
            });
          };
          if (first_virtual)
            for (int i : prefix)
              run_sharded(modules_[static_cast<std::size_t>(i)], 0, samples_of(i, x.d, mb));
          if (!param_gathers.empty() && first_forward.at(item.chunk) == mb) {
            const auto& pieces = param_gathers.at(item.chunk);
            std::vector<LayerRange> ranges;
            for (const auto& [piece, gather] : pieces) ranges.push_back(piece);
            run_pieces(owner, k, samples, ranges, [&](std::size_t u) { return pieces[u].second; });
          } else {
            run_sharded(owner, k, samples);
          }
          if (last_virtual)
            for (int i : suffix) run_sharded(modules_[static_cast<std::size_t>(i)], 0, samples);
          forward_done[{mb, item.chunk}] = last;
          // --- outputs
          if (!last_virtual) {
            const int64_t next_k = k + 1;
            const int64_t to = owner.rank({x.t, x.c, x.d, next_k % pp});
            Op send = stage_message(about, OpKind::kSend, Phase::kF, to, owner, x, act_bytes,
                                    MessageTag::stage(owner_index, k, false, mb).packed());
            send.deps = {last};
            emit(rank, send);
          } else if (leader) {
            for (int consumer_host : consumers) {
              const ModuleInfo& cons = modules_[static_cast<std::size_t>(consumer_host)];
              for (const Link& link :
                   boundary_links(owner_index, last_module, consumer_host, x.d, true, mb)) {
                Op send = boundary_message(about, OpKind::kSend, Phase::kF,
                                           cons.rank({0, 0, link.consumer, 0}), last_module,
                                           consumer_host, link, mb);
                send.deps = {last};
                emit(rank, send);
              }
            }
          }
          continue;
        }

        // ---------------- backward ----------------
        if (!last_virtual) {
          const int64_t from = owner.rank({x.t, x.c, x.d, (k + 1) % pp});
          deps.push_back(receive(
              rank, stage_message(about, OpKind::kRecv, Phase::kB, from, owner, x, act_bytes,
                                  MessageTag::stage(owner_index, k + 1, true, mb).packed())));
        } else {
          // Gradients from consumers that send them back (the LLM's loss needs none).
          for (int consumer_host : consumers) {
            const ModuleInfo& cons = modules_[static_cast<std::size_t>(consumer_host)];
            if (!cons.flow.backward() || !(suffix_backward || owner_backward)) continue;
            std::vector<int32_t> received;
            if (leader) {
              for (const Link& link :
                   boundary_links(owner_index, last_module, consumer_host, x.d, true, mb)) {
                received.push_back(
                    emit(rank, boundary_message(about, OpKind::kRecv, Phase::kB,
                                                cons.rank({0, 0, link.consumer, 0}), last_module,
                                                consumer_host, link, mb)));
              }
            }
            share_boundary(rank, owner, x, Phase::kB, last_module, mb,
                           boundary_bytes(last_module, consumer_host, samples), received, deps);
          }
        }
        if (first_virtual && !producers.empty() && owner.flow.needs_input_grad) --in_flight;
        const int32_t fwd = forward_done.at({mb, item.chunk});
        deps.push_back(fwd);
        int32_t last = -1;
        auto run_back = [&](const ModuleInfo& m, int64_t chunk_index,
                            std::span<const Sample* const> s, int32_t at_mb) {
          if (!m.flow.backward()) return;
          const Coord xm = grid_of(m).coord(rank);
          // fully_sharded: unit by unit, each unit's weights gathered first (the next unit's
          // while it runs), recomputed and differentiated, its gradients reduce-scattered.
          const bool full = sharded(m, xm);
          if (recomputes(m) && !full) {
            Op r = compute(m, rank, static_cast<int32_t>(chunk_index), at_mb, Phase::kR, s);
            r.deps = deps;
            last = emit(rank, r);
            deps = {last};
          }
          // The whole chunk at once, or (its gradients reduced during this backward) piece by
          // piece, each bucket's reduction starting once its weight gradients are done.
          const bool bucketed =
              full || (overlap && m.index == owner_index && last_backward.at(item.chunk) == at_mb);
          const LayerRange layers = m.chunk_layers[static_cast<std::size_t>(chunk_index)];
          const std::vector<LayerRange> pieces = full       ? sharded_units(m, layers)
                                                 : bucketed ? gradient_buckets(m, chunk_index)
                                                            : std::vector<LayerRange>{layers};
          std::vector<int32_t> gathers;
          const auto flags = static_cast<uint32_t>((bucketed ? kOpGradientBucket : 0) |
                                                   (full ? kOpFullySharded : 0));
          for (std::size_t u = 0; u < pieces.size(); ++u) {
            const LayerRange& piece = pieces[u];
            auto piece_op = [&](Phase phase) {
              Op op = compute(m, rank, static_cast<int32_t>(chunk_index), at_mb, phase, s, &piece);
              op.flags |= flags;
              op.deps = deps;
              last = emit(rank, op);
              deps = {last};
            };
            if (full) {
              deps.push_back(prefetched_gather(rank, m, xm, chunk_index, at_mb, pieces, u,
                                               Phase::kB, gathers));
              if (recomputes(m) &&
                  piece.first < recompute_end(m, static_cast<int32_t>(chunk_index)))
                piece_op(Phase::kR);
            }
            piece_op(Phase::kB);
            if (m.flow.trainable) piece_op(Phase::kW);
            if (!bucketed || !m.flow.trainable) continue;
            Op c = collective_op(plan_.distributed_optimizer ? CollectiveKind::kReduceScatter
                                                             : CollectiveKind::kAllReduce,
                                 Purpose::kDp, Phase::kF, m.index, dpcp_group(grid_of(m), xm), 0);
            c.stage = static_cast<int16_t>(xm.p);
            c.chunk = chunk_of(m, chunk_index);
            c.first_layer = static_cast<int32_t>(piece.first);
            c.layers = static_cast<int32_t>(piece.second - piece.first);
            c.flags |= flags;
            if (full) c.microbatch = at_mb;  // one reduce-scatter of the unit per micro-batch
            c.deps = {last};  // the sum of replicated key/value gradients waits for it, then this
            c.deps = {
                sum_kv_replicas(rank, m, xm, bucket_kv_bytes(m, piece.first, piece.second), c)};
            const double value = gradient_value_bytes();
            for (int32_t id : emit_dp_collectives(
                     rank, c, m, xm, bucket_bytes(m, piece.first, piece.second, value),
                     bucket_expert_bytes(m, piece.first, piece.second, value)))
              bucket_reductions_[rank][m.index].push_back(id);
          }
          release(rank, last, forward_of, std::make_tuple(at_mb, item.chunk, m.index));
        };
        if (last_virtual)
          for (auto it = suffix.rbegin(); it != suffix.rend(); ++it)
            run_back(modules_[static_cast<std::size_t>(*it)], 0, samples, mb);
        run_back(owner, k, samples, mb);
        // The modules before the LLM in its first stage: each encoder micro-batch once the LLM
        // has every gradient of it (this one; under Entrain also the one before, or none).
        if (first_virtual && !prefix.empty())  // the owner is the LLM here
          for (int32_t i : encoder_microbatches_done(x.d, mb))
            for (auto it = prefix.rbegin(); it != prefix.rend(); ++it)
              run_back(modules_[static_cast<std::size_t>(*it)], 0, samples_of(*it, x.d, i), i);
        if (last < 0) continue;
        // --- gradient outputs
        if (!first_virtual && owner_backward) {
          const int64_t to = owner.rank({x.t, x.c, x.d, (k - 1) % pp});
          Op send = stage_message(about, OpKind::kSend, Phase::kB, to, owner, x, act_bytes,
                                  MessageTag::stage(owner_index, k, true, mb).packed());
          send.deps = {last};
          emit(rank, send);
        } else if (first_virtual && owner.flow.needs_input_grad) {
          // Each encoder micro-batch's gradient once the LLM has all of it (under Entrain
          // after this micro-batch or the next; otherwise this one).
          for (const int32_t i : encoder_microbatches_done(x.d, mb)) {
            Op about_i = about;
            about_i.microbatch = i;
            for (const auto& [producer_host, producer_last] : producers) {
              const ModuleInfo& prod = modules_[static_cast<std::size_t>(producer_host)];
              bool producer_needs = prod.flow.backward();
              for (const ModuleInfo& m : modules_)
                if (m.host == producer_host) producer_needs |= m.flow.backward();
              if (!producer_needs) continue;
              int32_t dep = last;
              if (owner.layout.cp > 1) {
                // Each CP rank holds the gradient of its tokens: sum over CP before sending.
                Op sum = collective_op(CollectiveKind::kAllReduce, Purpose::kBoundary, Phase::kB,
                                       producer_last, cp_group(owner, x),
                                       boundary_bytes(producer_last, owner_index,
                                                      samples_of(owner_index, x.d, i, true)));
                sum.microbatch = i;
                sum.deps = {last};
                dep = emit(rank, sum);
              }
              if (!leader) continue;
              for (const Link& link :
                   boundary_links(producer_host, producer_last, owner_index, x.d, false, i)) {
                Op send = boundary_message(about_i, OpKind::kSend, Phase::kB,
                                           prod.rank({0, 0, link.producer, prod.layout.pp - 1}),
                                           producer_last, owner_index, link, i);
                send.deps = {dep};
                emit(rank, send);
              }
            }
          }
        }
      }
      p_.memory[static_cast<std::size_t>(rank)].boundary_bytes += largest_input * peak_in_flight;
      // --- gradient reduction and optimizer, once per iteration
      std::vector<int> here{owner_index};
      if (x.p == 0) here.insert(here.end(), prefix.begin(), prefix.end());
      if (x.p == pp - 1) here.insert(here.end(), suffix.begin(), suffix.end());
      (void)vpp;
      gradient_reduction(rank, here);
    }
  }
}

}  // namespace tessera::lowering

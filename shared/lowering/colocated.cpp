// Lowering: the colocated placement. Every rank runs three phases: the encoders' forward over
// its whole local batch with the boundary regroup; the LLM's pipeline schedule over the detached
// encoder outputs; the outputs' gradients regrouped, one encoder backward for the whole batch,
// and one gradient reduction for all modules.
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

// One rank of a colocated plan: what the phases hand each other.
struct Lowering::ColocatedRank {
  int64_t rank = 0;
  Coord y;                                               // its place in the LLM's grid
  std::vector<int32_t> boundary_done;                    // what the LLM's first forward waits for
  std::map<int, int32_t> encoder_forward;                // module -> its F op
  std::vector<std::pair<int, int32_t>> boundary_groups;  // (output module, regroup group)
  std::vector<int> linked;     // outputs sent leader to leader (LLM pipeline)
  std::vector<int> regrouped;  // outputs regrouped in place (no LLM pipeline)
  std::map<std::pair<int32_t, int32_t>, int32_t> forward_done;  // (mb, chunk) -> LLM F op
  std::map<std::pair<int32_t, int>, int32_t> suffix_forward;    // (mb, generator) -> F op
  // overlap_grad_reduce: chunk -> the micro-batch of its last backward, during which the LLM's
  // gradients are reduced bucket by bucket
  std::map<int32_t, int32_t> last_backward;
  // overlap_param_gather: module -> its gathered buckets (an encoder's), and chunk -> the LLM's
  // with the micro-batch of the chunk's first forward, which runs in those pieces
  std::map<int, std::vector<std::pair<LayerRange, int32_t>>> encoder_gathers;
  std::map<int32_t, std::pair<int32_t, std::vector<std::pair<LayerRange, int32_t>>>> llm_gathers;
};

void Lowering::lower_colocated() {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  std::vector<int> encoders;  // everything before the LLM, topological
  std::vector<int> suffix;    // generators, in the LLM's last stage
  for (const ModuleSpec* s : topological_order(model_)) {
    const int i = static_cast<int>(s - model_.modules.data());
    if (i == llm_) continue;
    (s->role == ModuleRole::kGenerator ? suffix : encoders).push_back(i);
  }
  out_.notes.push_back(
      llm.layout.pp > 1
          ? "colocated boundary with an LLM pipeline: encoder leaders send each micro-batch's "
            "outputs to the LLM replica's first-stage leader, which broadcasts them"
          : "colocated boundary: the regroup all-gathers over the encoder replicas that share one "
            "LLM replica's batch; encoder and LLM grids are assumed aligned otherwise (Megatron "
            "MIMO's colocated layout)");
  bool suffix_backward = false;
  for (int i : suffix) suffix_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();
  for (int64_t rank = 0; rank < p_.world; ++rank) {
    ColocatedRank c;
    c.rank = rank;
    c.y = llm.coord(rank);
    const bool has_backward =
        llm.flow.backward() || (c.y.p == llm.layout.pp - 1 && suffix_backward);
    const std::vector<ScheduleItem> order = order_for(llm, c.y.p, has_backward);
    if (reduces_in_buckets(llm, c.y))
      for (const ScheduleItem& item : order)
        if (item.backward) c.last_backward[item.chunk] = item.microbatch;
    // overlap_param_gather: the step begins with the gathers of what the last step updated, in
    // the order the forwards need them.
    if (plan_.overlap_param_gather) {
      for (int i : encoders) {
        const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
        const Coord x = grid_of(m).coord(rank);
        if (reduces_in_buckets(m, x)) c.encoder_gathers[i] = gather_buckets_at_start(rank, m, x, 0);
      }
      if (reduces_in_buckets(llm, c.y))
        for (const ScheduleItem& item : order)
          if (!item.backward && c.llm_gathers.count(item.chunk) == 0)
            c.llm_gathers[item.chunk] = {
                item.microbatch,
                gather_buckets_at_start(rank, llm, c.y, item.chunk * llm.layout.pp + c.y.p)};
    }
    // Phase 1: every encoder's forward over its whole local batch, then the boundary regroup.
    for (int i : encoders) colocated_encoder_forward(c, i);
    // Phase 2: the LLM pipeline over detached encoder outputs.
    for (const ScheduleItem& item : order)
      if (item.backward)
        colocated_llm_backward(c, item, suffix);
      else
        colocated_llm_forward(c, item, suffix);
    // Phase 3: encoder-output gradients regrouped to every rank, one encoder backward for the
    // whole batch (its gradients reduced bucket by bucket during it under overlap_grad_reduce),
    // then the reduction of all the rest.
    std::vector<int32_t> deps = colocated_output_gradients(c);
    for (auto it = encoders.rbegin(); it != encoders.rend(); ++it) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(*it)];
      if (!m.flow.backward()) continue;
      const Coord x = grid_of(m).coord(rank);
      const auto& samples = samples_of(*it, x.d, -1);
      if (sharded(m, x)) {
        deps.push_back(c.encoder_forward[*it]);
        deps = {backward_units(rank, m, 0, -1, 0, samples, deps)};
      } else if (reduces_in_buckets(m, x)) {
        deps.push_back(c.encoder_forward[*it]);
        deps = {backward_in_buckets(rank, m, 0, -1, 0, samples, deps)};
      } else {
        for (const Phase phase : backward_phases(m)) {
          Op op = compute(m, rank, 0, -1, phase, samples);
          op.deps = deps;
          op.deps.push_back(c.encoder_forward[*it]);
          deps = {emit(rank, op)};
        }
      }
      release(rank, deps.front(), c.encoder_forward, *it);
    }
    std::vector<int> all{llm_};
    all.insert(all.end(), encoders.begin(), encoders.end());
    if (c.y.p == llm.layout.pp - 1) all.insert(all.end(), suffix.begin(), suffix.end());
    gradient_reduction(rank, all);
  }
}

void Lowering::colocated_encoder_forward(ColocatedRank& c, int i) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
  const int grid_index = m.host >= 0 ? m.host : i;
  const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
  const Coord x = grid.coord(c.rank);
  std::vector<int32_t> inputs;
  for (const std::string& in : m.spec->inputs) {
    const auto it =
        c.encoder_forward.find(static_cast<int>(find_module(model_, in) - model_.modules.data()));
    if (it != c.encoder_forward.end()) inputs.push_back(it->second);
  }
  const auto& samples = samples_of(i, x.d, -1);
  if (sharded(m, x)) {
    c.encoder_forward[i] = forward_units(c.rank, m, 0, -1, 0, samples, inputs);
  } else if (const auto gathered = c.encoder_gathers.find(i); gathered != c.encoder_gathers.end()) {
    c.encoder_forward[i] =
        forward_in_pieces(c.rank, m, 0, -1, 0, samples, inputs, gathered->second);
  } else {
    Op f = compute(m, c.rank, 0, -1, Phase::kF, samples);
    f.deps = inputs;
    c.encoder_forward[i] = emit(c.rank, f);
  }
  // Outputs feeding the LLM cross the boundary.
  if (std::find(llm.spec->inputs.begin(), llm.spec->inputs.end(), m.spec->name) ==
      llm.spec->inputs.end())
    return;
  const int64_t dp_e = grid.layout.dp, dp_l = llm.layout.dp;
  if (llm.layout.pp > 1) {
    // With an LLM pipeline only the LLM's first-stage ranks need the encoder outputs, and they
    // hold other replicas than the encoder ranks beside them: each encoder replica's leader
    // sends every micro-batch's rows to the leader of the LLM replica that uses them (as in a
    // non-colocated plan; nothing is sent to itself).
    c.linked.push_back(i);
    c.boundary_done.push_back(c.encoder_forward[i]);
    if (x.t != 0 || x.c != 0) return;
    for (int32_t mb = 0; mb < static_cast<int32_t>(microbatches_); ++mb)
      for (const Link& link : boundary_links(grid_index, i, llm_, x.d, true, mb)) {
        const int64_t to = llm.rank({0, 0, link.consumer, 0});
        if (to == c.rank) continue;
        Op about;
        about.microbatch = mb;
        Op send = boundary_message(about, OpKind::kSend, Phase::kF, to, i, llm_, link, mb);
        send.deps = {c.encoder_forward[i]};
        emit(c.rank, send);
      }
    return;
  }
  c.regrouped.push_back(i);
  // The (gathered) encoder outputs stay in memory from phase 1 until the LLM has run.
  p_.memory[static_cast<std::size_t>(c.rank)].boundary_bytes += boundary_bytes(
      i, llm_, dp_e > dp_l ? samples_of(llm_, x.d / (dp_e / dp_l), -1) : samples_of(i, x.d, -1));
  if (dp_e > dp_l) {
    // Fan-in: all-gather along the batch over the k encoder replicas of one LLM replica.
    const int64_t k = dp_e / dp_l, base = x.d - x.d % k;
    RankList members;
    for (int64_t e = base; e < base + k; ++e) members.push_back(grid.rank({x.t, x.c, e, x.p}));
    const int32_t g = group(members);
    Op gather = collective_op(CollectiveKind::kAllGather, Purpose::kBoundary, Phase::kF, i, g,
                              boundary_bytes(i, llm_, samples_of(llm_, x.d / k, -1)));
    gather.deps = {c.encoder_forward[i]};
    c.boundary_done.push_back(emit(c.rank, gather));
    c.boundary_groups.emplace_back(i, g);
    return;
  }
  c.boundary_done.push_back(c.encoder_forward[i]);  // identity or fan-out: this rank's slice
  if (dp_e < dp_l) {
    // Fan-out: the LLM replicas sharing this encoder replica each hold the gradients of their
    // own samples; the backward all-gathers them (ALGORITHMS.md §3). The ranks of those
    // replicas at this rank's LLM (tp, cp) and the first pipeline stage.
    const int64_t k = dp_l / dp_e;
    RankList members;
    for (int64_t d = x.d * k; d < (x.d + 1) * k; ++d)
      members.push_back(llm.rank({c.y.t, c.y.c, d, 0}));
    c.boundary_groups.emplace_back(i, group(members));
  }
}

void Lowering::colocated_llm_forward(ColocatedRank& c, const ScheduleItem& item,
                                     const std::vector<int>& suffix) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t pp = llm.layout.pp;
  const StageItem s = stage_item(llm, c.y, item);
  // --- input: the encoder outputs (phase 1's regroup, or the leaders' boundary messages), or
  // the previous virtual stage's activations
  std::vector<int32_t> deps;
  if (s.k == 0) {
    deps = c.boundary_done;
    for (int i : c.linked) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
      const int grid_index = m.host >= 0 ? m.host : i;
      const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
      std::vector<int32_t> received;
      if (c.y.t == 0 && c.y.c == 0)
        for (const Link& link : boundary_links(grid_index, i, llm_, c.y.d, false, s.mb)) {
          const int64_t from = grid.rank({0, 0, link.producer, 0});
          if (from == c.rank) continue;
          received.push_back(emit(c.rank, boundary_message(s.about, OpKind::kRecv, Phase::kF, from,
                                                           i, llm_, link, s.mb)));
        }
      share_boundary(c.rank, llm, c.y, Phase::kF, i, s.mb, boundary_bytes(i, llm_, *s.samples),
                     received, deps);
    }
  } else {
    deps.push_back(receive(
        c.rank,
        stage_message(s.about, OpKind::kRecv, Phase::kF,
                      llm.rank({c.y.t, c.y.c, c.y.d, (s.k - 1) % pp}), llm, c.y, s.act_bytes,
                      MessageTag::stage(llm_, s.k - 1, false, s.mb).packed())));
  }
  // --- compute: the LLM's chunk (its first forward in its gathered pieces), then the
  // generators in its last stage
  int32_t done = -1;
  const auto gathered = c.llm_gathers.find(item.chunk);
  if (sharded(llm, c.y)) {
    done = forward_units(c.rank, llm, s.k, s.mb, 0, *s.samples, deps);
  } else if (gathered != c.llm_gathers.end() && gathered->second.first == s.mb) {
    done = forward_in_pieces(c.rank, llm, s.k, s.mb, 0, *s.samples, deps, gathered->second.second);
  } else {
    Op f = compute(llm, c.rank, static_cast<int32_t>(s.k), s.mb, Phase::kF, *s.samples);
    f.deps = deps;
    done = emit(c.rank, f);
  }
  c.forward_done[{s.mb, item.chunk}] = done;
  if (s.k == llm.chunks() - 1)
    for (int i : suffix) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
      if (sharded(m, grid_of(m).coord(c.rank))) {
        done = forward_units(c.rank, m, 0, s.mb, 0, *s.samples, {done});
      } else {
        Op g = compute(m, c.rank, 0, s.mb, Phase::kF, *s.samples);
        g.deps = {done};
        done = emit(c.rank, g);
      }
      c.suffix_forward[{s.mb, i}] = done;
    }
  // --- output: to the next virtual stage
  if (s.k < llm.chunks() - 1) {
    Op send = stage_message(s.about, OpKind::kSend, Phase::kF,
                            llm.rank({c.y.t, c.y.c, c.y.d, (s.k + 1) % pp}), llm, c.y, s.act_bytes,
                            MessageTag::stage(llm_, s.k, false, s.mb).packed());
    send.deps = {done};
    emit(c.rank, send);
  }
}

void Lowering::colocated_llm_backward(ColocatedRank& c, const ScheduleItem& item,
                                      const std::vector<int>& suffix) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t pp = llm.layout.pp;
  const StageItem s = stage_item(llm, c.y, item);
  // --- output's gradient from the next virtual stage
  std::vector<int32_t> deps;
  if (s.k < llm.chunks() - 1)
    deps.push_back(receive(
        c.rank, stage_message(s.about, OpKind::kRecv, Phase::kB,
                              llm.rank({c.y.t, c.y.c, c.y.d, (s.k + 1) % pp}), llm, c.y,
                              s.act_bytes, MessageTag::stage(llm_, s.k + 1, true, s.mb).packed())));
  deps.push_back(c.forward_done.at({s.mb, item.chunk}));
  // --- compute, in reverse: the generators in the last stage, then the LLM's chunk
  int32_t last = -1;
  auto backward = [&](const ModuleInfo& m, int64_t k_chunk) {
    if (sharded(m, grid_of(m).coord(c.rank))) {
      last = backward_units(c.rank, m, k_chunk, s.mb, 0, *s.samples, deps);
      deps = {last};
      return;
    }
    for (const Phase phase : backward_phases(m)) {
      Op op = compute(m, c.rank, static_cast<int32_t>(k_chunk), s.mb, phase, *s.samples);
      op.deps = deps;
      last = emit(c.rank, op);
      deps = {last};
    }
  };
  if (s.k == llm.chunks() - 1)
    for (auto it = suffix.rbegin(); it != suffix.rend(); ++it) {
      backward(modules_[static_cast<std::size_t>(*it)], 0);
      release(c.rank, last, c.suffix_forward, std::make_pair(s.mb, *it));
    }
  if (llm.flow.backward()) {
    const auto bucketed = c.last_backward.find(item.chunk);
    if (!sharded(llm, c.y) && bucketed != c.last_backward.end() && bucketed->second == s.mb)
      last = backward_in_buckets(c.rank, llm, s.k, s.mb, 0, *s.samples, deps);
    else
      backward(llm, s.k);
    release(c.rank, last, c.forward_done, std::make_pair(s.mb, item.chunk));
  }
  // --- input's gradient: to the encoder leaders, or to the previous virtual stage
  if (s.k == 0 && llm.flow.needs_input_grad && last >= 0)
    for (int i : c.linked) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
      if (!m.flow.backward()) continue;
      const int grid_index = m.host >= 0 ? m.host : i;
      const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
      int32_t ready = last;
      if (llm.layout.cp > 1) {
        // Each CP rank holds the gradient of its own tokens' rows: summed over CP first.
        Op sum = collective_op(CollectiveKind::kAllReduce, Purpose::kBoundary, Phase::kB, i,
                               cp_group(llm, c.y), boundary_bytes(i, llm_, *s.samples));
        sum.microbatch = s.mb;
        sum.deps = {last};
        ready = emit(c.rank, sum);
      }
      if (c.y.t != 0 || c.y.c != 0) continue;
      for (const Link& link : boundary_links(grid_index, i, llm_, c.y.d, false, s.mb)) {
        const int64_t to = grid.rank({0, 0, link.producer, 0});
        if (to == c.rank) continue;
        Op send = boundary_message(s.about, OpKind::kSend, Phase::kB, to, i, llm_, link, s.mb);
        send.deps = {ready};
        emit(c.rank, send);
      }
    }
  if (s.k > 0 && llm.flow.backward()) {
    Op send = stage_message(s.about, OpKind::kSend, Phase::kB,
                            llm.rank({c.y.t, c.y.c, c.y.d, (s.k - 1) % pp}), llm, c.y, s.act_bytes,
                            MessageTag::stage(llm_, s.k, true, s.mb).packed());
    send.deps = {last};
    emit(c.rank, send);
  }
}

std::vector<int32_t> Lowering::colocated_output_gradients(ColocatedRank& c) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  std::vector<int32_t> grads_ready;
  std::map<int, int32_t> cp_summed;  // output module -> its gradient's sum over the LLM's CP
  if (llm.layout.cp > 1 && llm.flow.needs_input_grad)
    for (int i : c.regrouped) {
      if (!modules_[static_cast<std::size_t>(i)].flow.backward()) continue;
      // Each CP rank holds the gradient of its own tokens' rows of the replica's batch.
      Op sum =
          collective_op(CollectiveKind::kAllReduce, Purpose::kBoundary, Phase::kB, i,
                        cp_group(llm, c.y), boundary_bytes(i, llm_, samples_of(llm_, c.y.d, -1)));
      if (const int32_t dep = last_compute(c.rank); dep >= 0) sum.deps = {dep};
      cp_summed[i] = emit(c.rank, sum);
      grads_ready.push_back(cp_summed[i]);
    }
  for (const auto& [i, g] : c.boundary_groups) {
    if (g < 0 || !modules_[static_cast<std::size_t>(i)].flow.backward() ||
        !llm.flow.needs_input_grad)
      continue;
    const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    const ModuleInfo& grid = m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
    // The gradients of the encoder outputs the LLM replica(s) of this group used.
    const int64_t dp_e = grid.layout.dp, dp_l = llm.layout.dp;
    const int64_t d = grid.coord(c.rank).d;
    Op gather = collective_op(
        CollectiveKind::kAllGather, Purpose::kBoundary, Phase::kB, i, g,
        boundary_bytes(
            i, llm_, dp_e > dp_l ? samples_of(llm_, d / (dp_e / dp_l), -1) : samples_of(i, d, -1)));
    if (const auto summed = cp_summed.find(i); summed != cp_summed.end())
      gather.deps = {summed->second};
    else if (const int32_t dep = last_compute(c.rank); dep >= 0)
      gather.deps = {dep};
    grads_ready.push_back(emit(c.rank, gather));
  }
  for (int i : c.linked) {
    const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    if (!m.flow.backward() || !llm.flow.needs_input_grad) continue;
    const int grid_index = m.host >= 0 ? m.host : i;
    const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
    const Coord x = grid.coord(c.rank);
    for (int32_t mb = 0; mb < static_cast<int32_t>(microbatches_); ++mb) {
      std::vector<int32_t> received;
      if (x.t == 0 && x.c == 0)
        for (const Link& link : boundary_links(grid_index, i, llm_, x.d, true, mb)) {
          const int64_t from = llm.rank({0, 0, link.consumer, 0});
          if (from == c.rank) continue;
          Op about;
          about.microbatch = mb;
          Op recv = boundary_message(about, OpKind::kRecv, Phase::kB, from, i, llm_, link, mb);
          if (const int32_t dep = last_compute(c.rank); dep >= 0) recv.deps = {dep};
          received.push_back(emit(c.rank, recv));
        }
      share_boundary(c.rank, grid, x, Phase::kB, i, mb,
                     boundary_bytes(i, llm_, samples_of(i, x.d, mb)), received, grads_ready);
    }
  }
  return grads_ready;
}

}  // namespace tessera::lowering

// Lowering: the colocated placement (three phases: encoders, boundary, LLM).
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

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
  for (int64_t rank = 0; rank < p_.world; ++rank) {
    // Phase 1: every encoder's forward over its whole local batch, then the boundary regroup.
    std::vector<int32_t> boundary_done;
    std::map<int, int32_t> encoder_forward;  // module -> its F op
    std::vector<std::pair<int, int32_t>>
        boundary_groups;         // (projector/encoder output module, group)
    std::vector<int> linked;     // outputs sent leader to leader (LLM pipeline)
    std::vector<int> regrouped;  // outputs regrouped in place (no LLM pipeline)
    for (int i : encoders) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
      const ModuleInfo& grid = m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
      const Coord x = grid.coord(rank);
      const auto& samples = samples_of(i, x.d, -1);
      Op f = compute(m, rank, 0, -1, Phase::kF, samples);
      for (const std::string& in : m.spec->inputs) {
        const auto it =
            encoder_forward.find(static_cast<int>(find_module(model_, in) - model_.modules.data()));
        if (it != encoder_forward.end()) f.deps.push_back(it->second);
      }
      encoder_forward[i] = emit(rank, f);
      // Outputs feeding the LLM cross the boundary.
      const bool feeds_llm = std::find(llm.spec->inputs.begin(), llm.spec->inputs.end(),
                                       m.spec->name) != llm.spec->inputs.end();
      if (!feeds_llm) continue;
      const int64_t dp_e = grid.layout.dp, dp_l = llm.layout.dp;
      const int grid_index = m.host >= 0 ? m.host : i;
      if (llm.layout.pp > 1) {
        // With an LLM pipeline only the LLM's first-stage ranks need the encoder outputs, and
        // they hold other replicas than the encoder ranks beside them: each encoder replica's
        // leader sends every micro-batch's rows to the leader of the LLM replica that uses them
        // (as in a non-colocated plan; nothing is sent to itself).
        linked.push_back(i);
        boundary_done.push_back(encoder_forward[i]);
        if (x.t != 0 || x.c != 0) continue;
        for (int32_t mb = 0; mb < static_cast<int32_t>(microbatches_); ++mb)
          for (const Link& link : boundary_links(grid_index, i, llm_, x.d, true, mb)) {
            const int64_t to = llm.rank({0, 0, link.consumer, 0});
            if (to == rank) continue;
            Op about;
            about.microbatch = mb;
            Op send = boundary_message(about, OpKind::kSend, Phase::kF, to, i, llm_, link, mb);
            send.deps = {encoder_forward[i]};
            emit(rank, send);
          }
        continue;
      }
      regrouped.push_back(i);
      // The (gathered) encoder outputs stay in memory from phase 1 until the LLM has run.
      p_.memory[static_cast<std::size_t>(rank)].boundary_bytes += boundary_bytes(
          i, llm_,
          dp_e > dp_l ? samples_of(llm_, x.d / (dp_e / dp_l), -1) : samples_of(i, x.d, -1));
      if (dp_e > dp_l) {
        // Fan-in: all-gather along the batch over the k encoder replicas of one LLM replica.
        const int64_t k = dp_e / dp_l, base = x.d - x.d % k;
        RankList members;
        for (int64_t e = base; e < base + k; ++e) members.push_back(grid.rank({x.t, x.c, e, x.p}));
        const int32_t g = group(members);
        Op gather = collective_op(CollectiveKind::kAllGather, Purpose::kBoundary, Phase::kF, i, g,
                                  boundary_bytes(i, llm_, samples_of(llm_, x.d / k, -1)));
        gather.deps = {encoder_forward[i]};
        boundary_done.push_back(emit(rank, gather));
        boundary_groups.emplace_back(i, g);
      } else {
        boundary_done.push_back(encoder_forward[i]);  // identity or fan-out: keep this rank's slice
        if (dp_e < dp_l) {
          // Fan-out: the LLM replicas sharing this encoder replica each hold the gradients of
          // their own samples; the backward all-gathers them (ALGORITHMS.md §3). The ranks of
          // those replicas at this rank's LLM (tp, cp) and the first pipeline stage.
          const int64_t k = dp_l / dp_e;
          const Coord y = llm.coord(rank);
          RankList members;
          for (int64_t d = x.d * k; d < (x.d + 1) * k; ++d)
            members.push_back(llm.rank({y.t, y.c, d, 0}));
          boundary_groups.emplace_back(i, group(members));
        }
      }
    }
    // Phase 2: the LLM pipeline over detached encoder outputs.
    const Coord y = llm.coord(rank);
    const int64_t pp = llm.layout.pp;
    bool suffix_backward = false;
    for (int i : suffix) suffix_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();
    const bool has_backward = llm.flow.backward() || (y.p == pp - 1 && suffix_backward);
    std::map<std::pair<int32_t, int32_t>, int32_t> forward_done;
    std::map<std::pair<int32_t, int>, int32_t> suffix_forward;  // (mb, generator) -> F op
    for (const ScheduleItem& item : order_for(llm, y.p, has_backward)) {
      const int32_t mb = item.microbatch;
      const int64_t k = item.chunk * pp + y.p;
      const auto& samples = samples_of(llm_, y.d, mb);
      const ModuleWork& w = work_of(llm_, samples);
      const double act_bytes = stage_message_bytes(llm, w.tokens, llm.spec->transformer->hidden);
      Op about;
      about.module = static_cast<int16_t>(llm_);
      about.stage = static_cast<int16_t>(y.p);
      about.chunk = static_cast<int16_t>(item.chunk);
      about.microbatch = mb;
      std::vector<int32_t> deps;
      if (!item.backward) {
        if (k == 0) {
          deps = boundary_done;
          for (int i : linked) {
            const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
            const int grid_index = m.host >= 0 ? m.host : i;
            const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
            std::vector<int32_t> received;
            if (y.t == 0 && y.c == 0)
              for (const Link& link : boundary_links(grid_index, i, llm_, y.d, false, mb)) {
                const int64_t from = grid.rank({0, 0, link.producer, 0});
                if (from == rank) continue;
                received.push_back(emit(rank, boundary_message(about, OpKind::kRecv, Phase::kF,
                                                               from, i, llm_, link, mb)));
              }
            share_boundary(rank, llm, y, Phase::kF, i, mb, boundary_bytes(i, llm_, samples),
                           received, deps);
          }
        } else {
          deps.push_back(receive(
              rank, stage_message(about, OpKind::kRecv, Phase::kF,
                                  llm.rank({y.t, y.c, y.d, (k - 1) % pp}), llm, y, act_bytes,
                                  MessageTag::stage(llm_, k - 1, false, mb).packed())));
        }
        Op f = compute(llm, rank, static_cast<int32_t>(k), mb, Phase::kF, samples);
        f.deps = deps;
        int32_t done = emit(rank, f);
        forward_done[{mb, item.chunk}] = done;
        if (k == llm.chunks() - 1)
          for (int i : suffix) {
            Op g = compute(modules_[static_cast<std::size_t>(i)], rank, 0, mb, Phase::kF, samples);
            g.deps = {done};
            done = emit(rank, g);
            suffix_forward[{mb, i}] = done;
          }
        if (k < llm.chunks() - 1) {
          Op send = stage_message(about, OpKind::kSend, Phase::kF,
                                  llm.rank({y.t, y.c, y.d, (k + 1) % pp}), llm, y, act_bytes,
                                  MessageTag::stage(llm_, k, false, mb).packed());
          send.deps = {done};
          emit(rank, send);
        }
        continue;
      }
      if (k < llm.chunks() - 1) {
        deps.push_back(receive(
            rank,
            stage_message(about, OpKind::kRecv, Phase::kB, llm.rank({y.t, y.c, y.d, (k + 1) % pp}),
                          llm, y, act_bytes, MessageTag::stage(llm_, k + 1, true, mb).packed())));
      }
      deps.push_back(forward_done.at({mb, item.chunk}));
      int32_t last = -1;
      if (k == llm.chunks() - 1)
        for (auto it = suffix.rbegin(); it != suffix.rend(); ++it) {
          const ModuleInfo& g = modules_[static_cast<std::size_t>(*it)];
          for (Phase phase : {Phase::kR, Phase::kB, Phase::kW}) {
            if (phase == Phase::kR && !recomputes(g)) continue;
            if (phase == Phase::kW && !g.flow.trainable) continue;
            Op op = compute(g, rank, 0, mb, phase, samples);
            op.deps = deps;
            last = emit(rank, op);
            deps = {last};
          }
          release(rank, last, suffix_forward, std::make_pair(mb, *it));
        }
      for (Phase phase : {Phase::kR, Phase::kB, Phase::kW}) {
        if (!llm.flow.backward()) break;
        if (phase == Phase::kR && !recomputes(llm)) continue;
        if (phase == Phase::kW && !llm.flow.trainable) continue;
        Op op = compute(llm, rank, static_cast<int32_t>(k), mb, phase, samples);
        op.deps = deps;
        last = emit(rank, op);
        deps = {last};
      }
      if (llm.flow.backward()) release(rank, last, forward_done, std::make_pair(mb, item.chunk));
      if (k == 0 && llm.flow.needs_input_grad && last >= 0)
        for (int i : linked) {
          const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
          if (!m.flow.backward()) continue;
          const int grid_index = m.host >= 0 ? m.host : i;
          const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
          int32_t ready = last;
          if (llm.layout.cp > 1) {
            // Each CP rank holds the gradient of its own tokens' rows: summed over CP first.
            Op sum = collective_op(CollectiveKind::kAllReduce, Purpose::kBoundary, Phase::kB, i,
                                   cp_group(llm, y), boundary_bytes(i, llm_, samples));
            sum.microbatch = mb;
            sum.deps = {last};
            ready = emit(rank, sum);
          }
          if (y.t != 0 || y.c != 0) continue;
          for (const Link& link : boundary_links(grid_index, i, llm_, y.d, false, mb)) {
            const int64_t to = grid.rank({0, 0, link.producer, 0});
            if (to == rank) continue;
            Op send = boundary_message(about, OpKind::kSend, Phase::kB, to, i, llm_, link, mb);
            send.deps = {ready};
            emit(rank, send);
          }
        }
      if (k > 0 && llm.flow.backward()) {
        Op send =
            stage_message(about, OpKind::kSend, Phase::kB, llm.rank({y.t, y.c, y.d, (k - 1) % pp}),
                          llm, y, act_bytes, MessageTag::stage(llm_, k, true, mb).packed());
        send.deps = {last};
        emit(rank, send);
      }
    }
    // Phase 3: encoder-output gradients regrouped to every rank, one encoder backward for the
    // whole batch, then one gradient reduction for all modules.
    std::vector<int32_t> grads_ready;
    std::map<int, int32_t> cp_summed;  // output module -> its gradient's sum over the LLM's CP
    if (llm.layout.cp > 1 && llm.flow.needs_input_grad)
      for (int i : regrouped) {
        if (!modules_[static_cast<std::size_t>(i)].flow.backward()) continue;
        // Each CP rank holds the gradient of its own tokens' rows of the replica's batch.
        Op sum =
            collective_op(CollectiveKind::kAllReduce, Purpose::kBoundary, Phase::kB, i,
                          cp_group(llm, y), boundary_bytes(i, llm_, samples_of(llm_, y.d, -1)));
        if (const int32_t dep = last_compute(rank); dep >= 0) sum.deps = {dep};
        cp_summed[i] = emit(rank, sum);
        grads_ready.push_back(cp_summed[i]);
      }
    for (const auto& [i, g] : boundary_groups) {
      if (g < 0 || !modules_[static_cast<std::size_t>(i)].flow.backward() ||
          !llm.flow.needs_input_grad)
        continue;
      const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
      const ModuleInfo& grid = m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
      // The gradients of the encoder outputs the LLM replica(s) of this group used.
      const int64_t dp_e = grid.layout.dp, dp_l = llm.layout.dp;
      Op gather = collective_op(
          CollectiveKind::kAllGather, Purpose::kBoundary, Phase::kB, i, g,
          boundary_bytes(i, llm_,
                         dp_e > dp_l ? samples_of(llm_, grid.coord(rank).d / (dp_e / dp_l), -1)
                                     : samples_of(i, grid.coord(rank).d, -1)));
      if (const auto summed = cp_summed.find(i); summed != cp_summed.end())
        gather.deps = {summed->second};
      else if (const int32_t dep = last_compute(rank); dep >= 0)
        gather.deps = {dep};
      grads_ready.push_back(emit(rank, gather));
    }
    for (int i : linked) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
      if (!m.flow.backward() || !llm.flow.needs_input_grad) continue;
      const int grid_index = m.host >= 0 ? m.host : i;
      const ModuleInfo& grid = modules_[static_cast<std::size_t>(grid_index)];
      const Coord x = grid.coord(rank);
      for (int32_t mb = 0; mb < static_cast<int32_t>(microbatches_); ++mb) {
        std::vector<int32_t> received;
        if (x.t == 0 && x.c == 0)
          for (const Link& link : boundary_links(grid_index, i, llm_, x.d, true, mb)) {
            const int64_t from = llm.rank({0, 0, link.consumer, 0});
            if (from == rank) continue;
            Op about;
            about.microbatch = mb;
            Op recv = boundary_message(about, OpKind::kRecv, Phase::kB, from, i, llm_, link, mb);
            const int32_t dep = last_compute(rank);
            if (dep >= 0) recv.deps = {dep};
            received.push_back(emit(rank, recv));
          }
        share_boundary(rank, grid, x, Phase::kB, i, mb,
                       boundary_bytes(i, llm_, samples_of(i, x.d, mb)), received, grads_ready);
      }
    }
    std::vector<int32_t> deps = grads_ready;
    for (auto it = encoders.rbegin(); it != encoders.rend(); ++it) {
      const ModuleInfo& m = modules_[static_cast<std::size_t>(*it)];
      if (!m.flow.backward()) continue;
      const ModuleInfo& grid = m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
      const Coord x = grid.coord(rank);
      const auto& samples = samples_of(*it, x.d, -1);
      for (Phase phase : {Phase::kR, Phase::kB, Phase::kW}) {
        if (phase == Phase::kR && !recomputes(m)) continue;
        if (phase == Phase::kW && !m.flow.trainable) continue;
        Op op = compute(m, rank, 0, -1, phase, samples);
        op.deps = deps;
        op.deps.push_back(encoder_forward[*it]);
        deps = {emit(rank, op)};
      }
      release(rank, deps.front(), encoder_forward, *it);
    }
    std::vector<int> all{llm_};
    all.insert(all.end(), encoders.begin(), encoders.end());
    if (y.p == llm.layout.pp - 1) all.insert(all.end(), suffix.begin(), suffix.end());
    gradient_reduction(rank, all);
  }
}

}  // namespace tessera::lowering

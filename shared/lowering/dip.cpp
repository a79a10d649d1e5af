// Lowering: schedule dip (modality-aware pipeline segments).
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

std::vector<Lowering::DipSegment> Lowering::dip_segments() {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t P = llm.layout.pp;
  std::vector<int> encoders = dip_.segment_order;
  for (const ModuleSpec* s : topological_order(model_)) {
    const int i = static_cast<int>(s - model_.modules.data());
    if (s->role == ModuleRole::kEncoder &&
        std::find(encoders.begin(), encoders.end(), i) == encoders.end())
      encoders.push_back(i);
  }
  std::vector<DipSegment> segments;
  for (int e : encoders) {
    DipSegment seg;
    seg.encoder = e;
    // The projectors the encoder's output passes through on its way to the LLM.
    std::string last = model_.modules[static_cast<std::size_t>(e)].name;
    for (bool found = true; found;) {
      found = false;
      for (const ModuleSpec* s : topological_order(model_))
        if (s->role == ModuleRole::kProjector &&
            std::find(s->inputs.begin(), s->inputs.end(), last) != s->inputs.end()) {
          seg.projectors.push_back(static_cast<int>(s - model_.modules.data()));
          last = s->name;
          found = true;
          break;
        }
    }
    const ModuleInfo& enc = modules_[static_cast<std::size_t>(e)];
    bool projector_backward = false;
    for (int i : seg.projectors)
      projector_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();
    seg.backward_from = enc.flow.backward()  ? 0
                        : projector_backward ? static_cast<int32_t>(P - 1)
                                             : static_cast<int32_t>(P);
    seg.pieces.resize(static_cast<std::size_t>(llm.layout.dp));
    for (int64_t d = 0; d < llm.layout.dp; ++d) {
      for (int32_t mb = 0; mb < static_cast<int32_t>(microbatches_); ++mb) {
        const auto& samples = samples_of(llm_, d, mb);
        const auto items = dip_media_items(model_, *enc.spec, samples);
        const std::vector<std::size_t> first = dip_piece_starts(
            model_, *enc.spec, samples, items, llm.layout.vpp, workload_.max_seq_len);
        auto& pieces = seg.pieces[static_cast<std::size_t>(d)].emplace_back();
        for (std::size_t j = 0; j < first.size(); ++j) {
          const std::size_t end = j + 1 < first.size() ? first[j + 1] : items.size();
          // Items of one sample stay one sample (its media side by side, as the encoder sees them).
          std::vector<const Sample*>& set = piece_sets_.emplace_back();
          std::size_t owner = SIZE_MAX;  // none yet
          for (std::size_t i = first[j]; i < end; ++i) {
            if (items[i].first != owner) {
              owner = items[i].first;
              set.push_back(&piece_samples_.emplace_back());
            }
            Sample& piece = piece_samples_.back();
            const Sample& item = items[i].second;
            piece.images.insert(piece.images.end(), item.images.begin(), item.images.end());
            piece.videos.insert(piece.videos.end(), item.videos.begin(), item.videos.end());
            piece.audio_seconds.insert(piece.audio_seconds.end(), item.audio_seconds.begin(),
                                       item.audio_seconds.end());
          }
          pieces.push_back(&set);
        }
      }
    }
    segments.push_back(std::move(seg));
  }
  return segments;
}

void Lowering::lower_dip() {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t P = llm.layout.pp, V = llm.layout.vpp;
  const int32_t last_v = static_cast<int32_t>(P * V - 1);
  const std::vector<DipSegment> segments = dip_segments();
  // Every segment runs on the LLM's grid: its TP ranks exchange the stage messages.
  auto activation = [&](const ModuleInfo& m, std::span<const Sample* const> samples) {
    return stage_message_bytes(llm, work_of(m.index, samples).tokens,
                               m.spec->transformer ? m.spec->transformer->hidden : 0);
  };
  auto module_at = [&](int i) -> const ModuleInfo& {
    return modules_[static_cast<std::size_t>(i)];
  };
  auto segment_last = [&](const DipSegment& g) {
    return g.projectors.empty() ? g.encoder : g.projectors.back();
  };
  auto piece = [&](const DipSegment& g, int64_t d, int32_t mb, int32_t sub) {
    return std::span<const Sample* const>(*g.pieces[static_cast<std::size_t>(
        d)][static_cast<std::size_t>(mb)][static_cast<std::size_t>(sub)]);
  };
  int64_t pieces = 0, media_microbatches = 0;
  for (const DipSegment& g : segments)
    for (const auto& replica : g.pieces)
      for (const auto& mb : replica) {
        pieces += static_cast<int64_t>(mb.size());
        media_microbatches += mb.empty() ? 0 : 1;
      }

  for (int64_t d = 0; d < llm.layout.dp; ++d) {
    // The replica's stage orders, from its own micro-batches' estimated work.
    DipPipeline pipe;
    pipe.stages = static_cast<int32_t>(P);
    pipe.llm_chunks = static_cast<int32_t>(V);
    pipe.microbatches = static_cast<int32_t>(microbatches_);
    pipe.llm_backward = llm.flow.backward();
    for (const DipSegment& g : segments) {
      DipPipeline::Segment& seg = pipe.segments.emplace_back();
      for (const auto& mb : g.pieces[static_cast<std::size_t>(d)])
        seg.subs.push_back(static_cast<int32_t>(mb.size()));
      seg.backward_from = g.backward_from;
    }
    pipe.seconds = [&](const DipStep& s, int32_t stage) {
      const int64_t rank = llm.rank({0, 0, d, stage});
      auto cost = [&](const ModuleInfo& m, int32_t k, std::span<const Sample* const> samples) {
        double flops = compute(m, rank, k, s.microbatch, Phase::kF, samples).flops;
        if (s.backward)
          flops =
              compute(m, rank, k, s.microbatch, Phase::kB, samples).flops +
              (m.flow.trainable ? compute(m, rank, k, s.microbatch, Phase::kW, samples).flops : 0);
        return flops;
      };
      if (s.segment < 0)
        return cost(llm, static_cast<int32_t>(s.chunk * P + stage),
                    samples_of(llm_, d, s.microbatch));
      const DipSegment& g = segments[static_cast<std::size_t>(s.segment)];
      const auto samples = piece(g, d, s.microbatch, s.sub);
      double flops = cost(module_at(g.encoder), stage, samples);
      if (stage == P - 1)
        for (int i : g.projectors) flops += cost(module_at(i), 0, samples);
      return flops;
    };
    pipe.llm_input_grad = llm.flow.needs_input_grad;
    pipe.output_bytes = [&](const DipStep& s) {
      const DipSegment& g = segments[static_cast<std::size_t>(s.segment)];
      return boundary_bytes(segment_last(g), llm_, piece(g, d, s.microbatch, s.sub));
    };
    const DipOrders dip_orders_of_replica = dip_orders(pipe, dip_);
    const std::vector<std::vector<DipStep>>& orders = dip_orders_of_replica.stages;

    for (int64_t stage = 0; stage < P; ++stage) {
      for (int64_t t = 0; t < llm.layout.tp; ++t) {
        const int64_t rank = llm.rank({t, 0, d, stage});
        auto rank_at = [&](int64_t st) { return llm.rank({t, 0, d, st}); };
        // (segment, chunk, mb, sub) -> the forward's last compute op
        std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, int32_t> forward_done;
        std::map<std::tuple<int32_t, int32_t, int32_t, int>, int32_t> forward_of;  // + module
        for (const DipStep& step : orders[static_cast<std::size_t>(stage)]) {
          const int32_t mb = step.microbatch;
          Op about;
          about.stage = static_cast<int16_t>(stage);
          about.microbatch = mb;
          about.sub_microbatch = step.sub;
          std::vector<int32_t> deps;
          int32_t last = -1;
          auto run = [&](const ModuleInfo& m, int32_t k, Phase phase,
                         std::span<const Sample* const> samples) {
            if (phase != Phase::kF && !m.flow.backward()) return;
            Op op = compute(m, rank, k, mb, phase, samples);
            op.sub_microbatch = step.sub;
            op.deps = deps;
            last = emit(rank, op);
            deps = {last};
            if (phase == Phase::kF) forward_of[{mb, step.sub, op.chunk, m.index}] = last;
          };
          auto run_back = [&](const ModuleInfo& m, int32_t k,
                              std::span<const Sample* const> samples) {
            if (!m.flow.backward()) return;
            if (recomputes(m)) run(m, k, Phase::kR, samples);
            run(m, k, Phase::kB, samples);
            if (m.flow.trainable) run(m, k, Phase::kW, samples);
            const int16_t chunk = m.index == llm_ ? static_cast<int16_t>(k / P) : 0;
            release(rank, last, forward_of, std::make_tuple(mb, step.sub, chunk, m.index));
          };
          auto message = [&](OpKind kind, Phase phase, int64_t peer, double bytes, int64_t tg,
                             int module, Purpose purpose) {
            Op op = purpose == Purpose::kPp
                        ? stage_message(about, kind, phase, peer, llm, {t, 0, d, stage}, bytes, tg)
                        : p2p_op(about, kind, phase, peer, bytes, tg);
            op.module = static_cast<int16_t>(module);
            op.purpose = purpose;
            if (kind == OpKind::kSend) {
              op.deps = {last};
              emit(rank, op);
            } else {
              deps.push_back(receive(rank, op));
            }
          };

          // The LLM's first stage: each sub-micro-batch's encoder output from the encoder's last
          // stage (forward), its gradient back there (backward, for segments with a backward).
          auto boundary_messages = [&](OpKind kind, Phase phase) {
            for (std::size_t gi = 0; gi < segments.size(); ++gi) {
              const DipSegment& g = segments[gi];
              if (phase == Phase::kB && g.backward_from >= P) continue;
              const auto& subs =
                  g.pieces[static_cast<std::size_t>(d)][static_cast<std::size_t>(mb)];
              for (int32_t sub = 0; sub < static_cast<int32_t>(subs.size()); ++sub) {
                about.sub_microbatch = sub;
                message(kind, phase, rank_at(P - 1),
                        boundary_bytes(segment_last(g), llm_, piece(g, d, mb, sub)),
                        MessageTag::dip_boundary(static_cast<int>(gi), phase == Phase::kB, mb, sub)
                            .packed(),
                        segment_last(g), Purpose::kBoundary);
              }
            }
            about.sub_microbatch = 0;
          };
          if (step.segment < 0) {
            // ---------------- LLM segment ----------------
            const int32_t v = static_cast<int32_t>(step.chunk * P + stage);
            about.module = static_cast<int16_t>(llm_);
            about.chunk = static_cast<int16_t>(step.chunk);
            const auto& samples = samples_of(llm_, d, mb);
            const double act = activation(llm, samples);
            if (!step.backward) {
              if (v == 0) {
                boundary_messages(OpKind::kRecv, Phase::kF);
              } else {
                message(OpKind::kRecv, Phase::kF, rank_at((v - 1) % P), act,
                        MessageTag::stage(llm_, v - 1, false, mb).packed(), llm_, Purpose::kPp);
              }
              run(llm, v, Phase::kF, samples);
              forward_done[{-1, step.chunk, mb, 0}] = last;
              if (v < last_v)
                message(OpKind::kSend, Phase::kF, rank_at((v + 1) % P), act,
                        MessageTag::stage(llm_, v, false, mb).packed(), llm_, Purpose::kPp);
              continue;
            }
            if (v < last_v)
              message(OpKind::kRecv, Phase::kB, rank_at((v + 1) % P), act,
                      MessageTag::stage(llm_, v + 1, true, mb).packed(), llm_, Purpose::kPp);
            deps.push_back(forward_done.at({-1, step.chunk, mb, 0}));
            run_back(llm, v, samples);
            if (v > 0) {
              message(OpKind::kSend, Phase::kB, rank_at((v - 1) % P), act,
                      MessageTag::stage(llm_, v, true, mb).packed(), llm_, Purpose::kPp);
              continue;
            }
            boundary_messages(OpKind::kSend, Phase::kB);
            continue;
          }

          // ---------------- encoder segment ----------------
          const DipSegment& g = segments[static_cast<std::size_t>(step.segment)];
          const ModuleInfo& enc = module_at(g.encoder);
          const auto samples = piece(g, d, mb, step.sub);
          const double act = activation(enc, samples);
          const int gi = step.segment;
          about.module = static_cast<int16_t>(g.encoder);
          about.chunk = 0;
          if (!step.backward) {
            if (stage > 0)
              message(OpKind::kRecv, Phase::kF, rank_at(stage - 1), act,
                      MessageTag::dip_stage(gi, stage - 1, false, mb, step.sub).packed(), g.encoder,
                      Purpose::kPp);
            run(enc, static_cast<int32_t>(stage), Phase::kF, samples);
            if (stage == P - 1)
              for (int i : g.projectors) run(module_at(i), 0, Phase::kF, samples);
            forward_done[{step.segment, 0, mb, step.sub}] = last;
            if (stage < P - 1)
              message(OpKind::kSend, Phase::kF, rank_at(stage + 1), act,
                      MessageTag::dip_stage(gi, stage, false, mb, step.sub).packed(), g.encoder,
                      Purpose::kPp);
            else
              message(OpKind::kSend, Phase::kF, rank_at(0),
                      boundary_bytes(segment_last(g), llm_, samples),
                      MessageTag::dip_boundary(gi, false, mb, step.sub).packed(), segment_last(g),
                      Purpose::kBoundary);
            continue;
          }
          if (stage == P - 1)
            message(OpKind::kRecv, Phase::kB, rank_at(0),
                    boundary_bytes(segment_last(g), llm_, samples),
                    MessageTag::dip_boundary(gi, true, mb, step.sub).packed(), segment_last(g),
                    Purpose::kBoundary);
          else
            message(OpKind::kRecv, Phase::kB, rank_at(stage + 1), act,
                    MessageTag::dip_stage(gi, stage + 1, true, mb, step.sub).packed(), g.encoder,
                    Purpose::kPp);
          deps.push_back(forward_done.at({step.segment, 0, mb, step.sub}));
          if (stage == P - 1)
            for (auto it = g.projectors.rbegin(); it != g.projectors.rend(); ++it)
              run_back(module_at(*it), 0, samples);
          run_back(enc, static_cast<int32_t>(stage), samples);
          if (stage - 1 >= g.backward_from)
            message(OpKind::kSend, Phase::kB, rank_at(stage - 1), act,
                    MessageTag::dip_stage(gi, stage, true, mb, step.sub).packed(), g.encoder,
                    Purpose::kPp);
        }
        // Encoder outputs wait on the first stage (the list-scheduling run's estimate).
        if (stage == 0)
          p_.memory[static_cast<std::size_t>(rank)].boundary_bytes +=
              dip_orders_of_replica.peak_waiting_bytes;
        // --- gradient reduction and optimizer, once per iteration
        std::vector<int> here{llm_};
        for (const DipSegment& g : segments) {
          here.push_back(g.encoder);
          if (stage == P - 1) here.insert(here.end(), g.projectors.begin(), g.projectors.end());
        }
        gradient_reduction(rank, here);
      }
    }
  }
  for (const ModuleInfo& m : modules_)
    if (m.index == llm_ || dip_encoder(m))
      for (const auto& [a, b] : m.chunk_layers) out_.dip_layers[m.index].push_back(b - a);
  char line[200];
  std::snprintf(line, sizeof line,
                "dip: %zu encoder segment(s) on the LLM's %lld stages; %lld sub-micro-batches "
                "over %lld micro-batches with media (%.2f each)",
                segments.size(), static_cast<long long>(P), static_cast<long long>(pieces),
                static_cast<long long>(media_microbatches),
                media_microbatches ? static_cast<double>(pieces) / media_microbatches : 0.0);
  out_.notes.push_back(line);
}

}  // namespace tessera::lowering

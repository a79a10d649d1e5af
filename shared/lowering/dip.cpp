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

// One rank's walk through its stage's DIP order: what later steps depend on, and the step
// being lowered.
struct Lowering::DipWalk {
  const std::vector<DipSegment>* segments = nullptr;
  int64_t rank = 0, t = 0, d = 0, stage = 0;
  // (segment, chunk, mb, sub) -> the forward's last compute op
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, int32_t> forward_done;
  std::map<std::tuple<int32_t, int32_t, int32_t, int>, int32_t> forward_of;  // + module
  // overlap_grad_reduce: (module, virtual stage) -> the (mb, sub) of its last backward here,
  // during which its gradients are reduced bucket by bucket
  std::map<std::pair<int, int64_t>, std::pair<int32_t, int32_t>> last_backward;
  // overlap_grad_reduce: the (module, virtual stage) keys whose buckets this rank reduces, in
  // the order every replica of its stage reduces them (their collectives share one group); the
  // next one due; those whose last backward has run, with their buckets' layers and the
  // weight-gradient ops the reductions wait for
  std::vector<std::pair<int, int64_t>> reduce_order;
  std::size_t reduce_next = 0;
  std::map<std::pair<int, int64_t>, std::vector<std::pair<LayerRange, int32_t>>> ready;
  // overlap_param_gather: (module, virtual stage) -> the (mb, sub) of its first forward here,
  // which runs in the pieces gathered at the step's start, with those pieces' gathers
  std::map<std::pair<int, int64_t>,
           std::pair<std::pair<int32_t, int32_t>, std::vector<std::pair<LayerRange, int32_t>>>>
      param_gathers;
  const DipStep* step = nullptr;
  Op about;
  std::vector<int32_t> deps;
  int32_t last = -1;
};

void Lowering::lower_dip() {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t P = llm.layout.pp;
  const std::vector<DipSegment> segments = dip_segments();
  int64_t pieces = 0, media_microbatches = 0;
  for (const DipSegment& g : segments)
    for (const auto& replica : g.pieces)
      for (const auto& mb : replica) {
        pieces += static_cast<int64_t>(mb.size());
        media_microbatches += mb.empty() ? 0 : 1;
      }
  // Each replica's stage orders, from its own micro-batches' estimated work.
  std::vector<DipOrders> replica_orders;
  for (int64_t d = 0; d < llm.layout.dp; ++d)
    replica_orders.push_back(dip_orders(dip_pipeline(segments, d), dip_));
  using Key = std::pair<int, int64_t>;  // a module and its virtual stage (an encoder's: the stage)
  auto whose = [&](const DipStep& step, int64_t stage) {
    return step.segment < 0 ? Key{llm_, step.chunk * P + stage}
                            : Key{segments[static_cast<std::size_t>(step.segment)].encoder, stage};
  };
  // The replicas order their steps apart, but their data-parallel collectives on a stage share
  // one group: every replica takes the keys in one order, where replica 0 first runs their
  // forward (the parameter gathers) or last runs their backward (the reductions); keys it lacks
  // after, by key.
  auto collective_order = [&](int64_t stage, bool backward) {
    std::map<Key, std::size_t> position;
    const auto& first = replica_orders.front().stages[static_cast<std::size_t>(stage)];
    for (std::size_t i = 0; i < first.size(); ++i)
      if (first[i].backward == backward) {
        if (backward)
          position[whose(first[i], stage)] = i;
        else
          position.emplace(whose(first[i], stage), i);
      }
    std::set<Key> keys;
    for (const DipOrders& o : replica_orders)
      for (const DipStep& step : o.stages[static_cast<std::size_t>(stage)])
        if (step.backward == backward) keys.insert(whose(step, stage));
    std::vector<Key> out(keys.begin(), keys.end());
    const auto at = [&](const Key& k) {
      const auto it = position.find(k);
      return it != position.end() ? it->second : first.size();
    };
    std::stable_sort(out.begin(), out.end(),
                     [&](const Key& a, const Key& b) { return at(a) < at(b); });
    return out;
  };
  for (int64_t d = 0; d < llm.layout.dp; ++d) {
    const DipOrders& orders = replica_orders[static_cast<std::size_t>(d)];
    for (int64_t stage = 0; stage < P; ++stage)
      for (int64_t t = 0; t < llm.layout.tp; ++t) {
        DipWalk w;
        w.segments = &segments;
        w.rank = llm.rank({t, 0, d, stage});
        w.t = t;
        w.d = d;
        w.stage = stage;
        const auto& steps = orders.stages[static_cast<std::size_t>(stage)];
        auto bucketed = [&](const Key& key) {
          const ModuleInfo& m = modules_[static_cast<std::size_t>(key.first)];
          return reduces_in_buckets(m, grid_of(m).coord(w.rank));
        };
        std::map<Key, std::pair<int32_t, int32_t>> first_forward;
        for (const DipStep& step : steps) {
          if (step.backward)
            w.last_backward[whose(step, stage)] = {step.microbatch, step.sub};
          else
            first_forward.emplace(whose(step, stage), std::pair{step.microbatch, step.sub});
        }
        for (const Key& key : collective_order(stage, true))
          if (bucketed(key)) w.reduce_order.push_back(key);
        // overlap_param_gather: the step begins with the gathers of what the last step updated,
        // in the order the forwards need them (a module this replica does not run here is
        // gathered all the same, for the others).
        if (plan_.overlap_param_gather)
          for (const Key& key : collective_order(stage, false)) {
            if (!bucketed(key)) continue;
            const ModuleInfo& m = modules_[static_cast<std::size_t>(key.first)];
            const auto f = first_forward.find(key);
            w.param_gathers[key] = {
                f != first_forward.end() ? f->second : std::pair<int32_t, int32_t>{-1, -1},
                gather_buckets_at_start(w.rank, m, grid_of(m).coord(w.rank), key.second)};
          }
        for (const DipStep& step : steps) {
          w.step = &step;
          w.about = Op{};
          w.about.stage = static_cast<int16_t>(stage);
          w.about.microbatch = step.microbatch;
          w.about.sub_microbatch = step.sub;
          w.deps.clear();
          w.last = -1;
          if (step.segment < 0)
            dip_llm_step(w);
          else
            dip_encoder_step(w);
        }
        // What no backward here reduced (a module without media in this replica's batch).
        dip_reduce_ready(w, true);
        // Encoder outputs wait on the first stage (the list-scheduling run's estimate).
        if (stage == 0)
          p_.memory[static_cast<std::size_t>(w.rank)].boundary_bytes += orders.peak_waiting_bytes;
        // --- gradient reduction and optimizer, once per iteration
        std::vector<int> here{llm_};
        for (const DipSegment& g : segments) {
          here.push_back(g.encoder);
          if (stage == P - 1) here.insert(here.end(), g.projectors.begin(), g.projectors.end());
        }
        gradient_reduction(w.rank, here);
      }
  }
  for (const ModuleInfo& m : modules_)
    if (m.index == llm_ || dip_encoder(m))
      for (const auto& [a, b] : m.chunk_layers)  // the stack's layers (no MTP layers)
        out_.dip_layers[m.index].push_back(std::min(b, m.spec->transformer->layers) - a);
  char line[200];
  std::snprintf(line, sizeof line,
                "dip: %zu encoder segment(s) on the LLM's %lld stages; %lld sub-micro-batches "
                "over %lld micro-batches with media (%.2f each)",
                segments.size(), static_cast<long long>(P), static_cast<long long>(pieces),
                static_cast<long long>(media_microbatches),
                media_microbatches ? static_cast<double>(pieces) / media_microbatches : 0.0);
  out_.notes.push_back(line);
}

void Lowering::dip_llm_step(DipWalk& w) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t P = llm.layout.pp;
  const DipStep& step = *w.step;
  const int32_t mb = step.microbatch, last_v = static_cast<int32_t>(P * llm.layout.vpp - 1);
  const int32_t v = static_cast<int32_t>(step.chunk * P + w.stage);  // virtual stage
  w.about.module = static_cast<int16_t>(llm_);
  w.about.chunk = static_cast<int16_t>(step.chunk);
  const auto& samples = samples_of(llm_, w.d, mb);
  const double act = dip_activation_bytes(llm, samples);
  auto stage_tag = [&](int64_t from, bool backward) {
    return MessageTag::stage(llm_, from, backward, mb).packed();
  };
  if (!step.backward) {
    if (v == 0)
      dip_boundary_messages(w, OpKind::kRecv, Phase::kF);
    else
      dip_message(w, OpKind::kRecv, Phase::kF, (v - 1) % P, act, stage_tag(v - 1, false), llm_,
                  Purpose::kPp);
    dip_run(w, llm, v, Phase::kF, samples);
    w.forward_done[{-1, step.chunk, mb, 0}] = w.last;
    if (v < last_v)
      dip_message(w, OpKind::kSend, Phase::kF, (v + 1) % P, act, stage_tag(v, false), llm_,
                  Purpose::kPp);
    return;
  }
  if (v < last_v)
    dip_message(w, OpKind::kRecv, Phase::kB, (v + 1) % P, act, stage_tag(v + 1, true), llm_,
                Purpose::kPp);
  w.deps.push_back(w.forward_done.at({-1, step.chunk, mb, 0}));
  dip_run_back(w, llm, v, samples);
  if (v > 0)
    dip_message(w, OpKind::kSend, Phase::kB, (v - 1) % P, act, stage_tag(v, true), llm_,
                Purpose::kPp);
  else
    dip_boundary_messages(w, OpKind::kSend, Phase::kB);
}

void Lowering::dip_encoder_step(DipWalk& w) {
  const int64_t P = modules_[static_cast<std::size_t>(llm_)].layout.pp, stage = w.stage;
  const DipStep& step = *w.step;
  const int32_t mb = step.microbatch, gi = step.segment;
  const DipSegment& g = (*w.segments)[static_cast<std::size_t>(gi)];
  const ModuleInfo& enc = modules_[static_cast<std::size_t>(g.encoder)];
  const int last = dip_segment_last(g);
  const auto samples = dip_piece(g, w.d, mb, step.sub);
  const double act = dip_activation_bytes(enc, samples);
  const double output = boundary_bytes(last, llm_, samples);
  auto stage_tag = [&](int64_t from, bool backward) {
    return MessageTag::dip_stage(gi, from, backward, mb, step.sub).packed();
  };
  auto boundary_tag = [&](bool backward) {
    return MessageTag::dip_boundary(gi, backward, mb, step.sub).packed();
  };
  w.about.module = static_cast<int16_t>(g.encoder);
  w.about.chunk = 0;
  if (!step.backward) {
    if (stage > 0)
      dip_message(w, OpKind::kRecv, Phase::kF, stage - 1, act, stage_tag(stage - 1, false),
                  g.encoder, Purpose::kPp);
    dip_run(w, enc, static_cast<int32_t>(stage), Phase::kF, samples);
    if (stage == P - 1)
      for (int i : g.projectors)
        dip_run(w, modules_[static_cast<std::size_t>(i)], 0, Phase::kF, samples);
    w.forward_done[{gi, 0, mb, step.sub}] = w.last;
    if (stage < P - 1)
      dip_message(w, OpKind::kSend, Phase::kF, stage + 1, act, stage_tag(stage, false), g.encoder,
                  Purpose::kPp);
    else
      dip_message(w, OpKind::kSend, Phase::kF, 0, output, boundary_tag(false), last,
                  Purpose::kBoundary);
    return;
  }
  if (stage == P - 1)
    dip_message(w, OpKind::kRecv, Phase::kB, 0, output, boundary_tag(true), last,
                Purpose::kBoundary);
  else
    dip_message(w, OpKind::kRecv, Phase::kB, stage + 1, act, stage_tag(stage + 1, true), g.encoder,
                Purpose::kPp);
  w.deps.push_back(w.forward_done.at({gi, 0, mb, step.sub}));
  if (stage == P - 1)
    for (auto it = g.projectors.rbegin(); it != g.projectors.rend(); ++it)
      dip_run_back(w, modules_[static_cast<std::size_t>(*it)], 0, samples);
  dip_run_back(w, enc, static_cast<int32_t>(stage), samples);
  if (stage - 1 >= g.backward_from)
    dip_message(w, OpKind::kSend, Phase::kB, stage - 1, act, stage_tag(stage, true), g.encoder,
                Purpose::kPp);
}

// --- the pieces of a step ----------------------------------------------------------------------

// The order builder's view of replica d: each step's estimated work (FLOPs) and each encoder
// step's output.
DipPipeline Lowering::dip_pipeline(const std::vector<DipSegment>& segments, int64_t d) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t P = llm.layout.pp;
  DipPipeline pipe;
  pipe.stages = static_cast<int32_t>(P);
  pipe.llm_chunks = static_cast<int32_t>(llm.layout.vpp);
  pipe.microbatches = static_cast<int32_t>(microbatches_);
  pipe.llm_backward = llm.flow.backward();
  for (const DipSegment& g : segments) {
    DipPipeline::Segment& seg = pipe.segments.emplace_back();
    for (const auto& mb : g.pieces[static_cast<std::size_t>(d)])
      seg.subs.push_back(static_cast<int32_t>(mb.size()));
    seg.backward_from = g.backward_from;
  }
  pipe.seconds = [this, &llm, &segments, d, P](const DipStep& s, int32_t stage) {
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
    const auto samples = dip_piece(g, d, s.microbatch, s.sub);
    double flops = cost(modules_[static_cast<std::size_t>(g.encoder)], stage, samples);
    if (stage == P - 1)
      for (int i : g.projectors) flops += cost(modules_[static_cast<std::size_t>(i)], 0, samples);
    return flops;
  };
  pipe.llm_input_grad = llm.flow.needs_input_grad;
  pipe.output_bytes = [this, &segments, d](const DipStep& s) {
    const DipSegment& g = segments[static_cast<std::size_t>(s.segment)];
    return boundary_bytes(dip_segment_last(g), llm_, dip_piece(g, d, s.microbatch, s.sub));
  };
  return pipe;
}

// Every segment runs on the LLM's grid: its TP ranks exchange the stage messages.
double Lowering::dip_activation_bytes(const ModuleInfo& m, std::span<const Sample* const> samples) {
  return stage_message_bytes(modules_[static_cast<std::size_t>(llm_)],
                             work_of(m.index, samples).tokens,
                             m.spec->transformer ? m.spec->transformer->hidden : 0);
}

std::span<const Sample* const> Lowering::dip_piece(const DipSegment& g, int64_t d, int32_t mb,
                                                   int32_t sub) {
  return std::span<const Sample* const>(*g.pieces[static_cast<std::size_t>(
      d)][static_cast<std::size_t>(mb)][static_cast<std::size_t>(sub)]);
}

void Lowering::dip_run(DipWalk& w, const ModuleInfo& m, int32_t k, Phase phase,
                       std::span<const Sample* const> samples) {
  if (phase != Phase::kF && !m.flow.backward()) return;
  const std::pair<int32_t, int32_t> at{w.step->microbatch, w.step->sub};
  const auto gathered = w.param_gathers.find({m.index, k});
  if (phase == Phase::kF && gathered != w.param_gathers.end() && gathered->second.first == at) {
    w.last = forward_in_pieces(w.rank, m, k, at.first, at.second, samples, w.deps,
                               gathered->second.second);
  } else {
    Op op = compute(m, w.rank, k, at.first, phase, samples);
    op.sub_microbatch = at.second;
    op.deps = w.deps;
    w.last = emit(w.rank, op);
  }
  w.deps = {w.last};
  if (phase == Phase::kF) w.forward_of[{at.first, at.second, chunk_of(m, k), m.index}] = w.last;
}

void Lowering::dip_run_back(DipWalk& w, const ModuleInfo& m, int32_t k,
                            std::span<const Sample* const> samples) {
  if (!m.flow.backward()) return;
  const auto last = w.last_backward.find({m.index, k});
  if (last != w.last_backward.end() && reduces_in_buckets(m, grid_of(m).coord(w.rank)) &&
      last->second == std::make_pair(w.step->microbatch, w.step->sub)) {
    std::vector<std::pair<LayerRange, int32_t>> buckets;
    w.last = backward_in_buckets(w.rank, m, k, w.step->microbatch, w.step->sub, samples, w.deps,
                                 &buckets);
    w.deps = {w.last};
    w.ready[{m.index, k}] = std::move(buckets);
    dip_reduce_ready(w, false);
  } else {
    for (const Phase phase : backward_phases(m)) dip_run(w, m, k, phase, samples);
  }
  const int64_t P = modules_[static_cast<std::size_t>(llm_)].layout.pp;
  const int16_t chunk = m.index == llm_ ? static_cast<int16_t>(k / P) : 0;
  release(w.rank, w.last, w.forward_of,
          std::make_tuple(w.step->microbatch, w.step->sub, chunk, m.index));
}

void Lowering::dip_reduce_ready(DipWalk& w, bool all) {
  for (; w.reduce_next < w.reduce_order.size(); ++w.reduce_next) {
    const auto& [module, k] = w.reduce_order[w.reduce_next];
    const ModuleInfo& m = modules_[static_cast<std::size_t>(module)];
    const Coord x = grid_of(m).coord(w.rank);
    const auto ready = w.ready.find(w.reduce_order[w.reduce_next]);
    if (ready != w.ready.end()) {
      for (const auto& [piece, after] : ready->second)
        reduce_bucket(w.rank, m, x, k, piece, kOpGradientBucket, -1, after);
    } else if (all) {
      const int32_t after = last_compute(w.rank);
      for (const LayerRange& piece : gradient_buckets(m, k))
        reduce_bucket(w.rank, m, x, k, piece, kOpGradientBucket, -1, after);
    } else {
      return;
    }
  }
}

// A message to or from the rank of `stage` in this rank's TP position: a send after the last
// op, a receive the next op waits for.
void Lowering::dip_message(DipWalk& w, OpKind kind, Phase phase, int64_t stage, double bytes,
                           int64_t tag, int module, Purpose purpose) {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  const int64_t peer = llm.rank({w.t, 0, w.d, stage});
  Op op = purpose == Purpose::kPp
              ? stage_message(w.about, kind, phase, peer, llm, {w.t, 0, w.d, w.stage}, bytes, tag)
              : p2p_op(w.about, kind, phase, peer, bytes, tag);
  op.module = static_cast<int16_t>(module);
  op.purpose = purpose;
  if (kind == OpKind::kSend) {
    op.deps = {w.last};
    emit(w.rank, op);
  } else {
    w.deps.push_back(receive(w.rank, op));
  }
}

// The LLM's first stage: each sub-micro-batch's encoder output from the encoder's last stage
// (forward), its gradient back there (backward, for segments with a backward).
void Lowering::dip_boundary_messages(DipWalk& w, OpKind kind, Phase phase) {
  const int64_t P = modules_[static_cast<std::size_t>(llm_)].layout.pp;
  const int32_t mb = w.step->microbatch;
  for (std::size_t gi = 0; gi < w.segments->size(); ++gi) {
    const DipSegment& g = (*w.segments)[gi];
    if (phase == Phase::kB && g.backward_from >= P) continue;
    const auto& subs = g.pieces[static_cast<std::size_t>(w.d)][static_cast<std::size_t>(mb)];
    for (int32_t sub = 0; sub < static_cast<int32_t>(subs.size()); ++sub) {
      w.about.sub_microbatch = sub;
      dip_message(
          w, kind, phase, P - 1,
          boundary_bytes(dip_segment_last(g), llm_, dip_piece(g, w.d, mb, sub)),
          MessageTag::dip_boundary(static_cast<int>(gi), phase == Phase::kB, mb, sub).packed(),
          dip_segment_last(g), Purpose::kBoundary);
    }
  }
  w.about.sub_microbatch = 0;
}

}  // namespace tessera::lowering

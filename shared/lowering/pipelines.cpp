// Lowering: homogeneous and non-colocated placements, as pipelines of modules. Each rank walks
// its schedule (shared/layout/schedule) item by item: a forward receives its input, runs its
// modules and sends the output on; a backward receives the output's gradient, runs the modules'
// backward in reverse and sends the input's gradient back. Then it reduces its gradients.
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

// One rank's walk: what later items depend on, and the item being lowered.
struct Lowering::StageWalk {
  int64_t rank = 0;
  Coord x;
  bool leader = false;   // TP and CP rank 0: it exchanges the boundary messages
  bool overlap = false;  // overlap_grad_reduce on the owner
  std::map<std::pair<int32_t, int32_t>, int32_t> forward_done;      // (mb, chunk) -> last F op
  std::map<std::tuple<int32_t, int32_t, int>, int32_t> forward_of;  // (mb, chunk, module) -> F op
  std::map<int32_t, int32_t> last_backward;  // chunk -> its last micro-batch's backward
  std::map<int32_t, int32_t> first_forward;  // chunk -> its first micro-batch
  // overlap_param_gather: chunk -> its buckets bottom up, each with its gather op
  std::map<int32_t, std::vector<std::pair<LayerRange, int32_t>>> param_gathers;
  // Received encoder outputs live from their forward until their backward (or the forward, when
  // no gradient flows back): peak in-flight count times the largest micro-batch.
  double largest_input = 0;
  int32_t in_flight = 0, peak_in_flight = 0;
  // The item being lowered: the next op's dependencies and the last op emitted.
  std::vector<int32_t> deps;
  int32_t last = -1;
};

void Lowering::lower_pipelines() {
  for (const Pipeline& pipe : pipelines()) {
    const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
    for (int64_t rank = owner.first; rank < owner.first + owner.layout.size(); ++rank)
      if (lowers(rank)) walk_stage(pipe, rank);  // else a folded Program's represented rank
  }
}

void Lowering::walk_stage(const Pipeline& pipe, int64_t rank) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  const int64_t pp = owner.layout.pp;
  StageWalk w;
  w.rank = rank;
  w.x = owner.coord(rank);
  w.leader = w.x.t == 0 && w.x.c == 0;
  const bool first_stage = w.x.p == 0, last_stage = w.x.p == pp - 1;
  const bool has_backward = owner.flow.backward() || (last_stage && pipe.suffix_backward) ||
                            (first_stage && pipe.prefix_backward);
  const std::vector<ScheduleItem> order = order_for(owner, w.x.p, has_backward);
  // overlap_grad_reduce: the owner's gradients of each chunk are bucketed and reduced during the
  // chunk's last backward (gradients accumulate locally before it).
  w.overlap = reduces_in_buckets(owner, w.x);
  if (w.overlap)
    for (const ScheduleItem& item : order)
      if (item.backward) w.last_backward[item.chunk] = item.microbatch;
  if (w.overlap && plan_.overlap_param_gather) gather_parameters_first(pipe, w, order);
  for (const ScheduleItem& item : order) {
    w.deps.clear();
    w.last = -1;
    if (item.backward)
      stage_backward(pipe, w, item);
    else
      stage_forward(pipe, w, item);
  }
  p_.memory[static_cast<std::size_t>(rank)].boundary_bytes += w.largest_input * w.peak_in_flight;
  // --- gradient reduction and optimizer, once per iteration
  std::vector<int> here{pipe.owner};
  if (first_stage) here.insert(here.end(), pipe.prefix.begin(), pipe.prefix.end());
  if (last_stage) here.insert(here.end(), pipe.suffix.begin(), pipe.suffix.end());
  gradient_reduction(rank, here);
}

void Lowering::stage_forward(const Pipeline& pipe, StageWalk& w, const ScheduleItem& item) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  const int64_t pp = owner.layout.pp;
  const StageItem s = stage_item(owner, w.x, item);
  // --- input: the producers' boundary messages, or the previous virtual stage's activations
  if (s.k == 0) {
    receive_pipeline_input(pipe, w, s.about);
  } else {
    const int64_t from = owner.rank({w.x.t, w.x.c, w.x.d, (s.k - 1) % pp});
    // Sends were emitted by the earlier stage when it ran this item.
    w.deps.push_back(receive(
        w.rank, stage_message(s.about, OpKind::kRecv, Phase::kF, from, owner, w.x, s.act_bytes,
                              MessageTag::stage(pipe.owner, s.k - 1, false, s.mb).packed())));
  }
  // --- compute: the first stage's prefix, the owner's chunk, the last stage's suffix
  if (s.k == 0)
    for (int i : pipe.prefix)
      forward_module(w, modules_[static_cast<std::size_t>(i)], 0, item, samples_of(i, w.x.d, s.mb));
  if (!w.param_gathers.empty() && w.first_forward.at(item.chunk) == s.mb) {
    // Each piece after its own bucket's gather.
    forwarded(w, item, owner,
              forward_in_pieces(w.rank, owner, s.k, s.mb, 0, *s.samples, w.deps,
                                w.param_gathers.at(item.chunk)));
  } else {
    forward_module(w, owner, s.k, item, *s.samples);
  }
  const bool last_virtual = s.k == owner.chunks() - 1;
  if (last_virtual)
    for (int i : pipe.suffix)
      forward_module(w, modules_[static_cast<std::size_t>(i)], 0, item, *s.samples);
  w.forward_done[{s.mb, item.chunk}] = w.last;
  // --- output: to the next virtual stage, or the consumers' boundary messages
  if (!last_virtual) {
    const int64_t to = owner.rank({w.x.t, w.x.c, w.x.d, (s.k + 1) % pp});
    Op send = stage_message(s.about, OpKind::kSend, Phase::kF, to, owner, w.x, s.act_bytes,
                            MessageTag::stage(pipe.owner, s.k, false, s.mb).packed());
    send.deps = {w.last};
    emit(w.rank, send);
  } else if (w.leader) {
    send_pipeline_output(pipe, w, s.about);
  }
}

void Lowering::stage_backward(const Pipeline& pipe, StageWalk& w, const ScheduleItem& item) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  const int64_t pp = owner.layout.pp;
  const StageItem s = stage_item(owner, w.x, item);
  const bool first_virtual = s.k == 0, last_virtual = s.k == owner.chunks() - 1;
  // --- output's gradient: from the next virtual stage, or the consumers that send one back
  if (!last_virtual) {
    const int64_t from = owner.rank({w.x.t, w.x.c, w.x.d, (s.k + 1) % pp});
    w.deps.push_back(receive(
        w.rank, stage_message(s.about, OpKind::kRecv, Phase::kB, from, owner, w.x, s.act_bytes,
                              MessageTag::stage(pipe.owner, s.k + 1, true, s.mb).packed())));
  } else {
    receive_output_gradients(pipe, w, s.about, *s.samples);
  }
  if (first_virtual && !pipe.producers.empty() && owner.flow.needs_input_grad) --w.in_flight;
  w.deps.push_back(w.forward_done.at({s.mb, item.chunk}));
  // --- compute, in reverse: the last stage's suffix, the owner's chunk, and the modules before
  // the LLM in its first stage, each encoder micro-batch once the LLM has every gradient of it
  // (this one; under Entrain also the one before, or none)
  if (last_virtual)
    for (auto it = pipe.suffix.rbegin(); it != pipe.suffix.rend(); ++it)
      backward_module(pipe, w, modules_[static_cast<std::size_t>(*it)], 0, item, *s.samples, s.mb);
  backward_module(pipe, w, owner, s.k, item, *s.samples, s.mb);
  if (first_virtual && !pipe.prefix.empty())  // the owner is the LLM here
    for (int32_t i : encoder_microbatches_done(w.x.d, s.mb))
      for (auto it = pipe.prefix.rbegin(); it != pipe.prefix.rend(); ++it)
        backward_module(pipe, w, modules_[static_cast<std::size_t>(*it)], 0, item,
                        samples_of(*it, w.x.d, i), i);
  if (w.last < 0) return;
  // --- input's gradient: to the previous virtual stage, or the producers
  if (!first_virtual && owner.flow.backward()) {
    const int64_t to = owner.rank({w.x.t, w.x.c, w.x.d, (s.k - 1) % pp});
    Op send = stage_message(s.about, OpKind::kSend, Phase::kB, to, owner, w.x, s.act_bytes,
                            MessageTag::stage(pipe.owner, s.k, true, s.mb).packed());
    send.deps = {w.last};
    emit(w.rank, send);
  } else if (first_virtual && owner.flow.needs_input_grad) {
    send_input_gradients(pipe, w, s.about);
  }
}

// --- the pipeline's shape -------------------------------------------------------------------

std::vector<Lowering::Pipeline> Lowering::pipelines() const {
  const bool homogeneous = plan_.placement == Placement::kHomogeneous;
  const ModuleSpec* llm = modules_[static_cast<std::size_t>(llm_)].spec;
  auto index_of = [&](const ModuleSpec* s) { return static_cast<int>(s - model_.modules.data()); };
  // Homogeneous: every other module runs in the LLM's first stage, in topological order, but a
  // generator after the LLM, which runs in its last stage.
  std::vector<int> prefix, generators;
  if (homogeneous)
    for (const ModuleSpec* s : topological_order(model_))
      if (s != llm)
        (s->role == ModuleRole::kGenerator ? generators : prefix).push_back(index_of(s));
  // Modules own ranks: the LLM alone (homogeneous) or every module without a host.
  auto host_of = [&](const std::string& name) {
    const ModuleInfo& m = modules_[static_cast<std::size_t>(index_of(find_module(model_, name)))];
    return m.host >= 0 ? m.host : m.index;
  };
  std::vector<Pipeline> out;
  for (const ModuleInfo& owner : modules_) {
    if (homogeneous ? owner.index != llm_ : owner.host >= 0) continue;
    Pipeline& p = out.emplace_back();
    p.owner = owner.index;
    if (homogeneous) {
      p.prefix = prefix;
      p.suffix = generators;
    } else {
      // Modules borrowing the owner's last stage (non-colocated projectors), in topological
      // order; the host modules feeding it (through borrowed projectors).
      for (const ModuleSpec* s : topological_order(model_))
        if (modules_[static_cast<std::size_t>(index_of(s))].host == owner.index)
          p.suffix.push_back(index_of(s));
      for (const std::string& in : owner.spec->inputs)
        p.producers.emplace_back(host_of(in), index_of(find_module(model_, in)));
    }
    p.last_module = p.suffix.empty() ? owner.index : p.suffix.back();
    if (!homogeneous)
      for (const ModuleSpec& s : model_.modules)
        for (const std::string& in : s.inputs)
          if (in == model_.modules[static_cast<std::size_t>(p.last_module)].name)
            p.consumers.push_back(host_of(s.name));
    for (int i : p.suffix)
      p.suffix_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();
    for (int i : p.prefix)
      p.prefix_backward |= modules_[static_cast<std::size_t>(i)].flow.backward();
  }
  return out;
}

Lowering::StageItem Lowering::stage_item(const ModuleInfo& owner, const Coord& x,
                                         const ScheduleItem& item) {
  StageItem s;
  s.k = item.chunk * owner.layout.pp + x.p;
  s.mb = item.microbatch;
  s.samples = &samples_of(owner.index, x.d, item.microbatch);
  s.about.module = static_cast<int16_t>(owner.index);
  s.about.stage = static_cast<int16_t>(x.p);
  s.about.chunk = static_cast<int16_t>(item.chunk);
  s.about.microbatch = item.microbatch;
  s.act_bytes = stage_message_bytes(owner, work_of(owner.index, *s.samples).tokens,
                                    owner.spec->transformer ? owner.spec->transformer->hidden : 0);
  return s;
}

// --- compute ---------------------------------------------------------------------------------

void Lowering::forward_op(StageWalk& w, const ModuleInfo& m, int64_t k_chunk,
                          const ScheduleItem& item, std::span<const Sample* const> s) {
  Op op = compute(m, w.rank, static_cast<int32_t>(k_chunk), item.microbatch, Phase::kF, s);
  op.deps = w.deps;
  forwarded(w, item, m, emit(w.rank, op));
}

void Lowering::forwarded(StageWalk& w, const ScheduleItem& item, const ModuleInfo& m,
                         int32_t last) {
  w.last = last;
  w.deps = {last};
  w.forward_of[{item.microbatch, item.chunk, m.index}] = last;
}

// fully_sharded: unit by unit, each unit's weights gathered first (forward_units).
void Lowering::forward_module(StageWalk& w, const ModuleInfo& m, int64_t k_chunk,
                              const ScheduleItem& item, std::span<const Sample* const> s) {
  if (!sharded(m, grid_of(m).coord(w.rank))) return forward_op(w, m, k_chunk, item, s);
  forwarded(w, item, m, forward_units(w.rank, m, k_chunk, item.microbatch, 0, s, w.deps));
}

void Lowering::backward_module(const Pipeline& pipe, StageWalk& w, const ModuleInfo& m,
                               int64_t k_chunk, const ScheduleItem& item,
                               std::span<const Sample* const> s, int32_t at_mb) {
  if (!m.flow.backward()) return;
  if (sharded(m, grid_of(m).coord(w.rank))) {
    w.last = backward_units(w.rank, m, k_chunk, at_mb, 0, s, w.deps);
  } else if (w.overlap && m.index == pipe.owner && w.last_backward.at(item.chunk) == at_mb) {
    // Its gradients reduced during this backward, bucket by bucket.
    w.last = backward_in_buckets(w.rank, m, k_chunk, at_mb, 0, s, w.deps);
  } else {
    const LayerRange layers = m.chunk_layers[static_cast<std::size_t>(k_chunk)];
    for (const Phase phase : backward_phases(m)) {
      Op op = compute(m, w.rank, static_cast<int32_t>(k_chunk), at_mb, phase, s,
                      phase == Phase::kR ? nullptr : &layers);
      op.deps = w.deps;
      w.last = emit(w.rank, op);
      w.deps = {w.last};
    }
  }
  w.deps = {w.last};
  release(w.rank, w.last, w.forward_of, std::make_tuple(at_mb, item.chunk, m.index));
}

// overlap_param_gather: the step begins with the all-gathers of the parameters the previous
// step's optimizer updated (the steady state), bucket by bucket in the order the forward needs
// them, and each chunk's first forward runs in the same pieces, each piece waiting for its own
// bucket's gather.
void Lowering::gather_parameters_first(const Pipeline& pipe, StageWalk& w,
                                       const std::vector<ScheduleItem>& order) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  for (const ScheduleItem& item : order) {
    if (item.backward || w.first_forward.count(item.chunk) > 0) continue;
    w.first_forward[item.chunk] = item.microbatch;
    w.param_gathers[item.chunk] =
        gather_buckets_at_start(w.rank, owner, w.x, item.chunk * owner.layout.pp + w.x.p);
  }
}

// --- boundary messages -----------------------------------------------------------------------

// What arrives for a micro-batch at the owner's first virtual stage: each producer's boundary
// message (under Entrain, the encoder micro-batch of this number, whose rows this and the next
// LLM micro-batch take), received by the leader and shared with its TP and CP peers.
void Lowering::receive_pipeline_input(const Pipeline& pipe, StageWalk& w, const Op& about) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  const int32_t mb = about.microbatch;
  const auto& arriving = samples_of(pipe.owner, w.x.d, mb, true);
  if (!pipe.producers.empty()) {
    double input = 0;
    for (const auto& [producer_host, producer_last] : pipe.producers)
      input += boundary_bytes(producer_last, pipe.owner, arriving);
    w.largest_input = std::max(w.largest_input, input);
    w.peak_in_flight = std::max(w.peak_in_flight, ++w.in_flight);
    if (!owner.flow.needs_input_grad) --w.in_flight;
  }
  for (const auto& [producer_host, producer_last] : pipe.producers) {
    const ModuleInfo& prod = modules_[static_cast<std::size_t>(producer_host)];
    std::vector<int32_t> received;
    if (w.leader)
      for (const Link& link :
           boundary_links(producer_host, producer_last, pipe.owner, w.x.d, false, mb))
        received.push_back(
            emit(w.rank, boundary_message(about, OpKind::kRecv, Phase::kF,
                                          prod.rank({0, 0, link.producer, prod.layout.pp - 1}),
                                          producer_last, pipe.owner, link, mb)));
    share_boundary(w.rank, owner, w.x, Phase::kF, producer_last, mb,
                   boundary_bytes(producer_last, pipe.owner, arriving), received, w.deps);
  }
}

// The last virtual stage's output to each consumer (from the leader).
void Lowering::send_pipeline_output(const Pipeline& pipe, StageWalk& w, const Op& about) {
  for (int consumer_host : pipe.consumers) {
    const ModuleInfo& cons = modules_[static_cast<std::size_t>(consumer_host)];
    for (const Link& link : boundary_links(pipe.owner, pipe.last_module, consumer_host, w.x.d, true,
                                           about.microbatch)) {
      Op send =
          boundary_message(about, OpKind::kSend, Phase::kF, cons.rank({0, 0, link.consumer, 0}),
                           pipe.last_module, consumer_host, link, about.microbatch);
      send.deps = {w.last};
      emit(w.rank, send);
    }
  }
}

// Gradients from consumers that send them back (the LLM's loss needs none).
void Lowering::receive_output_gradients(const Pipeline& pipe, StageWalk& w, const Op& about,
                                        std::span<const Sample* const> samples) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  const int32_t mb = about.microbatch;
  for (int consumer_host : pipe.consumers) {
    const ModuleInfo& cons = modules_[static_cast<std::size_t>(consumer_host)];
    if (!cons.flow.backward() || !(pipe.suffix_backward || owner.flow.backward())) continue;
    std::vector<int32_t> received;
    if (w.leader)
      for (const Link& link :
           boundary_links(pipe.owner, pipe.last_module, consumer_host, w.x.d, true, mb))
        received.push_back(emit(
            w.rank,
            boundary_message(about, OpKind::kRecv, Phase::kB, cons.rank({0, 0, link.consumer, 0}),
                             pipe.last_module, consumer_host, link, mb)));
    share_boundary(w.rank, owner, w.x, Phase::kB, pipe.last_module, mb,
                   boundary_bytes(pipe.last_module, consumer_host, samples), received, w.deps);
  }
}

// Each encoder micro-batch's gradient to its producers once the LLM has all of it (under
// Entrain after this micro-batch or the next; otherwise this one), summed over CP first.
void Lowering::send_input_gradients(const Pipeline& pipe, StageWalk& w, const Op& about) {
  const ModuleInfo& owner = modules_[static_cast<std::size_t>(pipe.owner)];
  for (const int32_t i : encoder_microbatches_done(w.x.d, about.microbatch)) {
    Op about_i = about;
    about_i.microbatch = i;
    for (const auto& [producer_host, producer_last] : pipe.producers) {
      const ModuleInfo& prod = modules_[static_cast<std::size_t>(producer_host)];
      bool producer_needs = prod.flow.backward();
      for (const ModuleInfo& m : modules_)
        if (m.host == producer_host) producer_needs |= m.flow.backward();
      if (!producer_needs) continue;
      int32_t dep = w.last;
      if (owner.layout.cp > 1) {
        // Each CP rank holds the gradient of its tokens: sum over CP before sending.
        Op sum = collective_op(
            CollectiveKind::kAllReduce, Purpose::kBoundary, Phase::kB, producer_last,
            cp_group(owner, w.x),
            boundary_bytes(producer_last, pipe.owner, samples_of(pipe.owner, w.x.d, i, true)));
        sum.microbatch = i;
        sum.deps = {w.last};
        dep = emit(w.rank, sum);
      }
      if (!w.leader) continue;
      for (const Link& link :
           boundary_links(producer_host, producer_last, pipe.owner, w.x.d, false, i)) {
        Op send = boundary_message(about_i, OpKind::kSend, Phase::kB,
                                   prod.rank({0, 0, link.producer, prod.layout.pp - 1}),
                                   producer_last, pipe.owner, link, i);
        send.deps = {dep};
        emit(w.rank, send);
      }
    }
  }
}

}  // namespace tessera::lowering

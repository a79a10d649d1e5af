// The Worker: set-up, and the interpreter of its rank's ops (step), with the forward and
// backward in worker_compute.cpp, boundary transport in worker_boundary.cpp, schedule dip's
// pieces in worker_dip.cpp (its schedules searched ahead by dip_prefetch.cpp), the gradient
// collectives in worker_gradients.cpp (handed to the Optimizers, optimizers.cpp) and checkpoints
// in worker_checkpoint.cpp. Point-to-point messages go through Messages (messages.cpp).
#include "exec/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "exec/device.hpp"
#include "exec/worker_internal.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

Worker::Worker(const Scenario& s, const ParallelPlan& plan, Groups& groups,
               const TrainOptions& options)
    : scenario_(s),
      plan_(plan),
      groups_(groups),
      options_(options),
      rank_(groups.world_rank()),
      messages_(groups, rank_) {
  const ModelSpec& model = s.model;
  const std::vector<ModuleGroups> module_groups = rank_groups(plan, model);
  // The first iteration's Program says which groups exist and which stages live here.
  const TrainBatch first = make_batch(s, options.dataset, 0);
  const Lowered lowered = lower(model, s.cluster, plan, s.workload, first.batch);
  TESSERA_CHECK(lowered.error.empty(), lowered.error);
  const Program& p = lowered.program;
  TESSERA_CHECK(p.world == groups.world().size(), "the plan needs " + std::to_string(p.world) +
                                                      " ranks, the job has " +
                                                      std::to_string(groups.world().size()));
  // Every worker creates the same groups in the same order (creation is a rendezvous).
  std::set<std::pair<std::size_t, std::vector<int64_t>>> needed;
  for (const RankList& g : p.groups) needed.insert({g.size(), g});
  for (const ModuleGroups& mg : module_groups)
    for (const auto* kind : {&mg.tp, &mg.cp, &mg.dp, &mg.ep, &mg.edp})
      for (const Group& g : *kind) needed.insert({g.size(), g});
  std::vector<std::vector<int64_t>> ordered;
  for (const auto& [size, g] : needed) ordered.push_back(g);
  groups_.create(ordered);

  places_ = std::make_unique<ModulePlaces>(plan, model, groups_);
  // Pipeline stages of each module, from the compute ops of all ranks.
  std::map<int, int64_t> stages;
  for (const auto& ops : p.ranks)
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute)
        stages[op.module] = std::max<int64_t>(stages[op.module], op.stage + 1);
  // Each (module, chunk) here holds the layers the Program gives its stage: those it computes,
  // and those whose gradients it reduces without computing them this iteration (under DIP, a
  // replica whose batch has no media for an encoder still takes part in its reduction).
  std::map<std::pair<int, int>, const ChunkLayers*> held;
  for (const Op& op : p.ranks[static_cast<std::size_t>(rank_)])
    if (op.kind == OpKind::kCompute ||
        (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp))
      held.try_emplace({op.module, op.chunk}, find_chunk_layers(p, op.module, op.stage, op.chunk));
  for (const auto& [key, layers] : held) hold_stage(key.first, key.second, layers);
  dip_ = plan.schedule == Schedule::kDip;
  if (dip_) dip_prefetch_ = std::make_unique<DipPrefetcher>(s, plan, options.dataset);
  boundary_.set_linked(plan.placement == Placement::kNonColocated ||
                       (plan.placement == Placement::kColocated && stages[places_->llm()] > 1));
  std::vector<GradientCopies> copies(model.modules.size());
  for (std::size_t m = 0; m < copies.size(); ++m) {
    const ModulePlace& place = (*places_)[static_cast<int>(m)];
    const Comm* ep = place.ep;
    copies[m] = {place.shard_copies,
                 ep == nullptr ? 1 : place.shard_copies / static_cast<int64_t>(ep->size()),
                 ep != nullptr && ep->size() > 1};
  }
  OptimizerSettings settings;
  settings.adamw.lr(options.lr)
      .betas({options.beta1, options.beta2})
      .eps(options.eps)
      .weight_decay(options.weight_decay);
  settings.clip = options.clip;
  settings.distributed = plan.distributed_optimizer;
  optimizers_ = std::make_unique<Optimizers>(stages_, p, rank_, std::move(copies), settings);
}

void Worker::hold_stage(int module, int chunk, const ChunkLayers* layers) {
  const ModuleSpec& spec = scenario_.model.modules[static_cast<std::size_t>(module)];
  const ModulePlace& place = (*places_)[module];
  TESSERA_CHECK(place.here() && layers != nullptr, "rank " + std::to_string(rank_) + " runs " +
                                                       spec.name +
                                                       " but has no group or layers for it");
  auto& st = stages_[{module, chunk}];
  st = std::make_unique<Stage>(spec, layers->first_layer, layers->end_layer, options_.seed,
                               *place.tp, place.ep,
                               plan_.indivisible_heads == IndivisibleHeads::kPad, place.tp_replicas,
                               sequence_parallel_for(plan_, spec) && place.tp->size() > 1);
  if (plan_.recompute == Recompute::kSelective && (plan_.recompute_modules & kRecomputeCoreAttn))
    st->recompute_attention_cores();
}

std::vector<int32_t> Worker::samples_for(int module, int mb) const {
  const auto m = static_cast<std::size_t>(module);
  const ModuleRole role = scenario_.model.modules[m].role;
  const bool encoder_side = role != ModuleRole::kLlm && role != ModuleRole::kGenerator;
  const ModulePlace& place = (*places_)[module];
  return replica_samples(entrain_ && encoder_side ? encoder_assignment_ : assignment_,
                         place.dp_size, place.dp_rank, mb);
}

const MediaAssignment* Worker::media_for(int module) {
  const ModelSpec& model = scenario_.model;
  const ModuleSpec& spec = model.modules[static_cast<std::size_t>(module)];
  if (!media_parallel(plan_, model, spec)) return nullptr;
  if (const auto it = boundary_.media.find(module); it != boundary_.media.end()) return &it->second;
  return &(boundary_.media[module] = assign_media(batch_.batch, model, *source_encoder(model, spec),
                                                  assignment_, (*places_)[module].dp_size));
}

int64_t Worker::item_rows(int producer, const MediaPiece& piece) const {
  const ModelSpec& model = scenario_.model;
  const ModuleSpec& encoder =
      *source_encoder(model, model.modules[static_cast<std::size_t>(producer)]);
  return media_items(model, encoder, batch_.batch.samples[static_cast<std::size_t>(piece.sample)])
      .at(static_cast<std::size_t>(piece.item))
      .llm_tokens;
}

const Worker::MicroBatch& Worker::micro_batch(int mb) {
  if (const auto it = micro_batches_.find(mb); it != micro_batches_.end()) return it->second;
  MicroBatch& b = micro_batches_[mb];
  b.samples = my_micro_batches_[static_cast<std::size_t>(mb)];
  b.layout = llm_layout(scenario_.model, batch_, b.samples, scenario_.workload.max_seq_len,
                        plan_.pad_to_longest);
  const Comm* cp = places_->llm_place().cp;
  const int64_t cp_size = cp == nullptr ? 1 : cp->size();
  std::vector<TokenTag> tags(b.layout.sample.size());
  for (std::size_t t = 0; t < tags.size(); ++t) tags[t] = {b.layout.sample[t], b.layout.item[t]};
  const auto split = context_split(
      plan_.cp_split, tags, cp_size,
      cp_linear_tiles(
          *scenario_.model.modules[static_cast<std::size_t>(places_->llm())].transformer));
  b.local = split[static_cast<std::size_t>(places_->llm_cp_index())];
  std::vector<int64_t> keys;
  for (const auto& part : split) {
    keys.insert(keys.end(), part.begin(), part.end());
    b.attention.cp_rows.push_back(static_cast<int64_t>(part.size()));
  }
  // Without context parallelism every sample attends within itself only: block by block.
  if (cp_size == 1)
    b.attention.blocks = attention_blocks(b.layout);
  else
    b.attention.bias = attention_bias(b.layout, b.local, keys);
  b.attention.positions_q =
      b.layout.positions.index_select(0, torch::tensor(b.local, torch::kInt64).view({-1}));
  b.attention.cp = cp;
  // Sequence parallelism: each TP rank holds its rows of this CP rank's tokens between layers.
  if (const Comm* tp = places_->llm_place().tp;
      sequence_parallel_for(plan_,
                            scenario_.model.modules[static_cast<std::size_t>(places_->llm())]) &&
      tp != nullptr && tp->size() > 1) {
    b.attention.sp = tp;
    b.attention.sp_rows = sequence_rows(static_cast<int64_t>(b.local.size()), tp->size());
  }
  // Built on the CPU, used on the device.
  move_to_device(b.layout);
  b.attention.positions_q = upload(b.attention.positions_q);
  return b;
}

StepResult Worker::step(int64_t iteration) {
  const auto prepare = std::chrono::steady_clock::now();
  // The layers' bf16 copies of the weights (working_copies.hpp); the optimizer step drops the
  // trainable ones.
  std::optional<WorkingCopies::Scope> copies;
  if (options_.working_copies) copies.emplace(working_copies_);
  const ModelSpec& model = scenario_.model;
  batch_ =
      dip_ ? dip_prefetch_->batch(iteration) : make_batch(scenario_, options_.dataset, iteration);
  std::optional<DipStepInfo> dip;
  if (dip_) dip = dip_prefetch_->schedule_for_step(iteration, groups_.world());
  Lowered lowered = lower(model, scenario_.cluster, plan_, scenario_.workload, batch_.batch,
                          dip_ ? &dip_prefetch_->schedule() : nullptr);
  TESSERA_CHECK(lowered.error.empty(), lowered.error);
  StepResult result;
  result.dip = std::move(dip);
  result.program = std::move(lowered.program);
  const Program& p = result.program;
  program_ = &p;
  // A frozen module this rank first runs now (under DIP, a replica whose earlier batches had no
  // media for its encoder) is built now: its weights are the initial ones on every rank. A
  // trainable one was built at the start, as the first Program reduces its gradients here.
  for (const Op& op : p.ranks[static_cast<std::size_t>(rank_)])
    if (op.kind == OpKind::kCompute && stages_.count({op.module, op.chunk}) == 0) {
      TESSERA_CHECK(model.modules[static_cast<std::size_t>(op.module)].frozen,
                    op_name(p, op) + ": a trainable module's stage this rank did not build");
      hold_stage(op.module, op.chunk, find_chunk_layers(p, op.module, op.stage, op.chunk));
    }
  result.llm_tokens = p.llm_tokens;
  result.samples = batch_.batch.samples;
  // The lowering's micro-batches (Entrain: the encoders level 1, the LLM level 2).
  entrain_ = plan_.microbatching == MicrobatchPolicy::kEntrain;
  const MicrobatchAssignment& assignment = p.llm_microbatches;
  // Colocated encoders run the whole batch at once (as the lowering has them): only the LLM's
  // micro-batches, level 2, exist there.
  encoder_assignment_ =
      plan_.placement == Placement::kColocated ? assignment : p.encoder_microbatches;
  my_micro_batches_ = assignment[static_cast<std::size_t>(places_->llm_dp_index())];
  assignment_ = assignment;
  boundary_.start_step();
  micro_batches_.clear();
  dip_pieces_.clear();
  dip_received_.clear();
  slots_.clear();
  received_.clear();
  has_w_.clear();
  sends_grad_.clear();
  cuts_.clear();
  recomputed_.clear();
  forward_pieces_.clear();
  piece_times_.clear();
  gathers_.clear();
  gathered_early_.clear();
  messages_.start(p);
  loss_sum_ = torch::zeros({}, on_device(torch::kFloat64));
  const auto& ops = p.ranks[static_cast<std::size_t>(rank_)];
  fused_.assign(ops.size(), 0);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::kCompute && op.phase == Phase::kW)
      has_w_.insert({op.module, op.chunk, op.microbatch, op.sub_microbatch});
    // A W right after its own B: one backward pass computes both (the W op then has nothing
    // left to do), instead of walking the graph twice.
    if (fused_with_backward(ops, i)) fused_[i - 1] = fused_[i] = 1;
    if (op.kind == OpKind::kSend && op.phase == Phase::kB)
      sends_grad_.insert({op.module, op.chunk, op.microbatch, op.sub_microbatch});
    // A backward in gradient-bucket pieces: its forward is cut where each piece begins.
    if (op.kind == OpKind::kCompute && op.phase == Phase::kB && (op.flags & kOpGradientBucket) &&
        op.first_layer > stage(op.module, op.chunk).begin())
      cuts_[{op.module, op.chunk, op.microbatch, op.sub_microbatch}].push_back(op.first_layer);
    // A forward in pieces (overlap_param_gather): the bottom piece's op runs them all.
    if (op.kind == OpKind::kCompute && op.phase == Phase::kF && (op.flags & kOpGradientBucket) &&
        op.first_layer > stage(op.module, op.chunk).begin())
      forward_pieces_[{op.module, op.chunk, op.microbatch, op.sub_microbatch}][op.first_layer] =
          static_cast<int32_t>(i);
    if (op.kind == OpKind::kCompute && op.phase == Phase::kR)
      recomputed_.insert({op.module, op.chunk, op.microbatch, op.sub_microbatch});
  }
  optimizers_->start_iteration();

  result.times.assign(ops.size(), OpTime{});
  // On a GPU an op's host time is when it was queued: CUDA events time what it ran.
  if (device_setting().device.is_cuda() && !cuda_clock_)
    cuda_clock_ = std::make_unique<CudaOpClock>();
  if (cuda_clock_) cuda_clock_->start();
  const auto start = std::chrono::steady_clock::now();
  started_ = start;
  result.prepare_s = std::chrono::duration<double>(start - prepare).count();
  result.started_s = std::chrono::duration<double>(start.time_since_epoch()).count();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    current_op_ = static_cast<int32_t>(i);
    await_gathers(op);
    const double begin = now();
    if (cuda_clock_) cuda_clock_->mark(2 * i);
    const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
    switch (op.kind) {
      case OpKind::kCompute: {
        if (fused_[i] && op.phase == Phase::kW) break;  // done by its B
        if (op.phase == Phase::kF && forward_pieces_.count(key) &&
            forward_pieces_.at(key).count(op.first_layer))
          break;                           // run by the bottom piece
        if (fused_[i]) has_w_.erase(key);  // B does the weights too
        std::vector<CommRecord> inside;
        record_collectives(&inside);
        gather_slices(op);
        compute(op);
        record_collectives(nullptr);
        for (const CommRecord& c : inside)
          result.nested.push_back({static_cast<int32_t>(i), c.kind, c.start_s - result.started_s,
                                   c.finish_s - result.started_s, c.bytes});
        break;
      }
      case OpKind::kSend: {
        if (op.purpose == Purpose::kBoundary) {
          dip_ ? dip_boundary(op) : boundary_p2p(op);
          break;
        }
        const Slot& slot = slots_.at(key);
        torch::Tensor t =
            (op.phase == Phase::kF ? slot.output : slot.input_grads.at(0)).detach().contiguous();
        if ((op.flags & kOpTpScattered) != 0) t = tp_slice(op, t);
        messages_.send(op, t);
        break;
      }
      case OpKind::kRecv: {
        if (op.purpose == Purpose::kBoundary) {
          dip_ ? dip_boundary(op) : boundary_p2p(op);
          break;
        }
        torch::Tensor t;
        if (op.phase == Phase::kF) {
          const ModuleSpec& spec = model.modules[static_cast<std::size_t>(op.module)];
          if (spec.role == ModuleRole::kLlm) {
            // This CP rank's tokens; under sequence parallelism this TP rank's rows of them.
            const MicroBatch& b = micro_batch(op.microbatch);
            const int64_t rows =
                b.attention.sequence_parallel()
                    ? b.attention.sp_rows[static_cast<std::size_t>(b.attention.sp->rank)]
                    : static_cast<int64_t>(b.local.size());
            t = torch::zeros({rows, spec.transformer->hidden}, activation_options());
          } else if (spec.role == ModuleRole::kEncoder && spec.modality == Modality::kAudio) {
            // A pipelined audio encoder: its windows' tokens back to back between its stages.
            int64_t tokens = 0;
            for (const int64_t n : stage(op.module, op.chunk).audio_tokens(audio_windows(op)))
              tokens += n;
            t = torch::zeros({tokens, spec.transformer->hidden}, activation_options());
          } else {
            // A pipelined image or video encoder: (pieces, tokens per piece, hidden) between its
            // stages.
            TESSERA_CHECK(
                spec.role == ModuleRole::kEncoder && spec.patching,
                "activations of " + spec.name + " across ranks are not in the executor yet");
            int64_t pieces = 0;
            if (dip_)
              pieces = dip_pieces(op.module, op.microbatch)
                           .at(static_cast<std::size_t>(op.sub_microbatch))
                           .count;
            else
              for (int32_t sample : samples_for(op.module, op.microbatch))
                for (const MediaItem& item : media_items(
                         model, spec, batch_.batch.samples[static_cast<std::size_t>(sample)]))
                  pieces += item.pieces;
            const int64_t size = spec.patching->image_size;
            t = torch::zeros(
                {pieces, image_tokens(spec, size, size).encoder_tokens, spec.transformer->hidden},
                activation_options());
          }
        } else {
          t = torch::zeros_like(slots_.at(key).output);
        }
        if ((op.flags & kOpTpScattered) != 0) {
          // This rank's slice now; the compute op that consumes it gathers the whole.
          torch::Tensor part = torch::empty_like(tp_slice(op, t));
          messages_.receive(op, part);
          slices_[{key, op.phase}] = {part, t};
          break;
        }
        messages_.receive(op, t);
        deliver(key, op.phase, t);
        break;
      }
      case OpKind::kCollective:
        if (gathered_early_.erase(static_cast<int32_t>(i)) > 0) break;  // posted by a piece
        if (op.purpose == Purpose::kBoundary)
          boundary_collective(op);
        else
          gradient_collective(op);
        break;
      case OpKind::kOptimizerStep:
        if (!optimizers_->synchronized()) optimizers_->synchronize(loss_sum_, groups_.world());
        // Every gradient is in (the norm took them all): the trainable weights' bf16 copies are
        // done with, and go before AdamW runs and before the weights change, some of them (a fully
        // sharded gather's) without an autograd version to show it.
        working_copies_.drop_trainable();
        optimizers_->step(op.module);
        break;
    }
    if (cuda_clock_) cuda_clock_->mark(2 * i + 1);
    result.times[i] = {begin, now()};
  }
  // The pieces of a forward run by its bottom piece: each timed from the layer crossings.
  for (const auto& [i, times] : piece_times_) {
    OpTime& t = result.times[static_cast<std::size_t>(i)];
    if (times.first > 0) t.start_s = times.first;
    if (times.second > 0) t.finish_s = times.second;
  }
  for (auto& [i, pending] : gathers_)
    for (PendingCollective& g : pending) g.finish();
  gathers_.clear();
  messages_.finish();
  if (!optimizers_->synchronized()) optimizers_->synchronize(loss_sum_, groups_.world());
  result.step_s = now();
  if (cuda_clock_) {
    const std::vector<double> s = cuda_clock_->seconds(2 * ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) result.times[i] = {s[2 * i], s[2 * i + 1]};
    cuda_synchronize();
    result.step_s = now();
  }
  result.loss = optimizers_->loss();
  result.grad_norm = optimizers_->grad_norm();
  slots_.clear();
  received_.clear();
  slices_.clear();
  program_ = nullptr;
  return result;
}

torch::Tensor Worker::tp_slice(const Op& op, const torch::Tensor& whole) const {
  const Comm& tp = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  TESSERA_CHECK(whole.numel() % tp.size() == 0,
                op_name(*program_, op) + ": " + std::to_string(whole.numel()) +
                    " values do not split into " + std::to_string(tp.size()) + " slices");
  return whole.reshape({-1}).chunk(tp.size()).at(static_cast<std::size_t>(tp.rank)).contiguous();
}

void Worker::gather_slices(const Op& op) {
  // A forward consumes a received activation, a backward (or its recomputation) a gradient.
  const Phase received = op.phase == Phase::kF ? Phase::kF : Phase::kB;
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  for (const NestedCollective& n : op.nested) {
    if (n.purpose != Purpose::kPp) continue;
    const auto found = slices_.find({key, received});
    TESSERA_CHECK(found != slices_.end(), op_name(*program_, op) + ": no slice received to gather");
    const auto [part, whole] = found->second;
    slices_.erase(found);
    const Comm& tp = groups_.get(program_->groups[static_cast<std::size_t>(n.group)]);
    const torch::Tensor rows =
        all_gather_rows(tp, part.view({1, -1}), std::vector<int64_t>(tp.ranks.size(), 1));
    deliver(key, received, rows.reshape(whole.sizes()).clone());
  }
}

void Worker::deliver(const Key& key, Phase phase, torch::Tensor t) {
  if (phase == Phase::kF) {
    t.set_requires_grad(sends_grad_.count(key) > 0);
    received_[key] = t;
  } else {
    slots_.at(key).output_grad = t;
  }
}

void Worker::compute(const Op& op) {
  if (op.phase == Phase::kF) return forward(op);
  if (op.phase == Phase::kR) return recompute(op);
  backward(op, op.phase == Phase::kW);
}

double Worker::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

}  // namespace tessera::exec

// The lowering's working state, shared by the files of shared/lowering/ (not a public
// interface: lower.hpp is). One Lowering turns one iteration of a plan into a Program; its
// methods live by concern: ranks.cpp (grids, groups, schedule orders), samples.cpp (which
// samples each micro-batch holds, their work), compute_op.cpp (what one compute op costs),
// gradients.cpp (memory, gradient buckets, reductions and optimizer steps), pipelines.cpp
// (homogeneous and non-colocated), colocated.cpp, dip.cpp, and lower.cpp (the driver).
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "shared/base/check.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/dip_schedule.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/layout/rank_groups.hpp"
#include "shared/layout/schedule.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::lowering {

// Coordinates of a rank in a module grid (Megatron order tp-cp-dp-pp).
using Coord = GridCoord;  // a rank's TP, CP, DP and pipeline indices in its module's grid

using LayerRange = std::pair<int64_t, int64_t>;  // layers [first, end) of a module

// Parameters of a module's layers [a, b) on one of `tp` tensor-parallel ranks (routed experts
// over `ep`, their matrices over `etp`: tp where 0), with the input side (embedding, patch or audio
// front end) when a is 0 and the output side (final norm, output head) when b ends the stack; a
// projector whole. Multi-token-prediction layers embed the tokens ahead: a range holding them
// without the stack's first layer holds a copy of the vocabulary embedding too (Megatron-LM's last
// pipeline stage).
inline double range_parameters(const ModuleSpec& spec, int64_t a, int64_t b, int64_t tp,
                               int64_t ep = 1, int64_t etp = 0) {
  double params = 0;
  if (const auto& t = spec.transformer) {
    params += stack_parameters(*t, a, b, tp, ep, etp);
    if (a == 0) params += input_side_parameters(spec, tp);
    if (b == stack_end(*t)) params += output_side_parameters(spec, tp);
    if (a > 0 && mtp_layers_in(*t, a, b) > 0)
      params += static_cast<double>(t->vocab * t->hidden) / static_cast<double>(tp);
  }
  if (spec.projector) params += projector_parameters(*spec.projector, tp);
  return params;
}

struct ModuleInfo {
  int index = 0;
  const ModuleSpec* spec = nullptr;
  ModuleLayout layout;
  int64_t first = 0;
  int host = -1;  // module whose ranks (last stage) this one borrows; -1: its own
  GradientFlow flow;
  std::vector<std::pair<int64_t, int64_t>>
      chunk_layers;  // virtual stage k = chunk*pp + stage -> [begin, end)

  int64_t rank(const Coord& x) const { return grid_rank(layout, first, x); }
  bool owns(int64_t r) const { return r >= first && r < first + layout.size(); }
  Coord coord(int64_t r) const { return grid_coord(layout, first, r); }
  int64_t chunks() const { return layout.pp * layout.vpp; }
};

// A send or receive on the p2p stream, about `about`'s module, stage, chunk and micro-batch.
inline Op p2p_op(const Op& about, OpKind kind, Phase phase, int64_t peer, double bytes,
                 int64_t tag) {
  Op op = about;
  op.kind = kind;
  op.stream = StreamKind::kP2p;
  op.phase = phase;
  op.peer = static_cast<int32_t>(peer);
  op.message_bytes = bytes;
  op.tag = tag;
  return op;
}

// A collective on the collective stream; callers add what else it needs (micro-batch, deps).
inline Op collective_op(CollectiveKind kind, Purpose purpose, Phase phase, int module,
                        int32_t group, double bytes) {
  Op op;
  op.kind = OpKind::kCollective;
  op.stream = StreamKind::kCollective;
  op.collective = kind;
  op.purpose = purpose;
  op.phase = phase;
  op.module = static_cast<int16_t>(module);
  op.group = group;
  op.message_bytes = bytes;
  return op;
}

class Lowering {
 public:
  Lowering(const ModelSpec& model, const ClusterSpec& cluster, const ParallelPlan& plan,
           const WorkloadSpec& workload, const Batch& batch, const DipSchedule* dip,
           RankFolding folding, Lowered& out)
      : run_model_(heads_padded(model, plan)),
        model_(run_model_),
        real_model_(model),
        cluster_(cluster),
        plan_(plan),
        workload_(workload),
        batch_(batch),
        dip_(dip ? *dip : DipSchedule{}),
        folding_(folding),
        out_(out),
        p_(out.program) {}

  void run();

 private:
  // --- set-up --------------------------------------------------------------------------
  void place(const std::vector<PlacedModule>& placed);
  void assign_samples();
  // RankFolding::kIdentical: which ranks lower their ops (Program::represented_by; folding.cpp).
  void fold_ranks();
  // Every data-parallel replica's micro-batches hold samples of the same shapes as replica 0's,
  // at both of Entrain's levels, and finish the same encoder micro-batches.
  bool identical_replicas();
  // Whether every rank of the LLM's grid, represented by the rank at coordinates `to(x)`, has
  // groups and pipeline neighbours placed on the nodes as that rank's are.
  bool same_costs(const std::function<Coord(const Coord&)>& to) const;
  // Whether `rank` lowers its own ops (a folded Program's representative, or any rank).
  bool lowers(int64_t rank) const { return representative(p_, rank) == rank; }
  // Context parallelism splits the LLM's sequence. An encoder (or projector) on the LLM's grid
  // — a homogeneous plan — runs whole on every CP rank, as Megatron-LM and the executor run it:
  // each CP rank encodes its micro-batch's media and keeps its own tokens' rows. A module on a
  // grid of its own splits over that grid's CP.
  bool whole_on_cp_ranks(const ModuleInfo& m) const {
    return plan_.placement == Placement::kHomogeneous && m.spec->role != ModuleRole::kLlm &&
           m.spec->role != ModuleRole::kGenerator;
  }
  // The ranks TP splits module `m` over: its grid's TP, or 1 where it runs whole on every TP rank
  // (indivisible_heads replicate).
  int64_t split_tp(const ModuleInfo& m) const {
    const ModuleInfo& grid = grid_of(m);
    return replicated_over_tp(plan_, model_, *m.spec) ? 1 : grid.layout.tp;
  }
  // The ranks TP splits module `m`'s routed experts over: its grid's expert TP, or 1 where the
  // module runs whole on every TP rank.
  int64_t split_etp(const ModuleInfo& m) const {
    return split_tp(m) == 1 ? 1 : grid_of(m).layout.expert_tp();
  }
  // The samples a replica of `module` handles in micro-batch `mb` (-1: all). Under Entrain the
  // encoders and their projectors run the level-1 micro-batches, the LLM the level-2 ones;
  // `encoder_level` asks for the level-1 ones of any module (the LLM's replica, say).
  const std::vector<const Sample*>& samples_of(int module, int64_t replica, int32_t mb,
                                               bool encoder_level = false);
  const std::vector<const Sample*>& media_of(int module, int64_t dp, int64_t replica, int32_t mb);
  // The encoder micro-batches of LLM replica `replica` whose last sample the LLM takes in its
  // micro-batch `mb`, in order: {mb}, or under Entrain also mb - 1, or only mb - 1, or none.
  const std::vector<int32_t>& encoder_microbatches_done(int64_t replica, int32_t mb);
  const ModuleWork& work_of(int module, std::span<const Sample* const> samples);
  // Tokens and attention pairs of each CP rank for the LLM sequence of `samples`, and the
  // attention work's max/mean under the plan's split and under the uniform one.
  struct CpShare {
    std::vector<double> tokens, pairs;
    double balance = 1, uniform_balance = 1;
    int64_t replica = 0;  // the data-parallel replica (CP group) whose micro-batch it is
  };
  const CpShare& cp_share(std::span<const Sample* const> samples, int64_t cp, int64_t replica);

  // Full and per-op recomputation run (part of) a module's transformer layers again before their
  // backward (an R op); projectors and the layers' front and back ends keep their activations.
  bool recomputes(const ModuleInfo& m) const {
    return (plan_.recompute == Recompute::kFull || plan_.recompute == Recompute::kPerOp) &&
           m.spec->transformer && m.spec->transformer->layers > 0;
  }

  // The phases a module's whole-chunk backward runs, in order: R where it recomputes, B, and W
  // where it trains.
  std::vector<Phase> backward_phases(const ModuleInfo& m) const {
    std::vector<Phase> phases;
    if (recomputes(m)) phases.push_back(Phase::kR);
    phases.push_back(Phase::kB);
    if (m.flow.trainable) phases.push_back(Phase::kW);
    return phases;
  }

  // The end of the layers of chunk `k_chunk` of `m` that full recomputation runs again: the
  // chunk's first plan.recompute_layers (Megatron-LM's block method), or all of them.
  int64_t recompute_end(const ModuleInfo& m, int32_t k_chunk) const {
    const auto [begin, end] = m.chunk_layers[static_cast<std::size_t>(k_chunk)];
    return plan_.recompute_layers > 0 ? std::min(end, begin + plan_.recompute_layers) : end;
  }

  // Under DIP an encoder is a pipeline segment of its own on the LLM's stages.
  bool dip_encoder(const ModuleInfo& m) const {
    return plan_.schedule == Schedule::kDip && m.spec->role == ModuleRole::kEncoder;
  }

  // --- groups --------------------------------------------------------------------------
  int32_t group(RankList members);
  struct GroupIndex {  // per rank of a grid's span, its group's index in each kind's list
    std::vector<int32_t> tp, cp, tpcp, dpcp, ep, edp, kv, stage;
  };
  // A rank's group of one kind in `m`'s grid, as rank_groups() builds it (`m` owns the grid).
  int32_t grid_group(const ModuleInfo& m, const Coord& x, std::vector<Group> ModuleGroups::*kind,
                     std::vector<int32_t> GroupIndex::*index) {
    const auto i = static_cast<std::size_t>(m.index);
    const ModuleGroups& g = grids_[i];
    const int64_t r = m.rank(x);
    const bool in_span = r >= g.first_rank && r < g.first_rank + g.size;
    const int32_t at =
        in_span ? (grid_index_[i].*index)[static_cast<std::size_t>(r - g.first_rank)] : -1;
    TESSERA_CHECK(at >= 0,
                  "rank " + std::to_string(r) + " has no group in " + g.module + "'s grid");
    const int32_t id = group((g.*kind)[static_cast<std::size_t>(at)]);
    if (!class_members_.empty()) record_member_groups(i, r, id, kind, index);
    return id;
  }
  // A folded Program: the groups the members of representative `rank`'s class use in place of
  // its group `id` of one kind in module `module`'s grid (Program::member_groups).
  void record_member_groups(std::size_t module, int64_t rank, int32_t id,
                            std::vector<Group> ModuleGroups::*kind,
                            std::vector<int32_t> GroupIndex::*index);
  int32_t tp_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::tp, &GroupIndex::tp);
  }
  int32_t cp_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::cp, &GroupIndex::cp);
  }
  int32_t tpcp_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::tpcp, &GroupIndex::tpcp);
  }
  // Gradients are reduced over data and context replicas (Megatron's dp-cp group).
  int32_t dpcp_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::dpcp, &GroupIndex::dpcp);
  }
  int32_t ep_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::ep, &GroupIndex::ep);
  }
  // Key/value heads replicated over TP ranks: their gradients are summed over those ranks.
  int32_t kv_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::kv, &GroupIndex::kv);
  }
  // Every rank of one pipeline stage of the grid (its TP, CP and DP ranks): Megatron-LM's
  // tensor-and-data-parallel group with CP, over which FP8 delayed scaling reduces its amaxes.
  int32_t stage_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::stages, &GroupIndex::stage);
  }
  // Routed experts' gradients are reduced over the replicas of one expert shard.
  int32_t edp_group(const ModuleInfo& m, const Coord& x) {
    return grid_group(m, x, &ModuleGroups::edp, &GroupIndex::edp);
  }

  // --- ops -----------------------------------------------------------------------------
  int32_t emit(int64_t rank, Op op) {
    if (op.kind == OpKind::kCompute)
      if (const auto it = gather_next_.find(rank); it != gather_next_.end()) {
        op.nested.insert(op.nested.begin(), it->second);
        gather_next_.erase(it);
      }
    auto& ops = p_.ranks[static_cast<std::size_t>(rank)];
    ops.push_back(std::move(op));
    return static_cast<int32_t>(ops.size() - 1);
  }
  // --- stage-to-stage messages (activations forward, their gradients backward) ----------
  // Whether the TP ranks of `grid`'s stages exchange 1/tp slices (pipeline_scatter_gather):
  // without sequence parallelism each holds the whole activation.
  bool scatters(const ModuleInfo& grid) const {
    return plan_.pipeline_scatter_gather && !sequence_parallel_for(plan_, *grid.spec) &&
           grid.layout.tp > 1;
  }
  // Bytes one rank of `grid` sends a neighbouring stage for `tokens` tokens of `width` values:
  // split over context parallelism and, sliced by sequence parallelism or scatter-gather, over TP.
  double stage_message_bytes(const ModuleInfo& grid, int64_t tokens, int64_t width) const {
    const int64_t tp_split =
        sequence_parallel_for(plan_, *grid.spec) || scatters(grid) ? grid.layout.tp : 1;
    return static_cast<double>(tokens * width * dtype_bytes(model_.dtype)) /
           static_cast<double>(grid.layout.cp * tp_split);
  }
  Op stage_message(const Op& about, OpKind kind, Phase phase, int64_t peer, const ModuleInfo& grid,
                   const Coord& x, double bytes, int64_t tag) {
    Op op = p2p_op(about, kind, phase, peer, bytes, tag);
    if (scatters(grid)) {
      op.flags |= kOpTpScattered;
      op.group = tp_group(grid, x);
    }
    return op;
  }
  // Emits a stage message's receive. A slice is reassembled by an all-gather over the TP group
  // at the start of the compute op that consumes it (Megatron gathers before it computes): the
  // next compute op emitted on this rank. Returns the receive.
  int32_t receive(int64_t rank, const Op& recv) {
    if ((recv.flags & kOpTpScattered) != 0) {
      const double members =
          static_cast<double>(p_.groups[static_cast<std::size_t>(recv.group)].size());
      gather_next_[rank] = NestedCollective{CollectiveKind::kAllGather, Purpose::kPp, recv.group, 1,
                                            recv.message_bytes * members};
    }
    return emit(rank, recv);
  }
  std::map<int64_t, NestedCollective> gather_next_;  // rank -> the gather its next compute runs

  // The op at `last` frees the activations its forward (found under `key`) stashed.
  template <class Map, class Key>
  void release(int64_t rank, int32_t last, const Map& forwards, const Key& key) {
    const auto it = forwards.find(key);
    if (it == forwards.end() || last < 0) return;
    auto& ops = p_.ranks[static_cast<std::size_t>(rank)];
    ops[static_cast<std::size_t>(last)].release_bytes =
        ops[static_cast<std::size_t>(it->second)].stash_bytes;
  }
  int32_t last_compute(int64_t rank) const {
    const auto& ops = p_.ranks[static_cast<std::size_t>(rank)];
    for (int32_t i = static_cast<int32_t>(ops.size()) - 1; i >= 0; --i)
      if (ops[static_cast<std::size_t>(i)].stream == StreamKind::kCompute) return i;
    return -1;
  }
  // The chunk, among those a rank holds, of m's virtual stage k_chunk (Op::chunk).
  int16_t chunk_of(const ModuleInfo& m, int64_t k_chunk) const {
    if (plan_.placement == Placement::kHomogeneous && m.index != llm_) return 0;
    return static_cast<int16_t>(k_chunk / std::max<int64_t>(1, m.layout.pp));
  }
  // A Compute op of `m` on `rank` for the layers of virtual stage `k_chunk` (or only `piece`, a
  // part of them) of micro-batch `mb` (-1: whole local batch).
  Op compute(const ModuleInfo& m, int64_t rank, int32_t k_chunk, int32_t mb, Phase phase,
             std::span<const Sample* const> samples, const LayerRange* piece = nullptr);
  // A message's tag (Op::tag), unique among the messages between two ranks: which kind of
  // message, whose, from which virtual stage, which way, for which micro-batch.
  struct MessageTag {
    enum Kind : int {
      kStage = 0,       // a module's pipeline message between two of its virtual stages
      kLink = 1,        // a boundary message over a link between two modules' grids
      kDipStage = 2,    // DIP: an encoder segment's message between two pipeline stages
      kDipBoundary = 3  // DIP: an encoder segment's output to the LLM's stage, or its gradient
    };
    Kind kind = kStage;
    int module = 0;         // the module (kStage), producer (kLink) or DIP segment
    int consumer = 0;       // kLink: the consumer host module
    int64_t from = 0;       // the sending virtual stage (kStage, kDipStage); kLink: the consumer
                            // replica
    bool backward = false;  // a gradient going back
    int32_t microbatch = 0;
    int32_t sub = 0;  // a DIP sub-micro-batch, or a producer replica among those of a consumer

    static MessageTag stage(int module, int64_t from, bool backward, int32_t mb) {
      return {kStage, module, 0, from, backward, mb, 0};
    }
    static MessageTag link(int producer, int consumer_host, int64_t consumer_replica, bool backward,
                           int32_t mb, int32_t sub) {
      return {kLink, producer, consumer_host, consumer_replica, backward, mb, sub};
    }
    static MessageTag dip_stage(int segment, int64_t from, bool backward, int32_t mb, int32_t sub) {
      return {kDipStage, segment, 0, from, backward, mb, sub};
    }
    static MessageTag dip_boundary(int segment, bool backward, int32_t mb, int32_t sub) {
      return {kDipBoundary, segment, 0, 0, backward, mb, sub};
    }
    // Packed into 63 bits: kind 8, the two modules 8 each, stage 12, direction 1, micro-batch
    // 14, sub 12. A field out of its range would alias another message: checked.
    int64_t packed() const {
      const auto fits = [](int64_t value, int bits) { return value >= 0 && value < (1 << bits); };
      TESSERA_CHECK(fits(kind, 8) && fits(module, 8) && fits(consumer, 8) && fits(from, 12) &&
                        fits(microbatch, 14) && fits(sub, 12),
                    "message tag fields out of range: kind " + std::to_string(kind) + ", modules " +
                        std::to_string(module) + " " + std::to_string(consumer) +
                        ", virtual stage " + std::to_string(from) + ", micro-batch " +
                        std::to_string(microbatch) + ", sub " + std::to_string(sub));
      return ((((static_cast<int64_t>(kind) * 256 + module) * 256 + consumer) * 4096 + from) * 2 +
              (backward ? 1 : 0)) *
                 (int64_t{1} << 26) +
             static_cast<int64_t>(microbatch) * 4096 + sub;
    }
  };

  // --- placements ------------------------------------------------------------------------
  void lower_pipelines();  // homogeneous and non_colocated (pipelines.cpp)
  // One pipeline of lower_pipelines: the module owning its ranks, the modules that share them,
  // and the pipelines it exchanges boundary messages with.
  struct Pipeline {
    int owner = -1;
    std::vector<int> prefix;  // before the owner in its first stage (homogeneous: the encoders)
    std::vector<int> suffix;  // after it in its last stage (borrowed projectors, a generator)
    std::vector<std::pair<int, int>> producers;  // (producer's host, the producer) per input
    std::vector<int> consumers;                  // hosts consuming the last module's output
    int last_module = -1;
    bool prefix_backward = false, suffix_backward = false;
  };
  std::vector<Pipeline> pipelines() const;
  struct StageWalk;  // one rank's walk through its schedule
  void walk_stage(const Pipeline& pipe, int64_t rank);
  void stage_forward(const Pipeline& pipe, StageWalk& w, const ScheduleItem& item);
  void stage_backward(const Pipeline& pipe, StageWalk& w, const ScheduleItem& item);
  // One schedule item of a module's pipeline at grid coordinate x: its virtual stage, its
  // samples, the fields its ops share, and the activations it exchanges with its neighbours.
  struct StageItem {
    int64_t k = 0;  // virtual stage
    int32_t mb = 0;
    const std::vector<const Sample*>* samples = nullptr;
    Op about;
    double act_bytes = 0;
  };
  StageItem stage_item(const ModuleInfo& owner, const Coord& x, const ScheduleItem& item);
  void forward_op(StageWalk& w, const ModuleInfo& m, int64_t k_chunk, const ScheduleItem& item,
                  std::span<const Sample* const> s);
  // m's forward of `item` ends at op `last`: what the walk's next op waits for, and what m's
  // backward of the item frees.
  void forwarded(StageWalk& w, const ScheduleItem& item, const ModuleInfo& m, int32_t last);
  void forward_module(StageWalk& w, const ModuleInfo& m, int64_t k_chunk, const ScheduleItem& item,
                      std::span<const Sample* const> s);
  void backward_module(const Pipeline& pipe, StageWalk& w, const ModuleInfo& m, int64_t k_chunk,
                       const ScheduleItem& item, std::span<const Sample* const> s, int32_t at_mb);
  void gather_parameters_first(const Pipeline& pipe, StageWalk& w,
                               const std::vector<ScheduleItem>& order);
  void receive_pipeline_input(const Pipeline& pipe, StageWalk& w, const Op& about);
  void send_pipeline_output(const Pipeline& pipe, StageWalk& w, const Op& about);
  void receive_output_gradients(const Pipeline& pipe, StageWalk& w, const Op& about,
                                std::span<const Sample* const> samples);
  void send_input_gradients(const Pipeline& pipe, StageWalk& w, const Op& about);
  // schedule dip: encoder segments and the LLM segment on the ranks of a homogeneous pipeline.
  void lower_dip();
  struct DipSegment {
    int encoder = -1;
    std::vector<int> projectors;  // after the encoder, on its last stage, in order
    int32_t backward_from = 0;    // first stage with a backward (P: none)
    // [replica][mb][sub] -> the media of the sub-micro-batch, as samples without text
    std::vector<std::vector<std::vector<const std::vector<const Sample*>*>>> pieces;
  };
  std::vector<DipSegment> dip_segments();
  static int dip_segment_last(const DipSegment& g) {  // the module whose output the LLM takes
    return g.projectors.empty() ? g.encoder : g.projectors.back();
  }
  static std::span<const Sample* const> dip_piece(const DipSegment& g, int64_t d, int32_t mb,
                                                  int32_t sub);
  DipPipeline dip_pipeline(const std::vector<DipSegment>& segments, int64_t d);
  struct DipWalk;  // one rank's walk through its stage's order (dip.cpp)
  void dip_llm_step(DipWalk& w);
  void dip_encoder_step(DipWalk& w);
  double dip_activation_bytes(const ModuleInfo& m, std::span<const Sample* const> samples);
  void dip_run(DipWalk& w, const ModuleInfo& m, int32_t k, Phase phase,
               std::span<const Sample* const> samples);
  // overlap_grad_reduce: emits the bucket reductions due in w.reduce_order whose backward has
  // run, stopping at the first that has not (all: emitting those too, after the last compute).
  void dip_reduce_ready(DipWalk& w, bool all);
  void dip_run_back(DipWalk& w, const ModuleInfo& m, int32_t k,
                    std::span<const Sample* const> samples);
  void dip_message(DipWalk& w, OpKind kind, Phase phase, int64_t stage, double bytes, int64_t tag,
                   int module, Purpose purpose);
  void dip_boundary_messages(DipWalk& w, OpKind kind, Phase phase);
  std::deque<Sample> piece_samples_;  // the sub-micro-batches' samples (stable addresses)
  std::deque<std::vector<const Sample*>> piece_sets_;
  void lower_colocated();  // colocated.cpp
  struct ColocatedRank;    // what one rank's phases hand each other
  void colocated_encoder_forward(ColocatedRank& c, int module);
  void colocated_llm_forward(ColocatedRank& c, const ScheduleItem& item,
                             const std::vector<int>& suffix);
  void colocated_llm_backward(ColocatedRank& c, const ScheduleItem& item,
                              const std::vector<int>& suffix);
  // The encoder outputs' gradients regrouped to every rank: the ops the encoders' backward waits
  // for.
  std::vector<int32_t> colocated_output_gradients(ColocatedRank& c);
  void gradient_reduction(int64_t rank, const std::vector<int>& modules);  // also accounts memory
  // overlap_grad_reduce: the pieces of virtual stage k's layers, last layers first, each holding
  // about grad_bucket_mb of this rank's gradients (at least one layer each).
  std::vector<LayerRange> gradient_buckets(const ModuleInfo& m, int64_t k) const;
  std::vector<LayerRange> gradient_buckets(const ModuleInfo& m, LayerRange layers) const;
  // fully_sharded: whether rank x of m's grid shards m (over more than one replica), and the
  // units it gathers and reduces one at a time: the gradient buckets of `layers`, last layers
  // first (a module without layers, a projector, is one unit).
  bool sharded(const ModuleInfo& m, const Coord& x);
  std::vector<LayerRange> sharded_units(const ModuleInfo& m, LayerRange layers) const;
  // The all-gather of one unit's weights (of virtual stage k_chunk) over rank x's replicas of m,
  // before the unit's `phase` of micro-batch mb, after op `after` (-1: none); returns the index
  // of the last op it emitted.
  int32_t gather_unit(int64_t rank, const ModuleInfo& m, const Coord& x, int64_t k_chunk,
                      int32_t mb, const LayerRange& unit, Phase phase, int32_t after);
  // The gather unit u of `units` (in the order they run) waits for: emitted, with the next
  // unit's, where `gathers` (those emitted so far) lacks them. The next one waits for the
  // compute before unit u, so it runs while u computes (FSDP2's prefetch).
  int32_t prefetched_gather(int64_t rank, const ModuleInfo& m, const Coord& x, int64_t k_chunk,
                            int32_t mb, const std::vector<LayerRange>& units, std::size_t u,
                            Phase phase, std::vector<int32_t>& gathers);
  // overlap_grad_reduce: whether rank x reduces m's gradients bucket by bucket during its
  // backward (m trains, has layers and more than one replica of them).
  bool reduces_in_buckets(const ModuleInfo& m, const Coord& x);
  // The reduction of one bucket's gradients (layers `piece` of m's virtual stage k_chunk) over
  // rank xm's replicas of m, after op `after` (the piece's weight gradients; -1: none); `mb`: the
  // micro-batch it belongs to (-1: the step's). Recorded in bucket_reductions_.
  void reduce_bucket(int64_t rank, const ModuleInfo& m, const Coord& xm, int64_t k_chunk,
                     const LayerRange& piece, uint32_t flags, int32_t mb, int32_t after);
  // m's backward of virtual stage k_chunk for micro-batch mb (sub-micro-batch sub) after `deps`,
  // bucket by bucket, each bucket's gradients reduced once its weight gradients are done (the
  // colocated and DIP lowerings; recomputation runs first, for the whole chunk). Returns the last
  // compute op. With `deferred`, the reductions are left to the caller: each bucket's layers
  // with the weight-gradient op its reduction waits for.
  int32_t backward_in_buckets(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                              int32_t sub, std::span<const Sample* const> s,
                              std::vector<int32_t> deps,
                              std::vector<std::pair<LayerRange, int32_t>>* deferred = nullptr);
  // overlap_param_gather: the all-gathers of the parameters of m's virtual stage k_chunk that
  // the previous step's optimizer updated, emitted now (the step's start), one per gradient
  // bucket, bottom up as the forward needs them; returns each bucket's layers with its gather.
  // m's parameters are then not gathered after this step's optimizer step.
  std::vector<std::pair<LayerRange, int32_t>> gather_buckets_at_start(int64_t rank,
                                                                      const ModuleInfo& m,
                                                                      const Coord& x,
                                                                      int64_t k_chunk);
  // m's forward of virtual stage k_chunk for micro-batch mb (sub-micro-batch sub) after `deps`,
  // piece by piece in the order given, each piece after the gather `gather(u)` gives it (which
  // may emit it); the activations the pieces stash are the last one's, kept and freed as one.
  // Returns the last op.
  int32_t forward_in_pieces(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                            int32_t sub, std::span<const Sample* const> s,
                            std::vector<int32_t> deps, const std::vector<LayerRange>& pieces,
                            const std::function<int32_t(std::size_t)>& gather);
  // The same in the pieces gather_buckets_at_start gave.
  int32_t forward_in_pieces(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                            int32_t sub, std::span<const Sample* const> s,
                            std::vector<int32_t> deps,
                            const std::vector<std::pair<LayerRange, int32_t>>& gathered);
  // fully_sharded: m's forward (backward) of virtual stage k_chunk for micro-batch mb
  // (sub-micro-batch sub) after `deps`, unit by unit, each unit's weights gathered first and the
  // next unit's while it runs (FSDP2's prefetch); in the backward each unit recomputed where m
  // recomputes, differentiated, and its gradients reduce-scattered. Return the last compute op.
  int32_t forward_units(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb, int32_t sub,
                        std::span<const Sample* const> s, std::vector<int32_t> deps);
  int32_t backward_units(int64_t rank, const ModuleInfo& m, int64_t k_chunk, int32_t mb,
                         int32_t sub, std::span<const Sample* const> s, std::vector<int32_t> deps);
  // overlap_grad_reduce: the bucket reductions each rank emitted, per module; those modules get
  // no reduction after the backward.
  std::map<int64_t, std::map<int, std::vector<int32_t>>> bucket_reductions_;
  // overlap_param_gather: the modules whose parameters each rank gathers at the step's start
  // (none after its optimizer step).
  std::map<int64_t, std::set<int>> gathered_at_start_;
  // Bytes per value of the weights (the parameter gathers) and of the gradients reduced.
  double weight_value_bytes() const { return static_cast<double>(dtype_bytes(model_.dtype)); }
  // Bytes per value of layers [a, b) of m's weights as its data-parallel gathers carry them: the
  // model's dtype, or (fp8_param_gather) one byte for the layers' weights, which are kept in FP8.
  double gathered_value_bytes(const ModuleInfo& m, int64_t a, int64_t b) const {
    const double all = bucket_bytes(m, a, b, 1);
    if (!plan_.fp8_param_gather || !m.spec->transformer || all <= 0) return weight_value_bytes();
    const double fp8 = fp8_layer_parameters(m, a, b);
    return (fp8 + (all - fp8) * weight_value_bytes()) / all;
  }
  // The parameters of layers [a, b) of m on one rank that FP8 GEMMs use (its transformer layers'
  // weights, norms counted with them); 0 without fp8.
  double fp8_layer_parameters(const ModuleInfo& m, int64_t a, int64_t b) const {
    if (plan_.fp8 == Fp8Recipe::kNone || !m.spec->transformer) return 0;
    return stack_parameters(*m.spec->transformer, a, b, split_tp(m), grid_of(m).layout.ep,
                            split_etp(m));
  }
  double gradient_value_bytes() const {
    return static_cast<double>(reduced_gradient_bytes(plan_, model_.dtype));
  }
  // The weights of layers [a, b) of `m` on one rank of its grid, `value_bytes` each (buckets are
  // cut by their weights' bytes, as Megatron-LM counts buckets in parameters).
  double bucket_bytes(const ModuleInfo& m, int64_t a, int64_t b, double value_bytes) const {
    const ModuleLayout& l = grid_of(m).layout;
    return range_parameters(*m.spec, a, b, split_tp(m), l.ep, split_etp(m)) * value_bytes;
  }
  // The gradients of those that are key/value heads replicated over TP ranks (0 when the module
  // has as many as TP).
  double bucket_kv_bytes(const ModuleInfo& m, int64_t a, int64_t b) const {
    const int64_t tp = split_tp(m);
    if (!m.spec->transformer || tp == 1) return 0;
    return static_cast<double>(b - a) * kv_replica_parameters(*m.spec->transformer, tp) *
           gradient_value_bytes();
  }
  // The sum over TP ranks of `bytes` of replicated key/value heads' gradients of `m`
  // (kOpKvReplicas), shaped as `shape` (its stage, and a bucket's layers), after shape.deps and
  // before their data-parallel reduction; returns its index, or shape's dependency when there is
  // nothing to sum.
  int32_t sum_kv_replicas(int64_t rank, const ModuleInfo& m, const Coord& x, double bytes,
                          Op shape) {
    if (bytes <= 0) return shape.deps.empty() ? -1 : shape.deps.front();
    // The module's own heads' groups.
    return sum_over_tp(rank, kv_group(m, x), kOpKvReplicas, bytes, std::move(shape));
  }
  // A TP all-reduce of `bytes` (> 0) of partial gradients over `group`, flagged `flag`, shaped
  // as `shape`; returns its index.
  int32_t sum_over_tp(int64_t rank, int32_t group, OpFlag flag, double bytes, Op shape) {
    shape.purpose = Purpose::kTp;
    shape.collective = CollectiveKind::kAllReduce;
    shape.group = group;
    shape.message_bytes = bytes;
    shape.flags |= flag;
    return emit(rank, std::move(shape));
  }
  // The gradients of m's layers [a, b), and of its final norm where b ends the stack, that
  // sequence parallelism leaves partial on each TP rank (0 without it).
  double bucket_sequence_partial_bytes(const ModuleInfo& m, int64_t a, int64_t b) const {
    if (!sequence_parallel_for(plan_, *m.spec) || !m.spec->transformer || split_tp(m) == 1)
      return 0;
    const TransformerArch& t = *m.spec->transformer;
    double n = sum_over_layers(
        t, a, b, [](const TransformerArch& layer) { return sequence_partial_parameters(layer); });
    if (b == t.layers && t.final_norm) n += static_cast<double>(norm_parameters(t.norm, t.hidden));
    return n * gradient_value_bytes();
  }
  // The sum over TP ranks of `bytes` of those gradients (kOpSequencePartial), shaped as `shape`
  // (its stage, and a bucket's layers), after shape.deps and before their data-parallel
  // reduction, as Megatron-LM sums them before its optimizer; returns its index, or shape's
  // dependency when there is nothing to sum.
  int32_t sum_sequence_partial(int64_t rank, const ModuleInfo& m, const Coord& x, double bytes,
                               Op shape) {
    if (bytes <= 0) return shape.deps.empty() ? -1 : shape.deps.front();
    return sum_over_tp(rank, tp_group(grid_of(m), x), kOpSequencePartial, bytes, std::move(shape));
  }
  // Of those, the routed experts' where EP splits them (0 otherwise).
  double bucket_expert_bytes(const ModuleInfo& m, int64_t a, int64_t b, double value_bytes) const {
    return expert_range_parameters(m, a, b) * value_bytes;
  }
  // The routed experts' parameters of layers [a, b) of `m` on one rank, where EP splits them or
  // an expert TP below TP leaves them whole on each TP rank.
  double expert_range_parameters(const ModuleInfo& m, int64_t a, int64_t b) const {
    const ModuleLayout& l = grid_of(m).layout;
    if (!m.spec->transformer || (l.ep == 1 && l.expert_tp() == l.tp)) return 0;
    const TransformerArch& t = *m.spec->transformer;
    return static_cast<double>(moe_layers(t, a, b)) *
           expert_layer_parameters(t, split_etp(m), l.ep);
  }
  // Leaves kOpEpCommOverlap only on the compute ops a forward-backward pair can overlap.
  void pair_expert_overlap();
  void account_memory(int64_t rank, const std::vector<int>& modules);
  // The data-parallel collective `shape` (kind, purpose, module, its dp-cp group) of `bytes` of
  // module state on rank x of `owner`'s grid, `expert_bytes` of them routed experts that EP
  // splits: those in a second op over their expert-data-parallel group (kOpRoutedExperts).
  std::vector<Op> dp_collectives(const Op& shape, const ModuleInfo& owner, const Coord& x,
                                 double bytes, double expert_bytes) {
    Op rest = shape, experts = shape;
    rest.message_bytes = bytes;
    if (expert_bytes <= 0) return {rest};
    rest.message_bytes = bytes - expert_bytes;
    experts.message_bytes = expert_bytes;
    experts.group = edp_group(owner, x);
    experts.flags |= kOpRoutedExperts;
    return {rest, experts};
  }
  // Emits dp_collectives(), the second after the first; returns the ops' indices.
  std::vector<int32_t> emit_dp_collectives(int64_t rank, const Op& shape, const ModuleInfo& owner,
                                           const Coord& x, double bytes, double expert_bytes) {
    std::vector<int32_t> ids;
    for (Op op : dp_collectives(shape, owner, x, bytes, expert_bytes)) {
      if (!ids.empty()) op.deps = {ids.back()};
      ids.push_back(emit(rank, std::move(op)));
    }
    return ids;
  }
  const ModuleInfo& grid_of(const ModuleInfo& m) const;
  // The layer ranges of `m` rank x holds: one per virtual chunk.
  std::vector<LayerRange> held_layers(const ModuleInfo& m, const Coord& x) const;
  double parameters_on(const ModuleInfo& m, const Coord& x) const;
  // Of those, the routed experts' when the module's grid splits them over EP ranks (their
  // gradients reduced over expert-data-parallel replicas); 0 otherwise.
  double split_expert_parameters_on(const ModuleInfo& m, const Coord& x) const;
  // The busiest EP rank's expert load over layers [first, end) of module `module` (1 without
  // experts, EP or router skew; expert_load.hpp).
  double busiest_expert_load(int module, int64_t first, int64_t end);
  std::vector<ScheduleItem> order_for(const ModuleInfo& m, int64_t stage, bool has_backward) const;
  int64_t graph_position(int module) const;
  int64_t graph_depth() const;
  bool feeds_interleaved(int module) const;  // some module downstream runs interleaved 1F1B

  // Boundary messages between a producer host module and a consumer host module.
  double boundary_bytes(int producer_last, int consumer, std::span<const Sample* const> samples);
  // One boundary message of a micro-batch between a producer replica and a consumer replica:
  // the producer's index among the replicas that fan in to one consumer (0 without fan-in), and
  // the samples it carries. Producer and consumer list the same links, so sends and receives
  // match; `replica` is the producer's (from_producer) or the consumer's.
  // Each link is also the Program's (Program::links; `index`), which the executor reads.
  struct Link {
    int64_t producer = 0, consumer = 0;
    int32_t sub = 0;
    const std::vector<const Sample*>* samples = nullptr;
    int32_t index = -1;
  };
  // The links of `producer_host`'s output, sent by its last module `producer_last`.
  std::vector<Link> boundary_links(int producer_host, int producer_last, int consumer_host,
                                   int64_t replica, bool from_producer, int32_t mb) {
    const int64_t dp_p = modules_[static_cast<std::size_t>(producer_host)].layout.dp;
    const int64_t dp_c = modules_[static_cast<std::size_t>(consumer_host)].layout.dp;
    std::vector<Link> links;
    if (dp_p >= dp_c) {  // fan-in: k producers per consumer, each with its own samples
      const int64_t k = dp_p / dp_c;
      const int64_t first = from_producer ? replica : replica * k;
      for (int64_t e = first; e < first + (from_producer ? 1 : k); ++e)
        links.push_back({e, e / k, static_cast<int32_t>(e % k), &samples_of(producer_host, e, mb)});
    } else {  // fan-out: one producer splits its samples over k consumers
      const int64_t k = dp_c / dp_p;
      const int64_t first = from_producer ? replica * k : replica;
      for (int64_t d = first; d < first + (from_producer ? k : 1); ++d)
        links.push_back({d / k, d, 0, &samples_of(consumer_host, d, mb)});
    }
    for (Link& link : links) link.index = program_link(producer_last, consumer_host, mb, link);
    return links;
  }
  // The Program's link for `link` of `producer_last`'s output to `consumer_host`, added on first
  // use.
  int32_t program_link(int producer_last, int consumer_host, int32_t mb, const Link& link) {
    const auto key =
        std::make_tuple(producer_last, consumer_host, mb, link.producer, link.consumer);
    const auto [it, added] = link_ids_.try_emplace(key, static_cast<int32_t>(p_.links.size()));
    if (added) {
      tessera::BoundaryLink& l = p_.links.emplace_back();
      l.producer = static_cast<int16_t>(producer_last);
      l.consumer = static_cast<int16_t>(consumer_host);
      l.microbatch = mb;
      l.producer_replica = link.producer;
      l.consumer_replica = link.consumer;
      for (const Sample* s : *link.samples) {
        const auto part = media_parts_.find(s);
        if (part == media_parts_.end()) {
          l.samples.push_back(static_cast<int32_t>(s - batch_.samples.data()));
          continue;
        }
        // A piece of a sample (encoder_data_parallel media): a row entry per item.
        for (int32_t item : part->second.second) {
          l.samples.push_back(part->second.first);
          l.items.push_back(item);
        }
      }
    }
    return it->second;
  }

  // The boundary message of `link` carrying module `module`'s output rows to `consumer_host`
  // (phase F) or their gradient back (phase B), from or to `peer`; `about` gives the stage,
  // chunk and micro-batch it belongs to.
  Op boundary_message(Op about, OpKind kind, Phase phase, int64_t peer, int module,
                      int consumer_host, const Link& link, int32_t mb) {
    about.module = static_cast<int16_t>(module);
    Op op = p2p_op(
        about, kind, phase, peer, boundary_bytes(module, consumer_host, *link.samples),
        MessageTag::link(module, consumer_host, link.consumer, phase == Phase::kB, mb, link.sub)
            .packed());
    op.purpose = Purpose::kBoundary;
    op.link = link.index;
    return op;
  }

  // What a boundary leader received reaches the rest of its TP x CP group by a broadcast (or
  // directly when the leader is alone); appends what this rank's compute must wait for.
  void share_boundary(int64_t rank, const ModuleInfo& owner, const Coord& x, Phase phase,
                      int module, int32_t mb, double bytes, const std::vector<int32_t>& received,
                      std::vector<int32_t>& deps) {
    const int32_t g = tpcp_group(owner, x);
    if (p_.groups[static_cast<std::size_t>(g)].size() == 1) {
      deps.insert(deps.end(), received.begin(), received.end());
      return;
    }
    Op b = collective_op(CollectiveKind::kBroadcast, Purpose::kBoundary, phase, module, g, bytes);
    b.microbatch = mb;
    b.deps = received;
    deps.push_back(emit(rank, b));
  }

  // The model as the plan runs it (heads padded where indivisible_heads pads them), which every
  // op prices, and as it is (its FLOPs are the model's).
  const ModelSpec run_model_;
  const ModelSpec& model_;
  const ModelSpec& real_model_;
  const ClusterSpec& cluster_;
  const ParallelPlan& plan_;
  const WorkloadSpec& workload_;
  const Batch& batch_;
  const DipSchedule dip_;  // schedule dip: this batch's schedule
  const RankFolding folding_;
  std::size_t replicas_folded_ = 1;  // data-parallel replicas each representative stands for
  // A folded Program: per representative, the ranks of its class in rank order; empty otherwise.
  std::vector<std::vector<int64_t>> class_members_;
  Lowered& out_;
  Program& p_;

  std::vector<ModuleInfo> modules_;
  // Per module with experts split over EP under a skewed router: prefix sums of the busiest EP
  // rank's load per layer (filled on first use).
  std::map<int, std::vector<double>> expert_load_prefix_;
  int llm_ = -1;
  int64_t microbatches_ = 1;
  MicrobatchAssignment llm_assignment_;  // [llm replica][mb] -> sample indices
  // The encoders' micro-batches: llm_assignment_'s, or Entrain's level 1
  MicrobatchAssignment encoder_assignment_;
  bool entrain_ = false;
  // [llm replica][llm mb] -> the encoder micro-batches whose last sample it takes ({mb} unless
  // Entrain deferred one)
  std::vector<std::vector<std::vector<int32_t>>> encoder_done_;
  std::map<RankList, int32_t> group_ids_;
  int32_t norm_group_ = -1;  // every rank: the gradient norm's all-reduce
  // Each module's groups (rank_groups(), by module index) and where each rank of its span sits
  // in them.
  std::vector<ModuleGroups> grids_;
  std::vector<GroupIndex> grid_index_;
  std::map<std::tuple<int64_t, int64_t, int32_t, bool>, std::vector<const Sample*>> sample_sets_;
  // encoder_data_parallel media: each encoder's items per replica (by encoder index and replica
  // count), the item sets per (encoder, replica count, replica, micro-batch) as samples of their
  // own (media_subset), and where each of those came from: its sample and items.
  std::map<std::pair<int, int64_t>, MediaAssignment> media_assignment_;
  std::map<std::tuple<int, int64_t, int64_t, int32_t>, std::vector<const Sample*>> media_sets_;
  std::deque<Sample> media_samples_;
  std::map<const Sample*, std::pair<int32_t, std::vector<int32_t>>> media_parts_;
  // (producer's last module, consumer, micro-batch, producer replica, consumer replica) ->
  // Program::links index
  std::map<std::tuple<int, int, int32_t, int64_t, int64_t>, int32_t> link_ids_;
  // (module, stage, chunk) -> the layers it holds (Program::chunk_layers)
  std::map<std::tuple<int, int, int>, LayerRange> chunk_held_;
  std::map<std::tuple<int, const void*, std::size_t>, ModuleWork> work_cache_;
  std::map<std::tuple<const void*, std::size_t, int64_t>, CpShare> cp_cache_;
  std::vector<GradientFlow> flow_;
};

}  // namespace tessera::lowering

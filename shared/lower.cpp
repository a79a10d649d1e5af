#include "shared/lower.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "shared/check.hpp"
#include "shared/context_split.hpp"
#include "shared/cost_model.hpp"
#include "shared/dip_schedule.hpp"
#include "shared/entrain.hpp"
#include "shared/microbatch.hpp"
#include "shared/model_math.hpp"
#include "shared/schedule.hpp"
#include "shared/stage_split.hpp"

namespace tessera {

std::vector<GradientFlow> gradient_flow(const ModelSpec& model) {
  std::vector<GradientFlow> flow(model.modules.size());
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < model.modules.size(); ++i) index[model.modules[i].name] = i;
  // trainable upstream: some module on a path into this one (itself excluded) trains.
  std::function<bool(std::size_t)> trains_upstream_or_self = [&](std::size_t i) {
    const ModuleSpec& m = model.modules[i];
    if (!m.frozen) return true;
    return std::any_of(m.inputs.begin(), m.inputs.end(), [&](const std::string& in) {
      return trains_upstream_or_self(index.at(in));
    });
  };
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const ModuleSpec& m = model.modules[i];
    flow[i].trainable = !m.frozen;
    flow[i].needs_input_grad =
        std::any_of(m.inputs.begin(), m.inputs.end(),
                    [&](const std::string& in) { return trains_upstream_or_self(index.at(in)); });
  }
  return flow;
}

namespace {

// Coordinates of a rank in a module grid (Megatron order tp-cp-dp-pp).
struct Coord {
  int64_t t = 0, c = 0, d = 0, p = 0;
};

using LayerRange = std::pair<int64_t, int64_t>;  // layers [first, end) of a module

// Parameters of a module's layers [a, b), with the input side (embedding, patch or audio front
// end) when a is 0 and the output head when b is the last layer; a projector whole.
double range_parameters(const ModuleSpec& spec, int64_t a, int64_t b) {
  double params = 0;
  if (const auto& t = spec.transformer) {
    const int64_t head = t->vocab > 0 && !t->tied_embeddings ? t->hidden * t->vocab : 0;
    params += static_cast<double>((b - a) * layer_parameters(*t));
    if (a == 0) params += static_cast<double>(embedding_parameters(spec) - head);  // input side
    if (b == t->layers) params += static_cast<double>(head);                       // output head
  }
  if (spec.projector) params += static_cast<double>(projector_parameters(*spec.projector));
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

  int64_t rank(const Coord& x) const {
    return first + x.t + layout.tp * (x.c + layout.cp * (x.d + layout.dp * x.p));
  }
  bool owns(int64_t r) const { return r >= first && r < first + layout.size(); }
  Coord coord(int64_t r) const {
    const int64_t local = r - first;
    return {local % layout.tp, (local / layout.tp) % layout.cp,
            (local / (layout.tp * layout.cp)) % layout.dp,
            local / (layout.tp * layout.cp * layout.dp)};
  }
  int64_t chunks() const { return layout.pp * layout.vpp; }
};

// A send or receive on the p2p stream, about `about`'s module, stage, chunk and micro-batch.
Op p2p_op(const Op& about, OpKind kind, Phase phase, int64_t peer, double bytes, int64_t tag) {
  Op op = about;
  op.kind = kind;
  op.stream = StreamKind::kP2p;
  op.phase = phase;
  op.peer = static_cast<int32_t>(peer);
  op.bytes = bytes;
  op.tag = tag;
  return op;
}

// A collective on the collective stream; callers add what else it needs (micro-batch, deps).
Op collective_op(CollectiveKind kind, Purpose purpose, Phase phase, int module, int32_t group,
                 double bytes) {
  Op op;
  op.kind = OpKind::kCollective;
  op.stream = StreamKind::kCollective;
  op.collective = kind;
  op.purpose = purpose;
  op.phase = phase;
  op.module = static_cast<int16_t>(module);
  op.group = group;
  op.bytes = bytes;
  return op;
}

class Lowering {
 public:
  Lowering(const ModelSpec& model, const ClusterSpec& cluster, const ParallelPlan& plan,
           const WorkloadSpec& workload, const Batch& batch, const DipSchedule* dip, Lowered& out)
      : model_(model),
        cluster_(cluster),
        plan_(plan),
        workload_(workload),
        batch_(batch),
        dip_(dip ? *dip : DipSchedule{}),
        out_(out),
        p_(out.program) {}

  void run();

 private:
  // --- set-up --------------------------------------------------------------------------
  void place();
  void assign_samples();
  // The samples a replica of `module` handles in micro-batch `mb` (-1: all). Under Entrain the
  // encoders and their projectors run the level-1 micro-batches, the LLM the level-2 ones;
  // `encoder_level` asks for the level-1 ones of any module (the LLM's replica, say).
  const std::vector<const Sample*>& samples_of(int module, int64_t replica, int32_t mb,
                                               bool encoder_level = false);
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

  // Under DIP an encoder is a pipeline segment of its own on the LLM's stages.
  bool dip_encoder(const ModuleInfo& m) const {
    return plan_.schedule == Schedule::kDip && m.spec->role == ModuleRole::kEncoder;
  }

  // --- groups --------------------------------------------------------------------------
  int32_t group(RankList members);
  int32_t tp_group(const ModuleInfo& m, Coord x) {
    RankList g;
    for (x.t = 0; x.t < m.layout.tp; ++x.t) g.push_back(m.rank(x));
    return group(g);
  }
  int32_t cp_group(const ModuleInfo& m, Coord x) {
    RankList g;
    for (x.c = 0; x.c < m.layout.cp; ++x.c) g.push_back(m.rank(x));
    return group(g);
  }
  int32_t tpcp_group(const ModuleInfo& m, Coord x) {
    RankList g;
    for (x.c = 0; x.c < m.layout.cp; ++x.c)
      for (x.t = 0; x.t < m.layout.tp; ++x.t) g.push_back(m.rank(x));
    return group(g);
  }
  // Gradients are reduced over data and context replicas (Megatron's dp-cp group).
  int32_t dpcp_group(const ModuleInfo& m, Coord x) {
    RankList g;
    for (x.d = 0; x.d < m.layout.dp; ++x.d)
      for (x.c = 0; x.c < m.layout.cp; ++x.c) g.push_back(m.rank(x));
    std::sort(g.begin(), g.end());
    return group(g);
  }
  int32_t ep_group(const ModuleInfo& m, const Coord& x) {
    const int64_t ep = m.layout.ep, j = x.c + m.layout.cp * x.d;  // index within cp*dp
    const int64_t e_base = j - j % ep;
    RankList g;
    for (int64_t e = 0; e < ep; ++e) {
      const int64_t jj = e_base + e;
      g.push_back(m.rank({x.t, jj % m.layout.cp, jj / m.layout.cp, x.p}));
    }
    return group(g);
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
    return plan_.pipeline_scatter_gather && !plan_.sequence_parallel && grid.layout.tp > 1;
  }
  // Bytes one rank of `grid` sends a neighbouring stage for `tokens` tokens of `width` values:
  // split over context parallelism and, sliced by sequence parallelism or scatter-gather, over TP.
  double stage_message_bytes(const ModuleInfo& grid, int64_t tokens, int64_t width) const {
    const int64_t tp_split = plan_.sequence_parallel || scatters(grid) ? grid.layout.tp : 1;
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
                                            recv.bytes * members};
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
  // A Compute op of `m` on `rank` for the layers of virtual stage `k_chunk` (or only `piece`, a
  // part of them) of micro-batch `mb` (-1: whole local batch).
  Op compute(const ModuleInfo& m, int64_t rank, int32_t k_chunk, int32_t mb, Phase phase,
             std::span<const Sample* const> samples, const LayerRange* piece = nullptr);
  int64_t tag(int kind, int a, int b, int64_t k, int dir, int32_t mb, int32_t sub) const {
    return ((((static_cast<int64_t>(kind) * 256 + a) * 256 + b) * 4096 + k) * 2 + dir) *
               (int64_t{1} << 20) +
           static_cast<int64_t>(mb) * 64 + sub;
  }

  // --- placements ------------------------------------------------------------------------
  void lower_pipelines();  // homogeneous and non_colocated
  // schedule dip: encoder segments and the LLM segment on the ranks of a homogeneous pipeline.
  std::string dip_unsupported() const;  // why this plan cannot run DIP ("" when it can)
  void lower_dip();
  struct DipSegment {
    int encoder = -1;
    std::vector<int> projectors;  // after the encoder, on its last stage, in order
    int32_t backward_from = 0;    // first stage with a backward (P: none)
    // [replica][mb][sub] -> the media of the sub-micro-batch, as samples without text
    std::vector<std::vector<std::vector<const std::vector<const Sample*>*>>> pieces;
  };
  std::vector<DipSegment> dip_segments();
  std::deque<Sample> piece_samples_;  // the sub-micro-batches' samples (stable addresses)
  std::deque<std::vector<const Sample*>> piece_sets_;
  void lower_colocated();
  void gradient_reduction(int64_t rank, const std::vector<int>& modules);  // also accounts memory
  // overlap_grad_reduce: the pieces of virtual stage k's layers, last layers first, each holding
  // about grad_bucket_mb of this rank's gradients (at least one layer each).
  std::vector<LayerRange> gradient_buckets(const ModuleInfo& m, int64_t k) const;
  // overlap_grad_reduce: the bucket reductions each rank emitted, per module; those modules get
  // no reduction after the backward.
  std::map<int64_t, std::map<int, std::vector<int32_t>>> bucket_reductions_;
  // overlap_param_gather: the modules whose parameters each rank gathers at the step's start
  // (none after its optimizer step).
  std::map<int64_t, std::set<int>> gathered_at_start_;
  // The 16-bit gradients (or weights) of layers [a, b) of `m` on one rank of its grid.
  double bucket_bytes(const ModuleInfo& m, int64_t a, int64_t b) const {
    return range_parameters(*m.spec, a, b) * static_cast<double>(dtype_bytes(model_.dtype)) /
           static_cast<double>(grid_of(m).layout.tp);
  }
  void account_memory(int64_t rank, const std::vector<int>& modules);
  const ModuleInfo& grid_of(const ModuleInfo& m) const;
  double parameters_on(const ModuleInfo& m, const Coord& x) const;
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
  struct BoundaryLink {
    int64_t producer = 0, consumer = 0;
    int32_t sub = 0;
    const std::vector<const Sample*>* samples = nullptr;
  };
  std::vector<BoundaryLink> boundary_links(int producer_host, int consumer_host, int64_t replica,
                                           bool from_producer, int32_t mb) {
    const int64_t dp_p = modules_[static_cast<std::size_t>(producer_host)].layout.dp;
    const int64_t dp_c = modules_[static_cast<std::size_t>(consumer_host)].layout.dp;
    std::vector<BoundaryLink> links;
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
    return links;
  }

  // The boundary message of `link` carrying module `module`'s output rows to `consumer_host`
  // (phase F) or their gradient back (phase B), from or to `peer`; `about` gives the stage,
  // chunk and micro-batch it belongs to.
  Op boundary_message(Op about, OpKind kind, Phase phase, int64_t peer, int module,
                      int consumer_host, const BoundaryLink& link, int32_t mb) {
    about.module = static_cast<int16_t>(module);
    Op op = p2p_op(
        about, kind, phase, peer, boundary_bytes(module, consumer_host, *link.samples),
        tag(1, module, consumer_host, link.consumer, phase == Phase::kB ? 1 : 0, mb, link.sub));
    op.purpose = Purpose::kBoundary;
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

  const ModelSpec& model_;
  const ClusterSpec& cluster_;
  const ParallelPlan& plan_;
  const WorkloadSpec& workload_;
  const Batch& batch_;
  const DipSchedule dip_;  // schedule dip: this batch's schedule
  Lowered& out_;
  Program& p_;

  std::vector<ModuleInfo> modules_;
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
  std::map<std::tuple<int64_t, int64_t, int32_t, bool>, std::vector<const Sample*>> sample_sets_;
  std::map<std::tuple<int, const void*, std::size_t>, ModuleWork> work_cache_;
  std::map<std::tuple<const void*, std::size_t, int64_t>, CpShare> cp_cache_;
  std::vector<GradientFlow> flow_;
};

int32_t Lowering::group(RankList members) {
  const auto [it, inserted] = group_ids_.emplace(members, static_cast<int32_t>(p_.groups.size()));
  if (inserted) p_.groups.push_back(std::move(members));
  return it->second;
}

void Lowering::place() {
  Diagnostics diag;
  const std::vector<PlacedModule> placed = place_modules(plan_, model_, "", "", diag);
  TESSERA_CHECK(diag.ok(), "lower() needs a validated plan: " + diag.format());
  flow_ = gradient_flow(model_);
  modules_.resize(model_.modules.size());
  for (const PlacedModule& pm : placed) {
    const int i = static_cast<int>(pm.module - model_.modules.data());
    ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    m.index = i;
    m.spec = pm.module;
    m.layout = pm.layout;
    m.first = pm.first_rank;
    m.flow = flow_[static_cast<std::size_t>(i)];
    if (m.spec->role == ModuleRole::kLlm) llm_ = i;
  }
  for (const PlacedModule& pm : placed)
    if (!pm.host.empty()) {
      const int i = static_cast<int>(pm.module - model_.modules.data());
      modules_[static_cast<std::size_t>(i)].host =
          static_cast<int>(find_module(model_, pm.host) - model_.modules.data());
    }
  TESSERA_CHECK(llm_ >= 0, "lower() needs an llm module");
  for (ModuleInfo& m : modules_) {
    // Layers of each virtual stage: explicit, or as even as possible (earlier stages take the
    // remainder). In a homogeneous plan only the LLM is split; encoders sit whole in stage 0,
    // except under DIP, where each encoder is a segment of one chunk per stage.
    const bool split =
        plan_.placement != Placement::kHomogeneous || m.index == llm_ || dip_encoder(m);
    const int64_t layers = m.spec->transformer ? m.spec->transformer->layers : 0;
    const int64_t chunks = !split ? 1 : dip_encoder(m) ? m.layout.pp : m.chunks();
    const auto dip_layers = dip_.layers.find(m.index);
    const bool dip_given = plan_.schedule == Schedule::kDip && dip_layers != dip_.layers.end();
    const bool plan_given = !m.layout.stage_layers.empty() && split && !dip_encoder(m);
    int64_t begin = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t n = dip_given    ? dip_layers->second[static_cast<std::size_t>(k)]
                        : plan_given ? m.layout.stage_layers[static_cast<std::size_t>(k)]
                                     : layers / chunks + (k < layers % chunks ? 1 : 0);
      m.chunk_layers.emplace_back(begin, begin + n);
      begin += n;
    }
  }
  p_.world = static_cast<int32_t>(world_size(plan_, model_));
  p_.ranks.assign(static_cast<std::size_t>(p_.world), {});
  p_.memory.assign(static_cast<std::size_t>(p_.world), {});
  for (const ModuleSpec& m : model_.modules) p_.modules.push_back(m.name);
  microbatches_ = micro_batches(plan_, model_, workload_);
}

void Lowering::assign_samples() {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  entrain_ = plan_.microbatching == MicrobatchPolicy::kEntrain;
  if (entrain_) {
    EntrainAssignment a =
        entrain_assignment(batch_, model_, llm.layout.dp, microbatches_, workload_.max_seq_len);
    llm_assignment_ = std::move(a.llm);
    encoder_assignment_ = std::move(a.encoder);
  } else {
    llm_assignment_ = assign_microbatches(batch_, model_, llm.layout.dp, microbatches_,
                                          plan_.microbatching, workload_.max_seq_len);
    encoder_assignment_ = llm_assignment_;
  }
  p_.llm_microbatches = llm_assignment_;
  p_.encoder_microbatches = encoder_assignment_;
  // Encoder micro-batch i is done with the LLM micro-batch that takes its last sample (i, or
  // i + 1 when Entrain deferred one).
  for (std::size_t d = 0; d < llm_assignment_.size(); ++d) {
    std::map<int32_t, int32_t> llm_mb_of;
    for (std::size_t j = 0; j < llm_assignment_[d].size(); ++j)
      for (int32_t sample : llm_assignment_[d][j]) llm_mb_of[sample] = static_cast<int32_t>(j);
    auto& done = encoder_done_.emplace_back(llm_assignment_[d].size());
    for (std::size_t i = 0; i < encoder_assignment_[d].size(); ++i) {
      int32_t last = static_cast<int32_t>(i);
      for (int32_t sample : encoder_assignment_[d][i]) last = std::max(last, llm_mb_of.at(sample));
      done[static_cast<std::size_t>(last)].push_back(static_cast<int32_t>(i));
    }
  }
  p_.samples = static_cast<int64_t>(batch_.samples.size());
  std::vector<const Sample*> all;
  for (const Sample& s : batch_.samples) all.push_back(&s);
  p_.llm_tokens = module_work(model_, *llm.spec, all, workload_.max_seq_len).tokens;
}

// The samples a replica of `module` handles in micro-batch `mb` (-1: all its micro-batches):
// replica_samples() of the module's data-parallel degree (its host's, when it borrows ranks).
const std::vector<const Sample*>& Lowering::samples_of(int module, int64_t replica, int32_t mb,
                                                       bool encoder_level) {
  const ModuleInfo& m = modules_[static_cast<std::size_t>(module)];
  const int64_t dp =
      m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)].layout.dp : m.layout.dp;
  // Colocated encoders run the whole batch at once: only the LLM's micro-batches exist there.
  const bool level1 = entrain_ && plan_.placement != Placement::kColocated &&
                      (encoder_level || (m.spec->role != ModuleRole::kLlm &&
                                         m.spec->role != ModuleRole::kGenerator));
  const auto key = std::make_tuple(dp, replica, mb, level1);
  if (const auto it = sample_sets_.find(key); it != sample_sets_.end()) return it->second;
  std::vector<const Sample*>& out = sample_sets_[key];
  for (int32_t id :
       replica_samples(level1 ? encoder_assignment_ : llm_assignment_, dp, replica, mb))
    out.push_back(&batch_.samples[static_cast<std::size_t>(id)]);
  return out;
}

const std::vector<int32_t>& Lowering::encoder_microbatches_done(int64_t replica, int32_t mb) {
  return encoder_done_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(mb)];
}
const ModuleWork& Lowering::work_of(int module, std::span<const Sample* const> samples) {
  // Sample sets come from samples_of(), whose vectors live as long as the lowering, so their
  // address identifies them (empty sets all have zero work).
  const auto key =
      std::make_tuple(module, static_cast<const void*>(samples.data()), samples.size());
  if (const auto it = work_cache_.find(key); it != work_cache_.end()) return it->second;
  return work_cache_[key] = module_work(model_, *modules_[static_cast<std::size_t>(module)].spec,
                                        samples, workload_.max_seq_len, plan_.pad_to_longest);
}

const Lowering::CpShare& Lowering::cp_share(std::span<const Sample* const> samples, int64_t cp,
                                            int64_t replica) {
  const auto key = std::make_tuple(static_cast<const void*>(samples.data()), samples.size(), cp);
  if (const auto it = cp_cache_.find(key); it != cp_cache_.end()) return it->second;
  const std::vector<TokenTag> tags = llm_token_tags(model_, samples, workload_.max_seq_len);
  const auto split =
      context_split(plan_.cp_split, tags, cp,
                    cp_linear_tiles(*modules_[static_cast<std::size_t>(llm_)].spec->transformer));
  auto max_over_mean = [](const std::vector<double>& w) {
    double most = 0, sum = 0;
    for (double x : w) {
      most = std::max(most, x);
      sum += x;
    }
    return sum > 0 ? most * static_cast<double>(w.size()) / sum : 1.0;
  };
  CpShare share;
  share.replica = replica;
  for (const auto& part : split) share.tokens.push_back(static_cast<double>(part.size()));
  share.pairs = cp_attention_work(tags, split);
  share.balance = max_over_mean(share.pairs);
  share.uniform_balance =
      plan_.cp_split == CpSplit::kUniform
          ? share.balance
          : max_over_mean(cp_attention_work(tags, context_split(CpSplit::kUniform, tags, cp)));
  return cp_cache_[key] = std::move(share);
}

Op Lowering::compute(const ModuleInfo& m, int64_t rank, int32_t k_chunk, int32_t mb, Phase phase,
                     std::span<const Sample* const> samples, const LayerRange* piece) {
  const ModuleSpec& spec = *m.spec;
  const ModuleInfo& grid = m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
  // Homogeneous encoders share the LLM's grid.
  const ModuleInfo& layout_owner =
      plan_.placement == Placement::kHomogeneous ? modules_[static_cast<std::size_t>(llm_)] : grid;
  const ModuleLayout& l = layout_owner.layout;
  const Coord x = layout_owner.coord(rank);
  const ModuleWork& work = work_of(m.index, samples);
  // This rank's share of the sequence: the LLM's tokens as context_split() deals them to the CP
  // ranks (each rank its own tokens and attention pairs), an even share otherwise.
  double tokens_local = static_cast<double>(work.tokens) / static_cast<double>(l.cp);
  double pairs_local = work.attention_pairs / static_cast<double>(l.cp);
  if (l.cp > 1 && spec.role == ModuleRole::kLlm) {
    const CpShare& share = cp_share(samples, l.cp, x.d);
    tokens_local = share.tokens[static_cast<std::size_t>(x.c)];
    pairs_local = share.pairs[static_cast<std::size_t>(x.c)];
  }
  const double tp_shard = static_cast<double>(l.tp);
  const double dtype = static_cast<double>(dtype_bytes(model_.dtype));
  const auto [layer_begin, layer_end] =
      piece != nullptr ? *piece : m.chunk_layers[static_cast<std::size_t>(k_chunk)];
  const int64_t layers = layer_end - layer_begin;
  const bool first_chunk = layer_begin == 0;
  const bool last_chunk = !spec.transformer || layer_end == spec.transformer->layers;

  Op op;
  op.kind = OpKind::kCompute;
  op.stream = StreamKind::kCompute;
  op.phase = phase;
  op.module = static_cast<int16_t>(m.index);
  op.stage =
      static_cast<int16_t>(plan_.placement == Placement::kHomogeneous ? x.p : grid.coord(rank).p);
  op.chunk = static_cast<int16_t>(k_chunk / std::max<int64_t>(1, m.layout.pp));
  if (plan_.placement == Placement::kHomogeneous && m.index != llm_) op.chunk = 0;
  op.microbatch = mb;
  op.layers = static_cast<int32_t>(layers);
  op.first_layer = static_cast<int32_t>(layer_begin);
  op.tokens = static_cast<int64_t>(tokens_local);
  op.tp = static_cast<int16_t>(l.tp);
  if (plan_.sequence_parallel && l.tp > 1) op.flags |= kOpSequenceParallel;
  if (!plan_.flash_attention) op.flags |= kOpUnfusedAttention;
  if (!plan_.fused_kernels) op.flags |= kOpEagerElementwise;
  if (plan_.tp_comm_overlap && plan_.sequence_parallel && l.tp > 1) op.flags |= kOpTpCommOverlap;
  if (plan_.recompute == Recompute::kSelective && phase == Phase::kB)
    op.flags |= kOpAttentionRecompute;
  // Every schedule runs a trainable module's W right after its B.
  if (plan_.tp_backward_overlap && phase == Phase::kB && m.flow.trainable && l.tp > 1)
    op.flags |= kOpTpGradOverlap;

  double linear = 0, attention = 0, weights = 0;  // FLOPs of one forward on this rank
  if (spec.transformer) {
    const TransformerArch& a = *spec.transformer;
    linear = static_cast<double>(layers) * 2.0 *
             static_cast<double>(active_layer_matmul_parameters(a)) * tokens_local / tp_shard;
    attention = static_cast<double>(layers) * layer_attention_flops(a, pairs_local) / tp_shard;
    weights = static_cast<double>(layers * layer_parameters(a)) / static_cast<double>(l.tp);
    if (layers > 0) op.attention_pairs = pairs_local;
    // Full recomputation checkpoints the transformer layers only (Megatron-LM's checkpointed
    // layer stack, Hugging Face's gradient checkpointing): the head, its loss and the front end
    // keep their forward activations and are not run again.
    const bool recomputed = phase == Phase::kR;
    if (last_chunk && a.vocab > 0 && !recomputed) {
      op.flags |= kOpHead;
      if (phase != Phase::kW) op.logits = tokens_local * static_cast<double>(a.vocab) / tp_shard;
      linear += 2.0 * static_cast<double>(a.hidden * a.vocab) * tokens_local / tp_shard;
      weights += static_cast<double>(a.hidden * a.vocab) / static_cast<double>(l.tp);
    }
    if (first_chunk && (a.vocab > 0 || spec.patching || spec.audio) && !recomputed)
      op.flags |= kOpFrontEnd;
    if (first_chunk && (spec.patching || spec.audio) && !recomputed) {
      // Patch / conv front end, counted per encoder token.
      ModuleSpec front = spec;
      front.transformer->layers = 0;
      front.transformer->vocab = 0;
      linear += forward_flops_per_token(front, 0) * tokens_local / tp_shard;
      weights += static_cast<double>(embedding_parameters(front)) / static_cast<double>(l.tp);
    }
    // Nested collectives of the layer stack.
    const double act = tokens_local * static_cast<double>(a.hidden) * dtype;
    if (phase != Phase::kW && l.tp > 1) {
      const int32_t g = tp_group(layout_owner, x);
      if (plan_.sequence_parallel) {
        op.nested.push_back(
            {CollectiveKind::kAllGather, Purpose::kTp, g, static_cast<int32_t>(2 * layers), act});
        op.nested.push_back({CollectiveKind::kReduceScatter, Purpose::kTp, g,
                             static_cast<int32_t>(2 * layers), act});
      } else {
        op.nested.push_back(
            {CollectiveKind::kAllReduce, Purpose::kTp, g, static_cast<int32_t>(2 * layers), act});
      }
    }
    if (a.vocab > 0 && l.tp > 1) {
      // Vocabulary-parallel embedding and loss: the embedding's partial rows are all-reduced in
      // the forward (its backward is local); the loss all-reduces three fp32 numbers per token
      // (max logit, sum of exponentials, target logit) and the head's input gradient.
      const int32_t g = tp_group(layout_owner, x);
      if (first_chunk && phase == Phase::kF)
        op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kTp, g, 1,
                             static_cast<double>(work.text_tokens) / static_cast<double>(l.cp) *
                                 static_cast<double>(a.hidden) * dtype});
      if (last_chunk && phase == Phase::kF)
        op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kTp, g, 3, tokens_local * 4.0});
      if (last_chunk && phase == Phase::kB)
        op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kTp, g, 1, act});
    }
    if (phase != Phase::kW && l.cp > 1 && layers > 0) {
      // K/V of the whole sequence gathered per layer (ring exchange has the same volume);
      // backward reduce-scatters their gradients.
      const double kv = static_cast<double>(work.tokens) * 2.0 *
                        static_cast<double>(a.kv_heads * a.head_dim) * dtype /
                        static_cast<double>(l.tp);
      op.nested.push_back(
          {phase == Phase::kB ? CollectiveKind::kReduceScatter : CollectiveKind::kAllGather,
           Purpose::kCp, cp_group(layout_owner, x), static_cast<int32_t>(layers), kv});
    }
    if (phase != Phase::kW && a.experts > 0 && l.ep > 1 && layers > 0) {
      const double routed = tokens_local * static_cast<double>(a.top_k * a.hidden) * dtype /
                            static_cast<double>(l.tp);
      op.nested.push_back({CollectiveKind::kAllToAll, Purpose::kEp, ep_group(layout_owner, x),
                           static_cast<int32_t>(2 * layers), routed});
    }
  }
  if (spec.projector) {
    const ProjectorArch& pr = *spec.projector;
    const double w = static_cast<double>(pr.layers == 1 ? pr.in * pr.out
                                                        : pr.in * pr.hidden + pr.hidden * pr.out);
    linear += 2.0 * w * tokens_local / tp_shard;
    weights += static_cast<double>(projector_parameters(pr)) / static_cast<double>(l.tp);
    // Forward: the row-parallel output; backward: the input gradient, when one flows back.
    if ((phase == Phase::kF || phase == Phase::kR ||
         (phase == Phase::kB && m.flow.needs_input_grad)) &&
        l.tp > 1)
      op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kTp, tp_group(layout_owner, x), 1,
                           tokens_local * static_cast<double>(pr.out) * dtype});
  }
  op.flops = phase_flops(linear, attention, phase);
  op.bytes = weights * dtype;
  if (phase == Phase::kF && m.flow.backward()) {
    // Activations kept for backward (flash attention: no s x s scores).
    double stash = 0;
    if (spec.transformer && layers > 0) {
      ActivationOptions o;
      o.tp = l.tp;
      o.sequence_parallel = plan_.sequence_parallel;
      o.flash_attention = plan_.flash_attention || plan_.recompute == Recompute::kSelective;
      o.bytes_per_value = dtype_bytes(model_.dtype);
      const double seq = work.samples > 0
                             ? static_cast<double>(work.tokens) / static_cast<double>(work.samples)
                             : 0;
      const double per_token =
          plan_.recompute == Recompute::kFull
              ? static_cast<double>(spec.transformer->hidden) * dtype /
                    (plan_.sequence_parallel ? static_cast<double>(l.tp) : 1.0)
              : activation_bytes_per_token_per_layer(*spec.transformer, seq, o);
      stash += per_token * tokens_local * static_cast<double>(layers);
    }
    if (spec.projector)
      stash += tokens_local * static_cast<double>(spec.projector->in + spec.projector->hidden) *
               dtype / static_cast<double>(l.tp);
    op.stash_bytes = stash;
  }
  return op;
}

int64_t Lowering::graph_position(int module) const {
  // Longest path, in pipeline stages, from any source to the first stage of `module`.
  const ModuleSpec& spec = *modules_[static_cast<std::size_t>(module)].spec;
  int64_t best = 0;
  for (const std::string& in : spec.inputs) {
    const int i = static_cast<int>(find_module(model_, in) - model_.modules.data());
    const ModuleInfo& producer = modules_[static_cast<std::size_t>(i)];
    const int64_t own = producer.host >= 0 ? 0 : producer.layout.pp;
    best = std::max(best, graph_position(i) + own);
  }
  return best;
}

bool Lowering::feeds_interleaved(int module) const {
  const std::string& name = modules_[static_cast<std::size_t>(module)].spec->name;
  for (const ModuleInfo& consumer : modules_) {
    const auto& inputs = consumer.spec->inputs;
    const bool fed =
        std::find(inputs.begin(), inputs.end(), name) != inputs.end() ||
        std::any_of(modules_.begin(), modules_.end(), [&](const ModuleInfo& borrowed) {
          return borrowed.host == module &&
                 std::find(inputs.begin(), inputs.end(), borrowed.spec->name) != inputs.end();
        });
    if (!fed || consumer.index == module) continue;
    const ModuleInfo& owner =
        consumer.host >= 0 ? modules_[static_cast<std::size_t>(consumer.host)] : consumer;
    if (owner.index == module) continue;  // a projector on this module's own ranks
    if (owner.layout.vpp > 1 || feeds_interleaved(owner.index)) return true;
  }
  return false;
}

int64_t Lowering::graph_depth() const {
  int64_t depth = 0;
  for (const ModuleInfo& m : modules_)
    if (m.host < 0) depth = std::max(depth, graph_position(m.index) + m.layout.pp);
  return depth;
}

std::vector<ScheduleItem> Lowering::order_for(const ModuleInfo& m, int64_t stage,
                                              bool has_backward) const {
  const int32_t mbs = static_cast<int32_t>(microbatches_);
  if (!has_backward) return forward_only_order(mbs);
  if (m.layout.vpp > 1)
    return interleaved_order(mbs, static_cast<int32_t>(m.layout.pp), static_cast<int32_t>(stage),
                             static_cast<int32_t>(m.layout.vpp));
  if (plan_.schedule == Schedule::kGpipe) return gpipe_order(mbs);
  if (plan_.placement == Placement::kNonColocated) {
    // An interleaved consumer takes several micro-batches per stage before its first backward,
    // more than the graph-aware warm-up lets a producer run ahead (a circular wait): stages
    // upstream of an interleaved module run every forward first.
    if (feeds_interleaved(m.index)) return one_f_one_b_order(mbs, mbs);
    const int64_t position = graph_position(m.index) + stage;
    return one_f_one_b_order(mbs, static_cast<int32_t>(graph_depth() - position - 1));
  }
  return one_f_one_b_order(mbs, static_cast<int32_t>(m.layout.pp - stage - 1));
}

double Lowering::boundary_bytes(int producer_last, int consumer,
                                std::span<const Sample* const> samples) {
  const ModuleSpec& p = *modules_[static_cast<std::size_t>(producer_last)].spec;
  const ModuleSpec& c = *modules_[static_cast<std::size_t>(consumer)].spec;
  const ModuleWork& w = work_of(producer_last, samples);
  const int64_t width =
      c.transformer ? c.transformer->hidden : (p.projector ? p.projector->out : 0);
  return static_cast<double>(w.output_tokens * width * dtype_bytes(model_.dtype));
}

const ModuleInfo& Lowering::grid_of(const ModuleInfo& m) const {
  if (plan_.placement == Placement::kHomogeneous) return modules_[static_cast<std::size_t>(llm_)];
  return m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
}

double Lowering::parameters_on(const ModuleInfo& m, const Coord& x) const {
  const ModuleInfo& owner = grid_of(m);
  double params = 0;
  const bool split =
      plan_.placement != Placement::kHomogeneous || m.index == llm_ || dip_encoder(m);
  const int64_t chunks = !split ? 1 : dip_encoder(m) ? 1 : m.layout.vpp;
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t k = split ? chunk * m.layout.pp + x.p : 0;
    const auto [a, b] = m.chunk_layers[static_cast<std::size_t>(k)];
    params += range_parameters(*m.spec, a, b);
  }
  return params / static_cast<double>(owner.layout.tp);
}

void Lowering::account_memory(int64_t rank, const std::vector<int>& module_list) {
  RankMemory& mem = p_.memory[static_cast<std::size_t>(rank)];
  for (int i : module_list) {
    const ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    const ModuleInfo& owner = grid_of(m);
    const Coord x = owner.coord(rank);
    const double params = parameters_on(m, x);
    const int64_t shards = plan_.distributed_optimizer ? owner.layout.dp * owner.layout.cp : 1;
    const RankMemory add = parameter_memory(params, m.flow.trainable, shards, model_.dtype);
    mem.weight_bytes += add.weight_bytes;
    mem.gradient_bytes += add.gradient_bytes;
    mem.optimizer_bytes += add.optimizer_bytes;
  }
}

std::vector<LayerRange> Lowering::gradient_buckets(const ModuleInfo& m, int64_t k) const {
  const auto [a, b] = m.chunk_layers[static_cast<std::size_t>(k)];
  const double limit = plan_.grad_bucket_mb * 1e6;
  std::vector<LayerRange> pieces;
  int64_t end = b;
  for (int64_t l = b - 1; l >= a; --l)
    if (l == a || bucket_bytes(m, l, end) >= limit) {
      pieces.emplace_back(l, end);
      end = l;
    }
  return pieces;
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
    const double params = parameters_on(m, x);
    const double grad_bytes = params * static_cast<double>(dtype_bytes(model_.dtype));
    const int32_t g = dpcp_group(owner, x);
    const int64_t shards = static_cast<int64_t>(p_.groups[static_cast<std::size_t>(g)].size());
    Op c = collective_op(
        plan_.distributed_optimizer ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce,
        Purpose::kDp, Phase::kF, i, g, grad_bytes);
    c.stage = static_cast<int16_t>(x.p);
    reductions.push_back(c);
    if (bucketed != bucket_reductions_.end())
      if (const auto it = bucketed->second.find(i); it != bucketed->second.end()) {
        // Reduced bucket by bucket during its last backward.
        reduced.insert(reduced.end(), it->second.begin(), it->second.end());
        continue;
      }
    const int32_t dep = last_compute(rank);
    if (dep >= 0) c.deps = {dep};
    // A group of one has nothing to reduce.
    reduced.push_back(shards > 1 ? emit(rank, c) : dep);
  }
  // The global gradient norm (and the loss) is all-reduced over every rank before any step:
  // each rank's steps wait for the slowest rank's gradients.
  if (p_.world > 1 &&
      std::any_of(flow_.begin(), flow_.end(), [](const GradientFlow& f) { return f.trainable; })) {
    RankList world(static_cast<std::size_t>(p_.world));
    std::iota(world.begin(), world.end(), 0);
    Op norm = collective_op(CollectiveKind::kAllReduce, Purpose::kNorm, Phase::kF, -1,
                            group(std::move(world)), 16);  // two fp64 numbers
    for (int32_t r : reduced)
      if (r >= 0) norm.deps.push_back(r);
    if (const int32_t dep = last_compute(rank); dep >= 0) norm.deps.push_back(dep);
    std::sort(norm.deps.begin(), norm.deps.end());
    norm.deps.erase(std::unique(norm.deps.begin(), norm.deps.end()), norm.deps.end());
    reduced = {emit(rank, norm)};
  }
  for (std::size_t k = 0; k < reductions.size(); ++k) {
    const Op& c = reductions[k];
    const int64_t shards =
        static_cast<int64_t>(p_.groups[static_cast<std::size_t>(c.group)].size());
    const double params = c.bytes / static_cast<double>(dtype_bytes(model_.dtype));
    Op step;
    step.kind = OpKind::kOptimizerStep;
    step.stream = StreamKind::kCompute;
    step.module = c.module;
    step.stage = c.stage;
    // Adam reads and writes fp32 master weights and two moments, reads the gradient and writes
    // the 16-bit weight: ~ (12 + 12 + 4 + 2) bytes per parameter it owns.
    step.bytes = params * 30.0 / static_cast<double>(plan_.distributed_optimizer ? shards : 1);
    for (int32_t r : reduced)
      if (r >= 0) step.deps.push_back(r);
    std::sort(step.deps.begin(), step.deps.end());
    step.deps.erase(std::unique(step.deps.begin(), step.deps.end()), step.deps.end());
    const int32_t stepped = emit(rank, step);
    const auto at_start = gathered_at_start_.find(rank);
    const bool gathered = at_start != gathered_at_start_.end() && at_start->second.count(c.module);
    if (plan_.distributed_optimizer && shards > 1 && !gathered) {
      Op gather = c;
      gather.collective = CollectiveKind::kAllGather;
      gather.deps = {stepped};
      emit(rank, gather);
    }
  }
}

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
      std::map<std::pair<int32_t, int64_t>, int32_t> param_gathers;  // (chunk, first layer) -> op
      if (overlap && plan_.overlap_param_gather) {
        for (const ScheduleItem& item : order) {
          if (item.backward || first_forward.count(item.chunk) > 0) continue;
          first_forward[item.chunk] = item.microbatch;
          const std::vector<LayerRange> pieces = gradient_buckets(owner, item.chunk * pp + x.p);
          for (auto piece = pieces.rbegin(); piece != pieces.rend(); ++piece) {
            Op g = collective_op(CollectiveKind::kAllGather, Purpose::kDp, Phase::kF, owner_index,
                                 dpcp_group(owner, x),
                                 bucket_bytes(owner, piece->first, piece->second));
            g.stage = static_cast<int16_t>(x.p);
            g.chunk = static_cast<int16_t>(item.chunk);
            g.first_layer = static_cast<int32_t>(piece->first);
            g.layers = static_cast<int32_t>(piece->second - piece->first);
            g.flags |= kOpGradientBucket;
            param_gathers[{item.chunk, piece->first}] = emit(rank, g);
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
                for (const BoundaryLink& link :
                     boundary_links(producer_host, owner_index, x.d, false, mb)) {
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
            deps.push_back(
                receive(rank, stage_message(about, OpKind::kRecv, Phase::kF, from, owner, x,
                                            act_bytes, tag(0, owner_index, 0, prev_k, 0, mb, 0))));
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
          if (first_virtual)
            for (int i : prefix)
              run(modules_[static_cast<std::size_t>(i)], 0, Phase::kF, samples_of(i, x.d, mb));
          if (!param_gathers.empty() && first_forward.at(item.chunk) == mb) {
            // Piece by piece, bottom up; the activations they stash are the whole forward's,
            // kept (and freed by the backward) as one, from the last piece on.
            const std::vector<LayerRange> pieces = gradient_buckets(owner, k);
            auto& ops = p_.ranks[static_cast<std::size_t>(rank)];
            double stash = 0;
            for (auto piece = pieces.rbegin(); piece != pieces.rend(); ++piece) {
              run(owner, k, Phase::kF, samples, &*piece,
                  param_gathers.at({item.chunk, piece->first}));
              stash += ops[static_cast<std::size_t>(last)].stash_bytes;
              ops[static_cast<std::size_t>(last)].stash_bytes = 0;
            }
            ops[static_cast<std::size_t>(last)].stash_bytes = stash;
          } else {
            run(owner, k, Phase::kF, samples);
          }
          if (last_virtual)
            for (int i : suffix) run(modules_[static_cast<std::size_t>(i)], 0, Phase::kF, samples);
          forward_done[{mb, item.chunk}] = last;
          // --- outputs
          if (!last_virtual) {
            const int64_t next_k = k + 1;
            const int64_t to = owner.rank({x.t, x.c, x.d, next_k % pp});
            Op send = stage_message(about, OpKind::kSend, Phase::kF, to, owner, x, act_bytes,
                                    tag(0, owner_index, 0, k, 0, mb, 0));
            send.deps = {last};
            emit(rank, send);
          } else if (leader) {
            for (int consumer_host : consumers) {
              const ModuleInfo& cons = modules_[static_cast<std::size_t>(consumer_host)];
              for (const BoundaryLink& link :
                   boundary_links(owner_index, consumer_host, x.d, true, mb)) {
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
          deps.push_back(
              receive(rank, stage_message(about, OpKind::kRecv, Phase::kB, from, owner, x,
                                          act_bytes, tag(0, owner_index, 0, k + 1, 1, mb, 0))));
        } else {
          // Gradients from consumers that send them back (the LLM's loss needs none).
          for (int consumer_host : consumers) {
            const ModuleInfo& cons = modules_[static_cast<std::size_t>(consumer_host)];
            if (!cons.flow.backward() || !(suffix_backward || owner_backward)) continue;
            std::vector<int32_t> received;
            if (leader) {
              for (const BoundaryLink& link :
                   boundary_links(owner_index, consumer_host, x.d, true, mb)) {
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
          if (plan_.recompute == Recompute::kFull && m.spec->transformer) {
            Op r = compute(m, rank, static_cast<int32_t>(chunk_index), at_mb, Phase::kR, s);
            r.deps = deps;
            last = emit(rank, r);
            deps = {last};
          }
          // The whole chunk at once, or (its gradients reduced during this backward) piece by
          // piece, each bucket's reduction starting once its weight gradients are done.
          const bool bucketed =
              overlap && m.index == owner_index && last_backward.at(item.chunk) == at_mb;
          const std::vector<LayerRange> pieces =
              bucketed
                  ? gradient_buckets(m, chunk_index)
                  : std::vector<LayerRange>{m.chunk_layers[static_cast<std::size_t>(chunk_index)]};
          for (const LayerRange& piece : pieces) {
            Op b = compute(m, rank, static_cast<int32_t>(chunk_index), at_mb, Phase::kB, s, &piece);
            if (bucketed) b.flags |= kOpGradientBucket;
            b.deps = deps;
            last = emit(rank, b);
            deps = {last};
            if (m.flow.trainable) {
              Op w =
                  compute(m, rank, static_cast<int32_t>(chunk_index), at_mb, Phase::kW, s, &piece);
              if (bucketed) w.flags |= kOpGradientBucket;
              w.deps = deps;
              last = emit(rank, w);
              deps = {last};
            }
            if (!bucketed) continue;
            Op c = collective_op(plan_.distributed_optimizer ? CollectiveKind::kReduceScatter
                                                             : CollectiveKind::kAllReduce,
                                 Purpose::kDp, Phase::kF, m.index, dpcp_group(owner, x),
                                 bucket_bytes(m, piece.first, piece.second));
            c.stage = static_cast<int16_t>(x.p);
            c.chunk = static_cast<int16_t>(item.chunk);
            c.first_layer = static_cast<int32_t>(piece.first);
            c.layers = static_cast<int32_t>(piece.second - piece.first);
            c.flags |= kOpGradientBucket;
            c.deps = {last};
            bucket_reductions_[rank][m.index].push_back(emit(rank, c));
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
                                  tag(0, owner_index, 0, k, 1, mb, 0));
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
              for (const BoundaryLink& link :
                   boundary_links(producer_host, owner_index, x.d, false, i)) {
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
        boundary_groups;      // (projector/encoder output module, group)
    std::vector<int> linked;  // outputs sent leader to leader (LLM pipeline)
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
          for (const BoundaryLink& link : boundary_links(grid_index, llm_, x.d, true, mb)) {
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
              for (const BoundaryLink& link : boundary_links(grid_index, llm_, y.d, false, mb)) {
                const int64_t from = grid.rank({0, 0, link.producer, 0});
                if (from == rank) continue;
                received.push_back(emit(rank, boundary_message(about, OpKind::kRecv, Phase::kF,
                                                               from, i, llm_, link, mb)));
              }
            share_boundary(rank, llm, y, Phase::kF, i, mb, boundary_bytes(i, llm_, samples),
                           received, deps);
          }
        } else {
          deps.push_back(
              receive(rank, stage_message(about, OpKind::kRecv, Phase::kF,
                                          llm.rank({y.t, y.c, y.d, (k - 1) % pp}), llm, y,
                                          act_bytes, tag(0, llm_, 0, k - 1, 0, mb, 0))));
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
                                  tag(0, llm_, 0, k, 0, mb, 0));
          send.deps = {done};
          emit(rank, send);
        }
        continue;
      }
      if (k < llm.chunks() - 1) {
        deps.push_back(receive(rank, stage_message(about, OpKind::kRecv, Phase::kB,
                                                   llm.rank({y.t, y.c, y.d, (k + 1) % pp}), llm, y,
                                                   act_bytes, tag(0, llm_, 0, k + 1, 1, mb, 0))));
      }
      deps.push_back(forward_done.at({mb, item.chunk}));
      int32_t last = -1;
      if (k == llm.chunks() - 1)
        for (auto it = suffix.rbegin(); it != suffix.rend(); ++it) {
          const ModuleInfo& g = modules_[static_cast<std::size_t>(*it)];
          for (Phase phase : {Phase::kR, Phase::kB, Phase::kW}) {
            if (phase == Phase::kR && plan_.recompute != Recompute::kFull) continue;
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
        if (phase == Phase::kR && plan_.recompute != Recompute::kFull) continue;
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
          if (y.t != 0 || y.c != 0) continue;
          for (const BoundaryLink& link : boundary_links(grid_index, llm_, y.d, false, mb)) {
            const int64_t to = grid.rank({0, 0, link.producer, 0});
            if (to == rank) continue;
            Op send = boundary_message(about, OpKind::kSend, Phase::kB, to, i, llm_, link, mb);
            send.deps = {last};
            emit(rank, send);
          }
        }
      if (k > 0 && llm.flow.backward()) {
        Op send =
            stage_message(about, OpKind::kSend, Phase::kB, llm.rank({y.t, y.c, y.d, (k - 1) % pp}),
                          llm, y, act_bytes, tag(0, llm_, 0, k, 1, mb, 0));
        send.deps = {last};
        emit(rank, send);
      }
    }
    // Phase 3: encoder-output gradients regrouped to every rank, one encoder backward for the
    // whole batch, then one gradient reduction for all modules.
    std::vector<int32_t> grads_ready;
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
      const int32_t dep = last_compute(rank);
      if (dep >= 0) gather.deps = {dep};
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
          for (const BoundaryLink& link : boundary_links(grid_index, llm_, x.d, true, mb)) {
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
        if (phase == Phase::kR && plan_.recompute != Recompute::kFull) continue;
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

std::string Lowering::dip_unsupported() const {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  if (llm.layout.pp < 2) return "schedule dip needs the LLM to have pp >= 2";
  if (llm.layout.cp > 1) return "schedule dip with context parallelism (cp > 1) is not lowered yet";
  for (const ModuleInfo& m : modules_) {
    const ModuleSpec& spec = *m.spec;
    if (spec.role == ModuleRole::kGenerator)
      return "schedule dip: generator '" + spec.name + "' after the LLM is not lowered yet";
    if (spec.role == ModuleRole::kEncoder) {
      if (!spec.transformer || spec.transformer->layers < llm.layout.pp)
        return "schedule dip: encoder '" + spec.name + "' needs at least one layer per stage (" +
               std::to_string(llm.layout.pp) + ")";
      if (!spec.inputs.empty())
        return "schedule dip: encoder '" + spec.name + "' with inputs is not lowered yet";
    }
  }
  return "";
}

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
            if (plan_.recompute == Recompute::kFull && m.spec->transformer)
              run(m, k, Phase::kR, samples);
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
                        tag(3, static_cast<int>(gi), 0, 0, phase == Phase::kB ? 1 : 0, mb, sub),
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
                        tag(0, llm_, 0, v - 1, 0, mb, 0), llm_, Purpose::kPp);
              }
              run(llm, v, Phase::kF, samples);
              forward_done[{-1, step.chunk, mb, 0}] = last;
              if (v < last_v)
                message(OpKind::kSend, Phase::kF, rank_at((v + 1) % P), act,
                        tag(0, llm_, 0, v, 0, mb, 0), llm_, Purpose::kPp);
              continue;
            }
            if (v < last_v)
              message(OpKind::kRecv, Phase::kB, rank_at((v + 1) % P), act,
                      tag(0, llm_, 0, v + 1, 1, mb, 0), llm_, Purpose::kPp);
            deps.push_back(forward_done.at({-1, step.chunk, mb, 0}));
            run_back(llm, v, samples);
            if (v > 0) {
              message(OpKind::kSend, Phase::kB, rank_at((v - 1) % P), act,
                      tag(0, llm_, 0, v, 1, mb, 0), llm_, Purpose::kPp);
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
                      tag(2, gi, 0, stage - 1, 0, mb, step.sub), g.encoder, Purpose::kPp);
            run(enc, static_cast<int32_t>(stage), Phase::kF, samples);
            if (stage == P - 1)
              for (int i : g.projectors) run(module_at(i), 0, Phase::kF, samples);
            forward_done[{step.segment, 0, mb, step.sub}] = last;
            if (stage < P - 1)
              message(OpKind::kSend, Phase::kF, rank_at(stage + 1), act,
                      tag(2, gi, 0, stage, 0, mb, step.sub), g.encoder, Purpose::kPp);
            else
              message(OpKind::kSend, Phase::kF, rank_at(0),
                      boundary_bytes(segment_last(g), llm_, samples),
                      tag(3, gi, 0, 0, 0, mb, step.sub), segment_last(g), Purpose::kBoundary);
            continue;
          }
          if (stage == P - 1)
            message(OpKind::kRecv, Phase::kB, rank_at(0),
                    boundary_bytes(segment_last(g), llm_, samples),
                    tag(3, gi, 0, 0, 1, mb, step.sub), segment_last(g), Purpose::kBoundary);
          else
            message(OpKind::kRecv, Phase::kB, rank_at(stage + 1), act,
                    tag(2, gi, 0, stage + 1, 1, mb, step.sub), g.encoder, Purpose::kPp);
          deps.push_back(forward_done.at({step.segment, 0, mb, step.sub}));
          if (stage == P - 1)
            for (auto it = g.projectors.rbegin(); it != g.projectors.rend(); ++it)
              run_back(module_at(*it), 0, samples);
          run_back(enc, static_cast<int32_t>(stage), samples);
          if (stage - 1 >= g.backward_from)
            message(OpKind::kSend, Phase::kB, rank_at(stage - 1), act,
                    tag(2, gi, 0, stage, 1, mb, step.sub), g.encoder, Purpose::kPp);
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

void Lowering::run() {
  if (plan_.schedule == Schedule::kDip) {
    // A schedule's layers (from a search, or read back from a run) must fit this plan.
    if (const std::string why =
            dip_schedule_problem(dip_, model_, plan_.layout.pp, plan_.layout.vpp);
        !why.empty()) {
      out_.error = "DIP schedule: " + why;
      return;
    }
  }
  place();
  if (plan_.schedule == Schedule::kDip) {
    if (const std::string why = dip_unsupported(); !why.empty()) {
      out_.error = why;
      return;
    }
  }
  // Under DIP, Entrain's micro-batches are the LLM's (both levels); DIP cuts their media into
  // sub-micro-batches itself, so level 1's encoder micro-batches play no part.
  if (plan_.microbatching == MicrobatchPolicy::kEntrain && plan_.schedule != Schedule::kDip) {
    // The LLM's micro-batch takes rows from its encoder micro-batch and the one before: a
    // producer replica must hold whole LLM micro-batches (fan-in or equal), and the pipeline
    // walks its micro-batches in order (no interleaving).
    const int64_t dp = modules_[static_cast<std::size_t>(llm_)].layout.dp;
    for (const ModuleInfo& m : modules_)
      if (m.host < 0 && m.index != llm_ && plan_.placement == Placement::kNonColocated &&
          m.layout.dp < dp) {
        out_.error = "microbatching entrain: " + m.spec->name + " has fewer replicas (" +
                     std::to_string(m.layout.dp) + ") than the LLM (" + std::to_string(dp) +
                     "); Entrain needs each encoder replica to feed whole LLM micro-batches";
        return;
      }
    for (const ModuleInfo& m : modules_)
      if (m.layout.vpp > 1) {
        out_.error = "microbatching entrain with interleaved 1F1B (vpp > 1) is not lowered yet";
        return;
      }
  }
  const int64_t dp_llm = modules_[static_cast<std::size_t>(llm_)].layout.dp;
  for (const ModuleInfo& m : modules_) {
    const int64_t dp =
        m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)].layout.dp : m.layout.dp;
    if (dp % dp_llm != 0 && dp_llm % dp != 0) {
      out_.error = "module " + m.spec->name + ": dp " + std::to_string(dp) + " and the LLM's dp " +
                   std::to_string(dp_llm) + " must divide one another";
      return;
    }
  }
  if (plan_.placement == Placement::kColocated)
    for (const ModuleInfo& m : modules_)
      if (m.spec->role == ModuleRole::kGenerator && m.host < 0) {
        out_.error = "colocated: give generator '" + m.spec->name +
                     "' no layout of its own; it then runs in the LLM's last pipeline stage";
        return;
      }
  assign_samples();
  if (plan_.schedule == Schedule::kDip)
    lower_dip();
  else if (plan_.placement == Placement::kColocated)
    lower_colocated();
  else
    lower_pipelines();
  TESSERA_CHECK(gather_next_.empty(), "a received activation slice has no compute op to gather it");
  if (!cp_cache_.empty()) {
    // How evenly the CP groups' attention work is spread, against the uniform split: the mean
    // over all micro-batches, and the CP group (data-parallel replica) whose micro-batches are
    // worst on average.
    double chosen = 0, uniform = 0;
    std::map<int64_t, std::array<double, 3>> groups;  // replica -> chosen, uniform, count
    for (const auto& [key, share] : cp_cache_) {
      chosen += share.balance;
      uniform += share.uniform_balance;
      auto& g = groups[share.replica];
      g[0] += share.balance;
      g[1] += share.uniform_balance;
      g[2] += 1;
    }
    std::array<double, 3> worst{0, 0, 1};
    for (const auto& [replica, g] : groups)
      if (g[0] / g[2] > worst[0] / worst[2]) worst = g;
    const auto n = static_cast<double>(cp_cache_.size());
    char line[300];
    std::snprintf(line, sizeof line,
                  "cp_split %s: attention work max/mean over the CP ranks %.3f (uniform split: "
                  "%.3f), mean of %zu micro-batches; worst of %zu CP groups %.3f (uniform: %.3f)",
                  enum_name(plan_.cp_split, kCpSplits).c_str(), chosen / n, uniform / n,
                  cp_cache_.size(), groups.size(), worst[0] / worst[2], worst[1] / worst[2]);
    out_.notes.push_back(line);
  }
  // Model FLOPs of the iteration (recompute excluded), summed over ranks.
  for (const auto& ops : p_.ranks)
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute && op.phase != Phase::kR) p_.model_flops += op.flops;
}

}  // namespace

Lowered lower(const ModelSpec& model, const ClusterSpec& cluster, const ParallelPlan& plan,
              const WorkloadSpec& workload, const Batch& batch, const DipSchedule* dip) {
  Lowered out;
  out.program.iteration = batch.iteration;
  // Frozen-aware stage boundaries (stage_split.hpp), the same for every iteration.
  const ParallelPlan resolved = resolve_stage_split(plan, model, workload, cluster);
  Lowering(model, cluster, resolved, workload, batch, dip, out).run();
#ifndef NDEBUG
  // Debug builds verify every Program they produce; tests call check_program() directly.
  if (out.error.empty()) {
    const auto problems = check_program(out.program);
    TESSERA_CHECK(problems.empty(), problems.empty() ? std::string() : problems.front());
  }
#endif
  return out;
}

}  // namespace tessera

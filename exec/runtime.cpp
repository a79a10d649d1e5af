#include "exec/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "shared/check.hpp"
#include "shared/context_split.hpp"
#include "shared/entrain.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/microbatch.hpp"
#include "shared/model_math.hpp"

namespace tessera::exec {

namespace {

int module_index(const ModelSpec& model, const std::string& name) {
  const ModuleSpec* m = find_module(model, name);
  TESSERA_CHECK(m != nullptr, "no module named " + name);
  return static_cast<int>(m - model.modules.data());
}

// The group of `kind` that holds `rank`, or {} when the rank is not in the module.
const Group* group_with(const std::vector<Group>& groups, int64_t rank) {
  for (const Group& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return &g;
  return nullptr;
}

int64_t index_in(const Group* g, int64_t rank) {
  return g == nullptr ? 0 : std::find(g->begin(), g->end(), rank) - g->begin();
}

// Gloo tags are ints; Program tags are 64-bit. Both ends fold them the same way.
int gloo_tag(int64_t tag) {
  return static_cast<int>((static_cast<uint64_t>(tag) ^ (static_cast<uint64_t>(tag) >> 31)) &
                          0x7fffffffULL);
}

}  // namespace

Worker::Worker(const Scenario& s, const ParallelPlan& plan, Groups& groups,
               const TrainOptions& options)
    : scenario_(s), plan_(plan), groups_(groups), options_(options), rank_(groups.world_rank()) {
  const ModelSpec& model = s.model;
  module_groups_ = rank_groups(plan, model);
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
  for (const ModuleGroups& mg : module_groups_)
    for (const auto* kind : {&mg.tp, &mg.cp, &mg.dp})
      for (const Group& g : *kind) needed.insert({g.size(), g});
  std::vector<std::vector<int64_t>> ordered;
  for (const auto& [size, g] : needed) ordered.push_back(g);
  groups_.create(ordered);

  const std::size_t modules = model.modules.size();
  tp_.assign(modules, nullptr);
  cp_.assign(modules, nullptr);
  dpcp_.assign(modules, 1);
  dp_size_.assign(modules, 1);
  dp_rank_.assign(modules, 0);
  for (const ModuleGroups& mg : module_groups_) {
    const auto m = static_cast<std::size_t>(module_index(model, mg.module));
    const Group* tp = group_with(mg.tp, rank_);
    const Group* cp = group_with(mg.cp, rank_);
    const Group* dp = group_with(mg.dp, rank_);
    if (!mg.dp.empty()) dp_size_[m] = static_cast<int64_t>(mg.dp.front().size());  // every module's
    if (tp == nullptr) continue;
    tp_[m] = &groups_.get(*tp);
    cp_[m] = &groups_.get(*cp);
    dpcp_[m] = static_cast<int64_t>(dp->size() * cp->size());
    dp_rank_[m] = index_in(dp, rank_);
    if (model.modules[m].role == ModuleRole::kLlm) {
      tp_index_ = index_in(tp, rank_);
      cp_index_ = index_in(cp, rank_);
      dp_index_ = index_in(dp, rank_);
    }
  }
  llm_ = module_index(model, find_llm(model)->name);
  // Pipeline stages of each module, from the compute ops of all ranks.
  std::map<int, int64_t> stages;
  for (const auto& ops : p.ranks)
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute)
        stages[op.module] = std::max<int64_t>(stages[op.module], op.stage + 1);
  // Each (module, chunk) here holds the layers its ops say (together: a gradient bucket's piece
  // holds only some of them).
  std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> layers;
  for (const Op& op : p.ranks[static_cast<std::size_t>(rank_)]) {
    if (op.kind != OpKind::kCompute) continue;
    const auto it =
        layers.try_emplace({op.module, op.chunk}, op.first_layer, op.first_layer + op.layers).first;
    it->second.first = std::min<int64_t>(it->second.first, op.first_layer);
    it->second.second = std::max<int64_t>(it->second.second, op.first_layer + op.layers);
  }
  for (const auto& [key, range] : layers) {
    const ModuleSpec& spec = model.modules[static_cast<std::size_t>(key.first)];
    TESSERA_CHECK(
        tp_[static_cast<std::size_t>(key.first)] != nullptr,
        "rank " + std::to_string(rank_) + " runs " + spec.name + " but has no group for it");
    // A module without layers (a projector) is whole wherever its host's stage puts it.
    const int64_t begin = spec.transformer ? range.first : 0;
    const int64_t end = spec.transformer ? range.second : 0;
    stages_[key] = std::make_unique<Stage>(spec, begin, end, options.seed,
                                           *tp_[static_cast<std::size_t>(key.first)]);
  }
  dip_ = plan.schedule == Schedule::kDip;
  if (dip_) {
    dip_cost_ =
        std::make_unique<CostModel>(s.cluster, model.dtype, default_cost_params(s.cluster), model);
    dip_planner_ = std::make_unique<DipPlanner>(s, plan, *dip_cost_);
  }
  linked_boundary_ = plan.placement == Placement::kNonColocated ||
                     (plan.placement == Placement::kColocated && stages[llm_] > 1);
  for (std::size_t m = 0; m < modules; ++m) {
    std::vector<torch::Tensor> params = trainable(static_cast<int>(m));
    if (params.empty()) continue;
    torch::optim::AdamWOptions o(options.lr);
    o.betas({options.beta1, options.beta2}).eps(options.eps).weight_decay(options.weight_decay);
    if (plan.distributed_optimizer) {
      // The slices this rank owns among the module's data(-context)-parallel group, the group
      // of the Program's gradient reduce-scatters.
      int64_t parts = 1, index = 0;
      for (const Op& op : p.ranks[static_cast<std::size_t>(rank_)])
        if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp &&
            op.module == static_cast<int>(m)) {
          const RankList& g = p.groups[static_cast<std::size_t>(op.group)];
          parts = static_cast<int64_t>(g.size());
          index = std::find(g.begin(), g.end(), rank_) - g.begin();
        }
      shards_[static_cast<int>(m)] = std::make_unique<ShardedOptimizer>(
          optimizer_buckets(p, static_cast<int>(m)), parts, index, o);
      continue;
    }
    optimizers_[static_cast<int>(m)] = std::make_unique<torch::optim::AdamW>(params, o);
  }
}

Stage& Worker::stage(int module, int chunk) {
  const auto it = stages_.find({module, chunk});
  TESSERA_CHECK(it != stages_.end(), "no stage of module " + std::to_string(module) + " chunk " +
                                         std::to_string(chunk) + " on rank " +
                                         std::to_string(rank_));
  return *it->second;
}

std::vector<torch::Tensor> Worker::trainable(int module) {
  std::vector<torch::Tensor> out;
  for (auto& [key, st] : stages_)
    if (key.first == module)
      for (const Param& p : st->params())
        if (p.tensor.requires_grad()) out.push_back(p.tensor);
  return out;
}

std::vector<ShardedOptimizer::Bucket> Worker::optimizer_buckets(const Program& p, int module) {
  const auto m = static_cast<std::size_t>(module);
  std::vector<Param*> all;  // the module's trainable parameters on this rank, in order
  for (auto& [key, st] : stages_)
    if (key.first == module)
      for (Param& prm : st->params())
        if (prm.tensor.requires_grad()) all.push_back(&prm);
  std::vector<ShardedOptimizer::Bucket> buckets;
  // Each parameter belongs to the last bucket reduced that holds it: a tied embedding's
  // gradient is complete only once the bottom piece has run.
  std::map<const Param*, std::size_t> home;
  for (const Op& op : p.ranks[static_cast<std::size_t>(rank_)])
    if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp && op.module == module &&
        op.collective == CollectiveKind::kReduceScatter && (op.flags & kOpGradientBucket) != 0) {
      for (const Param* prm :
           stage(module, op.chunk).params_of(op.first_layer, op.first_layer + op.layers))
        if (prm->tensor.requires_grad()) home[prm] = buckets.size();
      buckets.push_back({op.chunk, op.first_layer, {}, {}});
    }
  if (buckets.empty()) buckets.push_back({});  // the whole module
  for (const Param* prm : all) {
    std::size_t b = 0;
    if (!home.empty()) {
      const auto it = home.find(prm);
      TESSERA_CHECK(it != home.end(), prm->name + " is in no gradient bucket of the Program");
      b = it->second;
    }
    buckets[b].params.push_back(prm->tensor);
    // Elements of TP-replicated parameters exist on every TP rank: they count 1/tp each.
    buckets[b].norm_shares.push_back(prm->tp_sharded ? 1.0 : 1.0 / tp_[m]->size());
  }
  return buckets;
}

std::vector<int32_t> Worker::samples_for(int module, int mb) const {
  const auto m = static_cast<std::size_t>(module);
  const ModuleRole role = scenario_.model.modules[m].role;
  const bool encoder_side = role != ModuleRole::kLlm && role != ModuleRole::kGenerator;
  return replica_samples(entrain_ && encoder_side ? encoder_assignment_ : assignment_, dp_size_[m],
                         dp_rank_[m], mb);
}

torch::Tensor Worker::entrain_rows(int producer, int mb, std::vector<torch::Tensor>& leaves) {
  // Where each sample's rows lie: in the output of the encoder micro-batch (mb or mb - 1) that
  // holds it — the producer's on this rank, or what its boundary messages assembled here — those
  // outputs stacked in that order.
  std::map<int32_t, std::pair<int64_t, int64_t>> where;  // sample -> (first row, rows)
  std::vector<torch::Tensor> outputs;
  int64_t row = 0;
  const std::vector<int32_t>& wanted = micro_batch(mb).samples;
  auto wanted_in = [&](const RowMap& rows) {
    return std::any_of(wanted.begin(), wanted.end(), [&](int32_t x) { return rows.count(x) > 0; });
  };
  for (int i = std::max(0, mb - 1); i <= mb; ++i) {
    RowMap rows;  // from the first row of this micro-batch's output
    torch::Tensor source;
    if (linked_boundary_) {
      if (i < mb && !linked_.count({producer, i})) continue;
      const Boundary& b = assembled(producer, i);
      rows = b.rows;
      source = b.leaf;
    } else {
      lay_out_rows(producer, samples_for(producer, i), 0, rows);
      if (!wanted_in(rows)) continue;  // (its slot may be gone already)
      auto [it, fresh] = entrain_leaves_.try_emplace({producer, i});
      if (fresh) {
        const torch::Tensor& out = producer_slot(producer, i).output;
        it->second = out.detach();
        it->second.set_requires_grad(out.requires_grad());
      }
      source = it->second;
    }
    if (!wanted_in(rows)) continue;
    for (const auto& [sample, range] : rows) where[sample] = {row + range.first, range.second};
    row += source.size(0);
    outputs.push_back(source);
    leaves.push_back(source);
  }
  std::vector<int64_t> index;
  for (int32_t sample : wanted)
    if (const auto it = where.find(sample); it != where.end())
      for (int64_t r = 0; r < it->second.second; ++r) index.push_back(it->second.first + r);
  TESSERA_CHECK(!outputs.empty(),
                "entrain: no encoder micro-batch feeds LLM micro-batch " + std::to_string(mb));
  return torch::cat(outputs, 0).index_select(0, torch::tensor(index, torch::kInt64).view({-1}));
}

Worker::Boundary& Worker::boundary(int producer) {
  if (const auto it = boundaries_.find(producer); it != boundaries_.end()) return it->second;
  // No regroup op: the producer's replicas are the LLM's; this rank's own whole-batch output.
  const torch::Tensor& out = producer_slot(producer, -1).output;
  Boundary& b = boundaries_[producer];
  b.leaf = out.detach();
  b.leaf.set_requires_grad(out.requires_grad());
  b.mine_rows = lay_out_rows(producer, samples_for(producer, -1), 0, b.rows);
  return b;
}

void Worker::boundary_collective(const Op& op) {
  if (op.collective == CollectiveKind::kBroadcast || op.collective == CollectiveKind::kAllReduce) {
    const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
    if (op.collective == CollectiveKind::kAllReduce) {
      // Consumer with CP: each CP rank holds the gradient of its own tokens; sum them.
      Boundary& b = assembled(op.module, op.microbatch);
      if (!b.leaf.grad().defined()) b.leaf.mutable_grad() = torch::zeros_like(b.leaf);
      all_reduce(comm, b.leaf.mutable_grad());
      return;
    }
    if (op.phase == Phase::kF) {
      // The consumer leader's received rows reach its TP x CP group.
      Boundary& b = assembled(op.module, op.microbatch);
      torch::Tensor t = b.leaf.detach();
      broadcast(comm, t, 0);
      b.leaf = t;
      b.leaf.set_requires_grad(true);
      return;
    }
    // Backward, producer side: the leader's received gradient reaches its TP x CP group (with
    // a whole-batch output, the accumulated gradient after each micro-batch's part).
    absorb_self_links(op.module);
    Slot& slot = producer_slot(op.module, op.microbatch);
    if (!slot.output_grad.defined()) slot.output_grad = torch::zeros_like(slot.output);
    broadcast(comm, slot.output_grad, 0);
    return;
  }
  TESSERA_CHECK(op.collective == CollectiveKind::kAllGather,
                op_name(*program_, op) + ": unexpected boundary collective");
  const auto m = static_cast<std::size_t>(op.module);
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  if (op.phase == Phase::kF) {
    // Fan-in: the k encoder replicas that share an LLM replica's batch, in replica order.
    const int64_t k = comm.size(), base = dp_rank_[m] - dp_rank_[m] % k;
    Boundary b;
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t first = row;
      row = lay_out_rows(op.module, replica_samples(assignment_, dp_size_[m], base + j, -1), row,
                         b.rows);
      b.member_rows.push_back(row - first);
      if (j == comm.rank) {
        b.mine_first = first;
        b.mine_rows = row - first;
      }
    }
    const torch::Tensor& out = producer_slot(op.module, -1).output;
    b.leaf = all_gather_rows(comm, out.detach().contiguous(), b.member_rows);
    b.leaf.set_requires_grad(out.requires_grad());
    // The LLM replica on this rank must find all of its samples here.
    for (const auto& mb : my_micro_batches_)
      for (int32_t sample : mb)
        TESSERA_CHECK(b.rows.count(sample),
                      op_name(*program_, op) +
                          ": the regrouped rows miss a sample of this rank's "
                          "LLM replica (encoder and LLM grids not aligned, e.g. an LLM pipeline): "
                          "not in the executor yet");
    boundaries_[op.module] = std::move(b);
    return;
  }
  // Backward.
  Boundary& b = boundaries_.at(op.module);
  if (dp_size_[m] < dp_size_[static_cast<std::size_t>(llm_)]) {
    // Fan-out: each member's LLM replica computed the gradient of its own samples' rows; the
    // all-gather assembles all of this encoder replica's rows (replicas in order, as its output).
    const int64_t k = comm.size();
    std::vector<int64_t> member_rows;
    int64_t first = 0;
    for (int64_t j = 0; j < k; ++j) {
      RowMap scratch;
      const int64_t rows =
          lay_out_rows(op.module,
                       replica_samples(assignment_, dp_size_[static_cast<std::size_t>(llm_)],
                                       dp_rank_[m] * k + j, -1),
                       0, scratch);
      if (j < comm.rank) first += rows;
      member_rows.push_back(rows);
    }
    const torch::Tensor g = b.leaf.grad().defined() ? b.leaf.grad() : torch::zeros_like(b.leaf);
    const torch::Tensor all = all_gather_rows(
        comm, g.narrow(0, first, member_rows[static_cast<std::size_t>(comm.rank)]).contiguous(),
        member_rows);
    producer_slot(op.module, -1).output_grad = all;
    return;
  }
  // Fan-in: this rank's rows of the gradient, exchanged over the group as the Program says.
  const torch::Tensor g = b.leaf.grad().defined() ? b.leaf.grad() : torch::zeros_like(b.leaf);
  const torch::Tensor all =
      all_gather_rows(comm, g.narrow(0, b.mine_first, b.mine_rows).contiguous(), b.member_rows);
  producer_slot(op.module, -1).output_grad = all.narrow(0, b.mine_first, b.mine_rows).contiguous();
}

int Worker::consumer_of(int producer) const {
  const ModelSpec& model = scenario_.model;
  const std::string& name = model.modules[static_cast<std::size_t>(producer)].name;
  for (std::size_t c = 0; c < model.modules.size(); ++c) {
    const auto& in = model.modules[c].inputs;
    if (std::find(in.begin(), in.end(), name) != in.end()) return static_cast<int>(c);
  }
  return -1;
}

int64_t Worker::replica_of(int module, int64_t rank) const {
  const std::string& name = scenario_.model.modules[static_cast<std::size_t>(module)].name;
  for (const ModuleGroups& mg : module_groups_)
    if (mg.module == name)
      if (const Group* g = group_with(mg.dp, rank); g != nullptr) return index_in(g, rank);
  TESSERA_CHECK(false, "rank " + std::to_string(rank) + " holds no replica of " + name);
  return 0;
}

// Mirrors Lowering::boundary_links: with fan-in (producer dp >= consumer dp) a link per producer
// replica carries that replica's samples; with fan-out a link per consumer replica carries the
// consumer's.
std::vector<int32_t> Worker::link_samples(int producer, int mb, int64_t peer,
                                          bool consumer_side) const {
  const int consumer = consumer_of(producer);
  const int64_t dp_p = dp_size_[static_cast<std::size_t>(producer)];
  const int64_t dp_c = dp_size_[static_cast<std::size_t>(consumer)];
  // A producer replica's micro-batches: under Entrain level 1's.
  const MicrobatchAssignment& produced = entrain_ ? encoder_assignment_ : assignment_;
  if (dp_p >= dp_c)
    return consumer_side ? replica_samples(produced, dp_p, replica_of(producer, peer), mb)
                         : samples_for(producer, mb);
  return consumer_side ? samples_for(consumer, mb)
                       : replica_samples(assignment_, dp_c, replica_of(consumer, peer), mb);
}

std::vector<std::pair<int64_t, std::vector<int32_t>>> Worker::consumer_links(int producer,
                                                                             int mb) const {
  const int consumer = consumer_of(producer);
  const int64_t dp_p = dp_size_[static_cast<std::size_t>(producer)];
  const int64_t dp_c = dp_size_[static_cast<std::size_t>(consumer)];
  std::vector<std::pair<int64_t, std::vector<int32_t>>> links;
  if (dp_p >= dp_c) {
    const int64_t k = dp_p / dp_c, first = dp_rank_[static_cast<std::size_t>(consumer)] * k;
    for (int64_t e = first; e < first + k; ++e)
      links.emplace_back(
          e, replica_samples(entrain_ ? encoder_assignment_ : assignment_, dp_p, e, mb));
  } else {
    links.emplace_back(0, samples_for(consumer, mb));
  }
  return links;
}

// Row indices, in `order`'s layout (each sample's rows contiguous, samples in order), of
// `samples`.
int64_t Worker::lay_out_rows(int producer, const std::vector<int32_t>& samples, int64_t row,
                             RowMap& where) const {
  const ModelSpec& model = scenario_.model;
  const Modality modality =
      find_module(model, model.modules[static_cast<std::size_t>(producer)].inputs.front())
          ->modality;
  for (int32_t s : samples) {
    const int64_t n =
        llm_media_tokens(model, modality, batch_.batch.samples[static_cast<std::size_t>(s)]);
    where[s] = {row, n};
    row += n;
  }
  return row;
}

std::vector<int64_t> Worker::rows_of(int producer, const std::vector<int32_t>& samples,
                                     const std::vector<int32_t>& order) const {
  RowMap where;
  lay_out_rows(producer, order, 0, where);
  std::vector<int64_t> rows;
  for (int32_t s : samples) {
    const auto [first, n] = where.at(s);
    for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
  }
  return rows;
}

int64_t Worker::producer_leader(int producer, int64_t replica) const {
  const std::string& name = scenario_.model.modules[static_cast<std::size_t>(producer)].name;
  for (const ModuleGroups& mg : module_groups_)
    if (mg.module == name)
      if (const Group* g = group_with(mg.dp, mg.first_rank); g != nullptr)
        return (*g)[static_cast<std::size_t>(replica)];
  return -1;
}

// A producer's output slot: per micro-batch (non-colocated), or the whole batch (colocated).
Worker::Slot& Worker::producer_slot(int producer, int mb) {
  for (auto& [k, other] : stages_)
    if (k.first == producer && other->last()) {
      if (const auto it = slots_.find({producer, k.second, mb, 0}); it != slots_.end())
        return it->second;
      return slots_.at({producer, k.second, -1, 0});
    }
  TESSERA_CHECK(false, "no output of module " + std::to_string(producer) + " on this rank");
  return slots_.begin()->second;
}

// Links whose producer leader and consumer leader are this very rank carry no message: the
// consumer's input gradient rows go straight into the producer's output gradient.
void Worker::absorb_self_links(int producer) {
  if (!absorbed_.insert(producer).second) return;
  const int consumer = consumer_of(producer);
  const bool consumer_leader = tp_index_ == 0 && cp_index_ == 0 &&
                               std::any_of(stages_.begin(), stages_.end(), [&](const auto& e) {
                                 return e.first.first == consumer && e.second->first();
                               });
  if (!consumer_leader) return;
  const int64_t dp_p = dp_size_[static_cast<std::size_t>(producer)];
  const int64_t dp_c = dp_size_[static_cast<std::size_t>(consumer)];
  for (auto& [key, b] : linked_) {
    if (key.first != producer || !b.leaf.grad().defined()) continue;
    const int mb = key.second;
    for (const auto& [link, samples] : consumer_links(producer, mb)) {
      const int64_t replica =
          dp_p >= dp_c ? link : dp_rank_[static_cast<std::size_t>(consumer)] / (dp_c / dp_p);
      if (producer_leader(producer, replica) != rank_) continue;
      Slot& slot = producer_slot(producer, mb);
      const bool whole = slots_.count({producer, 0, mb, 0}) == 0;
      const std::vector<int32_t> order =
          whole ? samples_for(producer, -1) : samples_for(producer, mb);
      std::vector<int64_t> from;
      for (int32_t s : samples) {
        const auto [first, n] = b.rows.at(s);
        for (int64_t r = 0; r < n; ++r) from.push_back(first + r);
      }
      const auto to = torch::tensor(rows_of(producer, samples, order), torch::kInt64).view({-1});
      if (!slot.output_grad.defined()) slot.output_grad = torch::zeros_like(slot.output);
      slot.output_grad.index_copy_(
          0, to, b.leaf.grad().index_select(0, torch::tensor(from, torch::kInt64).view({-1})));
    }
  }
}

Worker::Boundary& Worker::assembled(int producer, int mb) {
  if (const auto it = linked_.find({producer, mb}); it != linked_.end()) return it->second;
  // The consumer's input from `producer`: the links' rows in link order (the leader received
  // them; the others get them by the broadcast, into a tensor of the same shape).
  const ModuleSpec& spec = scenario_.model.modules[static_cast<std::size_t>(producer)];
  Boundary& b = linked_[{producer, mb}];
  std::vector<torch::Tensor> parts;
  int64_t row = 0;
  for (const auto& [link, samples] : consumer_links(producer, mb)) {
    const int64_t rows = lay_out_rows(producer, samples, row, b.rows) - row;
    const auto part = link_parts_.find({producer, mb, link});
    torch::Tensor rows_here;
    if (part != link_parts_.end()) {
      rows_here = part->second;
    } else {
      // A link from this very rank (no message), or a rank that gets the rows by broadcast.
      const int consumer = consumer_of(producer);
      const int64_t dp_p = dp_size_[static_cast<std::size_t>(producer)];
      const int64_t dp_c = dp_size_[static_cast<std::size_t>(consumer)];
      const int64_t replica =
          dp_p >= dp_c ? link : dp_rank_[static_cast<std::size_t>(consumer)] / (dp_c / dp_p);
      const bool self = tp_index_ == 0 && cp_index_ == 0 &&
                        producer_leader(producer, replica) == rank_ &&
                        std::any_of(stages_.begin(), stages_.end(),
                                    [&](const auto& e) { return e.first.first == producer; });
      if (self) {
        Slot& slot = producer_slot(producer, mb);
        const bool whole = slots_.count({producer, 0, mb, 0}) == 0;
        const std::vector<int32_t> order =
            whole ? samples_for(producer, -1) : samples_for(producer, mb);
        rows_here = slot.output.detach().index_select(
            0, torch::tensor(rows_of(producer, samples, order), torch::kInt64).view({-1}));
      } else {
        rows_here = torch::zeros({rows, spec.projector->out});
      }
    }
    parts.push_back(rows_here);
    row += rows;
  }
  b.leaf = torch::cat(parts, 0);
  b.leaf.set_requires_grad(true);
  b.mine_rows = row;
  return b;
}

void Worker::boundary_p2p(const Op& op) {
  // op.module: the producer's last module (the projector); the consumer is the module it feeds.
  const int producer = op.module;
  const int mb = op.microbatch;
  // The producer sends forward and receives gradients; the consumer the reverse (a colocated
  // rank is both).
  const bool producer_side = (op.kind == OpKind::kSend) == (op.phase == Phase::kF);
  auto send = [&](torch::Tensor t) {
    t = t.contiguous();
    std::vector<at::Tensor> tensors{t};
    pending_.emplace_back(groups_.world().group->send(tensors, op.peer, gloo_tag(op.tag)), t);
  };
  auto recv = [&](int64_t rows, int64_t width) {
    torch::Tensor t = torch::zeros({rows, width});
    std::vector<at::Tensor> tensors{t};
    groups_.world().group->recv(tensors, op.peer, gloo_tag(op.tag))->wait();
    return t;
  };
  const int64_t width = scenario_.model.modules[static_cast<std::size_t>(producer)].projector->out;
  if (producer_side) {
    Slot* slot = &producer_slot(producer, mb);
    const bool whole = slots_.count({producer, 0, mb, 0}) == 0;  // colocated: the whole batch
    if (op.kind == OpKind::kRecv) absorb_self_links(producer);
    const std::vector<int32_t> mine = whole ? samples_for(producer, -1) : samples_for(producer, mb);
    const std::vector<int32_t> link = link_samples(producer, mb, op.peer, false);
    const torch::Tensor rows =
        torch::tensor(rows_of(producer, link, mine), torch::kInt64).view({-1});
    if (op.kind == OpKind::kSend)  // forward: this link's rows of the output
      return send(slot->output.detach().index_select(0, rows));
    // backward: this link's rows of the output gradient
    const torch::Tensor g = recv(rows.size(0), width);
    if (!slot->output_grad.defined()) slot->output_grad = torch::zeros_like(slot->output);
    slot->output_grad.index_copy_(0, rows, g);
    return;
  }
  const std::vector<int32_t> link = link_samples(producer, mb, op.peer, true);
  const int consumer = consumer_of(producer);
  const int64_t link_id =
      dp_size_[static_cast<std::size_t>(producer)] >= dp_size_[static_cast<std::size_t>(consumer)]
          ? replica_of(producer, op.peer)
          : 0;
  if (op.kind == OpKind::kRecv) {  // forward: a link's rows, kept until assembled
    RowMap scratch;
    link_parts_[{producer, mb, link_id}] = recv(lay_out_rows(producer, link, 0, scratch), width);
    return;
  }
  // backward: this link's rows of the gradient of the assembled input
  Boundary& b = assembled(producer, mb);
  const torch::Tensor g = b.leaf.grad().defined() ? b.leaf.grad() : torch::zeros_like(b.leaf);
  std::vector<int64_t> rows;
  for (int32_t s : link) {
    const auto [first, n] = b.rows.at(s);
    for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
  }
  send(g.index_select(0, torch::tensor(rows, torch::kInt64).view({-1})));
}

const std::vector<std::pair<int64_t, int64_t>>& Worker::dip_pieces(int encoder, int mb) {
  const auto key = std::make_pair(encoder, mb);
  if (const auto it = dip_pieces_.find(key); it != dip_pieces_.end()) return it->second;
  const ModuleSpec& spec = scenario_.model.modules[static_cast<std::size_t>(encoder)];
  std::vector<const Sample*> samples;
  for (int32_t i : my_micro_batches_[static_cast<std::size_t>(mb)])
    samples.push_back(&batch_.batch.samples[static_cast<std::size_t>(i)]);
  // The lowering's cut (dip_schedule.hpp): each piece's first item, here images.
  const auto items = dip_media_items(scenario_.model, spec, samples);
  const std::vector<std::size_t> first = dip_piece_starts(
      scenario_.model, spec, samples, items, plan_.layout.vpp, scenario_.workload.max_seq_len);
  auto& out = dip_pieces_[key];
  for (std::size_t j = 0; j < first.size(); ++j) {
    const std::size_t end = j + 1 < first.size() ? first[j + 1] : items.size();
    out.emplace_back(static_cast<int64_t>(first[j]), static_cast<int64_t>(end - first[j]));
  }
  return out;
}

void Worker::dip_boundary(const Op& op) {
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  auto& world = *groups_.world().group;
  if (op.kind == OpKind::kSend) {
    torch::Tensor t;
    if (op.phase == Phase::kF) {
      t = slots_.at(key).output;
    } else {
      const torch::Tensor& leaf = dip_received_.at(key);
      t = leaf.grad().defined() ? leaf.grad() : torch::zeros_like(leaf);
    }
    t = t.detach().contiguous();
    std::vector<at::Tensor> tensors{t};
    pending_.emplace_back(world.send(tensors, op.peer, gloo_tag(op.tag)), t);
    return;
  }
  torch::Tensor t;
  if (op.phase == Phase::kF) {
    // The encoder behind this projector, and the piece's images' rows for the LLM.
    const ModelSpec& model = scenario_.model;
    const ModuleSpec* encoder = &model.modules[static_cast<std::size_t>(op.module)];
    while (encoder->role != ModuleRole::kEncoder)
      encoder = find_module(model, encoder->inputs.front());
    const int64_t images = dip_pieces(module_index(model, encoder->name), op.microbatch)
                               .at(static_cast<std::size_t>(op.sub_microbatch))
                               .second;
    const int64_t size = encoder->patching->image_size;
    t = torch::zeros({images * image_tokens(*encoder, size, size).llm_tokens,
                      model.modules[static_cast<std::size_t>(llm_)].transformer->hidden});
  } else {
    t = torch::zeros_like(slots_.at(key).output);
  }
  std::vector<at::Tensor> tensors{t};
  world.recv(tensors, op.peer, gloo_tag(op.tag))->wait();
  if (op.phase == Phase::kF) {
    t.set_requires_grad(sends_grad_.count(key) > 0);
    dip_received_[key] = t;
  } else {
    slots_.at(key).output_grad = t;
  }
}

DipStepInfo Worker::dip_schedule_for_step(int64_t iteration) {
  DipStepInfo info;
  // Every rank runs the same search for the same batch; a collective decides whether all of
  // them have it, so every rank lowers the same Program.
  const bool pending = dip_next_.valid();
  const bool ready =
      pending && dip_next_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  torch::Tensor flag = torch::tensor({ready ? 1.0 : 0.0}, torch::kFloat64);
  all_reduce(groups_.world(), flag, c10d::ReduceOp::MIN);
  if (flag.item<double>() > 0.5) {
    const DipSearchResult r = dip_next_.get();
    TESSERA_CHECK(r.error.empty(), r.error);
    dip_schedule_ = r.schedule;
    info.searched = true;
    info.search_s = r.seconds;
    info.scored = r.scored;
    info.cached = r.cached;
  } else {
    info.late = pending;
  }
  info.schedule = dip_schedule_;
  // The next batch, drawn now, and its schedule search from this one, while this step trains.
  // Layers stay where they are: moving them would move weights and optimizer state between ranks.
  if (!dip_next_.valid()) {
    next_batch_ = make_batch(scenario_, options_.dataset, iteration + 1);
    dip_next_ =
        std::async(std::launch::async, [this, batch = next_batch_->batch, start = dip_schedule_] {
          return dip_planner_->search(batch, start, /*move_layers=*/false);
        });
  }
  return info;
}

const Worker::MicroBatch& Worker::micro_batch(int mb) {
  if (const auto it = micro_batches_.find(mb); it != micro_batches_.end()) return it->second;
  MicroBatch& b = micro_batches_[mb];
  b.samples = my_micro_batches_[static_cast<std::size_t>(mb)];
  b.layout = llm_layout(scenario_.model, batch_, b.samples, scenario_.workload.max_seq_len,
                        plan_.pad_to_longest);
  const Comm* cp = cp_[static_cast<std::size_t>(llm_)];
  const int64_t cp_size = cp == nullptr ? 1 : cp->size();
  std::vector<TokenTag> tags(b.layout.sample.size());
  for (std::size_t t = 0; t < tags.size(); ++t) tags[t] = {b.layout.sample[t], b.layout.item[t]};
  const auto split = context_split(
      plan_.cp_split, tags, cp_size,
      cp_linear_tiles(*scenario_.model.modules[static_cast<std::size_t>(llm_)].transformer));
  b.local = split[static_cast<std::size_t>(cp_index_)];
  std::vector<int64_t> keys;
  for (const auto& part : split) {
    keys.insert(keys.end(), part.begin(), part.end());
    b.attention.cp_rows.push_back(static_cast<int64_t>(part.size()));
  }
  b.attention.bias = attention_bias(b.layout, b.local, keys);
  b.attention.positions_q =
      b.layout.positions.index_select(0, torch::tensor(b.local, torch::kInt64).view({-1}));
  b.attention.cp = cp;
  return b;
}

StepResult Worker::step(int64_t iteration) {
  const auto prepare = std::chrono::steady_clock::now();
  const ModelSpec& model = scenario_.model;
  if (next_batch_ && next_batch_->batch.iteration == iteration)
    batch_ = std::move(*next_batch_);
  else
    batch_ = make_batch(scenario_, options_.dataset, iteration);
  next_batch_.reset();
  std::optional<DipStepInfo> dip;
  if (dip_) dip = dip_schedule_for_step(iteration);
  Lowered lowered = lower(model, scenario_.cluster, plan_, scenario_.workload, batch_.batch,
                          dip_ ? &dip_schedule_ : nullptr);
  TESSERA_CHECK(lowered.error.empty(), lowered.error);
  StepResult result;
  result.dip = std::move(dip);
  result.program = std::move(lowered.program);
  const Program& p = result.program;
  program_ = &p;
  result.llm_tokens = p.llm_tokens;
  result.samples = batch_.batch.samples;
  // The lowering's micro-batches (Entrain: the encoders level 1, the LLM level 2).
  entrain_ = plan_.microbatching == MicrobatchPolicy::kEntrain;
  const MicrobatchAssignment& assignment = p.llm_microbatches;
  // Colocated encoders run the whole batch at once (as the lowering has them): only the LLM's
  // micro-batches, level 2, exist there.
  encoder_assignment_ =
      plan_.placement == Placement::kColocated ? assignment : p.encoder_microbatches;
  entrain_leaves_.clear();
  my_micro_batches_ = assignment[static_cast<std::size_t>(dp_index_)];
  assignment_ = assignment;
  boundaries_.clear();
  linked_.clear();
  link_parts_.clear();
  absorbed_.clear();
  micro_batches_.clear();
  dip_pieces_.clear();
  dip_received_.clear();
  slots_.clear();
  received_.clear();
  has_w_.clear();
  sends_grad_.clear();
  cuts_.clear();
  forward_pieces_.clear();
  piece_times_.clear();
  gathers_.clear();
  pending_.clear();
  loss_sum_ = 0;
  synchronized_ = false;
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
    TESSERA_CHECK(!(op.kind == OpKind::kCompute && op.phase == Phase::kR),
                  "activation recomputation is not in the executor yet");
  }
  for (auto& [m, sh] : shards_) sh->start_iteration();
  // Gradients start at zero every iteration, so every plan steps every parameter.
  for (auto& [key, st] : stages_)
    for (Param& prm : st->params())
      if (prm.tensor.requires_grad()) prm.tensor.mutable_grad() = torch::zeros_like(prm.tensor);

  result.times.assign(ops.size(), OpTime{});
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
        std::vector<at::Tensor> tensors{t};
        pending_.emplace_back(groups_.world().group->send(tensors, op.peer, gloo_tag(op.tag)), t);
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
            t = torch::zeros({static_cast<int64_t>(micro_batch(op.microbatch).local.size()),
                              spec.transformer->hidden});
          } else {
            // A pipelined image encoder: (images, tokens per image, hidden) between its stages.
            TESSERA_CHECK(
                spec.role == ModuleRole::kEncoder && spec.modality == Modality::kImage,
                "activations of " + spec.name + " across ranks are not in the executor yet");
            int64_t images = 0;
            if (dip_)
              images = dip_pieces(op.module, op.microbatch)
                           .at(static_cast<std::size_t>(op.sub_microbatch))
                           .second;
            else
              for (int32_t sample : samples_for(op.module, op.microbatch))
                images += static_cast<int64_t>(
                    batch_.data[static_cast<std::size_t>(sample)].images.size());
            const int64_t size = spec.patching->image_size;
            t = torch::zeros(
                {images, image_tokens(spec, size, size).encoder_tokens, spec.transformer->hidden});
          }
        } else {
          t = torch::zeros_like(slots_.at(key).output);
        }
        if ((op.flags & kOpTpScattered) != 0) {
          // This rank's slice now; the compute op that consumes it gathers the whole.
          torch::Tensor part = torch::empty_like(tp_slice(op, t));
          std::vector<at::Tensor> tensors{part};
          groups_.world().group->recv(tensors, op.peer, gloo_tag(op.tag))->wait();
          slices_[{key, op.phase}] = {part, t};
          break;
        }
        std::vector<at::Tensor> tensors{t};
        groups_.world().group->recv(tensors, op.peer, gloo_tag(op.tag))->wait();
        deliver(key, op.phase, t);
        break;
      }
      case OpKind::kCollective:
        if (op.purpose == Purpose::kBoundary)
          boundary_collective(op);
        else if (op.purpose == Purpose::kNorm)
          synchronize_norm_and_loss();
        else
          reduce_gradients(op);
        break;
      case OpKind::kOptimizerStep:
        optimizer_step(op);
        break;
    }
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
  for (auto& [work, tensor] : pending_) work->wait();
  pending_.clear();
  if (!synchronized_) synchronize_norm_and_loss();
  result.step_s = now();
  result.loss = loss_;
  result.grad_norm = grad_norm_;
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
  backward(op, op.phase == Phase::kW);
}

void Worker::forward(const Op& op) {
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  Stage& st = stage(op.module, op.chunk);
  const ModuleSpec& spec = st.module();
  const ModelSpec& model = scenario_.model;
  Slot& slot = slots_[key];
  // A module's input from a module on this rank: the producer's output, cut from its graph
  // (the producer's own B op continues from the gradient this op's B computes).
  auto from_producer = [&](const std::string& name) {
    const int producer = module_index(model, name);
    for (auto& [k, other] : stages_)
      if (k.first == producer && other->last()) {
        const torch::Tensor& out =
            slots_.at({producer, k.second, op.microbatch, op.sub_microbatch}).output;
        torch::Tensor leaf = out.detach();
        leaf.set_requires_grad(out.requires_grad());
        return leaf;
      }
    TESSERA_CHECK(false, name + " does not run on rank " + std::to_string(rank_) +
                             " (boundaries across ranks are not in the executor yet)");
    return torch::Tensor();
  };
  std::vector<torch::Tensor> inputs;
  std::vector<torch::Tensor> entrain_parts;  // Entrain: the LLM's media rows, per input
  std::vector<torch::Tensor> dip_parts;      // DIP: each input's sub-micro-batches, joined
  // Colocated: the LLM's micro-batches take their rows from the producers' whole-batch outputs.
  const bool whole_batch_inputs = spec.role == ModuleRole::kLlm && st.first() &&
                                  !received_.count(key) &&
                                  plan_.placement != Placement::kHomogeneous;
  // The rows of each input: the colocated boundary's (whole batch), or the non-colocated one's
  // (this micro-batch, assembled from the links).
  // Each LLM micro-batch selects its rows from the boundary (under Entrain from the one or two
  // encoder micro-batches holding them, below).
  const bool boundary_rows = whole_batch_inputs && !(entrain_ && linked_boundary_);
  auto input_boundary = [&](int producer) -> Boundary& {
    return linked_boundary_ ? assembled(producer, op.microbatch) : boundary(producer);
  };
  if (!st.first() || (spec.role == ModuleRole::kLlm && received_.count(key))) {
    inputs.push_back(received_.at(key));
  } else if (boundary_rows) {
    for (const std::string& name : spec.inputs)
      inputs.push_back(input_boundary(module_index(model, name)).leaf);
  } else if (dip_ && spec.role == ModuleRole::kLlm) {
    // The pieces' outputs in order are the micro-batch's media rows; the pieces are the leaves.
    for (const std::string& name : spec.inputs) {
      const int producer = module_index(model, name);
      std::vector<torch::Tensor> pieces;
      for (int sub = 0;; ++sub) {
        const auto it = dip_received_.find({producer, 0, op.microbatch, sub});
        if (it == dip_received_.end()) break;
        pieces.push_back(it->second);
        inputs.push_back(it->second);
      }
      dip_parts.push_back(pieces.empty() ? torch::zeros({0, spec.transformer->hidden})
                                         : torch::cat(pieces, 0));
    }
  } else if (entrain_ && spec.role == ModuleRole::kLlm) {
    // Each input's rows from two encoder micro-batches; the leaves are what backward targets.
    for (const std::string& name : spec.inputs)
      entrain_parts.push_back(entrain_rows(module_index(model, name), op.microbatch, inputs));
  } else if (spec.role != ModuleRole::kEncoder) {
    for (const std::string& name : spec.inputs) inputs.push_back(from_producer(name));
  }
  const bool needs_graph =
      st.trainable() || std::any_of(inputs.begin(), inputs.end(),
                                    [](const torch::Tensor& t) { return t.requires_grad(); });
  // A frozen module with nothing trainable before it keeps no graph.
  torch::AutoGradMode graph(needs_graph);
  Cuts* cuts = nullptr;
  if (const auto it = cuts_.find(key); it != cuts_.end() && needs_graph) {
    slot.cuts = Cuts{};
    slot.cuts.layers = it->second;
    cuts = &slot.cuts;
  }
  if (const auto pieces = forward_pieces_.find(key); pieces != forward_pieces_.end()) {
    // In pieces: each waits for its parameters' gather as the layers reach it.
    if (cuts == nullptr) {
      slot.cuts = Cuts{};
      cuts = &slot.cuts;
    }
    cuts->entering = [this, &pieces = pieces->second,
                      running = current_op_](int64_t layer) mutable {
      const auto piece = pieces.find(layer);
      if (piece == pieces.end() || piece_times_.count(piece->second)) return;
      piece_times_[running].second = elapsed();
      await_gathers(program_->ranks[static_cast<std::size_t>(rank_)]
                                   [static_cast<std::size_t>(piece->second)]);
      piece_times_[piece->second].first = elapsed();
      running = piece->second;
    };
  }
  torch::Tensor out;
  switch (spec.role) {
    case ModuleRole::kEncoder: {
      const std::vector<int32_t> samples = samples_for(op.module, op.microbatch);
      if (spec.modality == Modality::kAudio)
        out = st.encode_audio(micro_batch_audio(batch_, samples), cuts);
      else if (!inputs.empty())
        out = st.encode(inputs[0], cuts);
      else if (dip_) {
        // This sub-micro-batch's images of the LLM micro-batch.
        const auto [first, count] =
            dip_pieces(op.module, op.microbatch).at(static_cast<std::size_t>(op.sub_microbatch));
        out =
            st.encode(micro_batch_images(spec, batch_,
                                         my_micro_batches_[static_cast<std::size_t>(op.microbatch)])
                          .narrow(0, first, count),
                      cuts);
      } else {
        out = st.encode(micro_batch_images(spec, batch_, samples), cuts);
      }
      break;
    }
    case ModuleRole::kProjector:
      out = st.project(inputs.at(0));
      break;
    case ModuleRole::kLlm: {
      const MicroBatch& b = micro_batch(op.microbatch);
      // The contract with the lowering: this op processes the tokens the Program says (with
      // CP, the Program charges each rank an even share).
      const int64_t cp = b.attention.cp != nullptr ? b.attention.cp->size() : 1;
      TESSERA_CHECK(cp > 1 || b.layout.tokens == op.tokens,
                    op_name(*program_, op) + ": the micro-batch has " +
                        std::to_string(b.layout.tokens) + " tokens, the Program " +
                        std::to_string(op.tokens));
      const auto local = torch::tensor(b.local, torch::kInt64).view({-1});
      torch::Tensor h;
      if (st.first() && !received_.count(key)) {
        const int64_t hidden = spec.transformer->hidden;
        // The LLM's inputs in order (llm_layout numbers media rows the same way); at a
        // colocated boundary, each input's rows of this micro-batch's samples.
        // (Colocated Entrain: the whole-batch boundary serves the LLM's level-2 micro-batches.)
        std::vector<torch::Tensor> parts = dip_                         ? dip_parts
                                           : entrain_ && !boundary_rows ? entrain_parts
                                                                        : inputs;
        if (boundary_rows)
          for (std::size_t i = 0; i < inputs.size(); ++i) {
            const Boundary& bd = input_boundary(module_index(model, spec.inputs[i]));
            std::vector<int64_t> rows;
            for (int32_t sample : b.samples) {
              const auto [first_row, count] = bd.rows.at(sample);
              for (int64_t r = 0; r < count; ++r) rows.push_back(first_row + r);
            }
            parts[i] = inputs[i].index_select(0, torch::tensor(rows, torch::kInt64).view({-1}));
          }
        const torch::Tensor media =
            parts.empty() ? torch::zeros({0, hidden}) : torch::cat(parts, 0);
        h = st.embed(b.layout.ids, b.layout.text_slots, media, b.layout.media_slots,
                     b.layout.media_rows, local);
      } else {
        h = inputs.at(0);
      }
      h = st.blocks(h, b.attention, cuts);
      if (st.last()) {
        out = st.loss_sum(h, b.layout.targets.index_select(0, local)) /
              static_cast<double>(batch_.targets);
        if (tp_index_ == 0) loss_sum_ += out.item<double>();
      } else {
        out = h;
      }
      break;
    }
    case ModuleRole::kGenerator:
      TESSERA_CHECK(false, "generators are not in the executor yet");
  }
  slot.inputs = inputs;  // all of them: a producer finds its gradient by input position
  slot.output = out;
}

torch::Tensor Worker::output_gradient(const Op& op, Slot& slot) {
  Stage& st = stage(op.module, op.chunk);
  if (linked_boundary_ && consumer_of(op.module) >= 0) {
    absorb_self_links(op.module);
  }
  torch::Tensor grad = slot.output_grad;
  if (st.module().role == ModuleRole::kLlm && st.last()) {
    grad = torch::ones_like(slot.output);
  } else if (!grad.defined() && boundaries_.count(op.module)) {
    // A colocated boundary without a regroup: this rank's rows of the accumulated gradient.
    const Boundary& bd = boundaries_.at(op.module);
    grad = bd.leaf.grad().defined() ? bd.leaf.grad().narrow(0, bd.mine_first, bd.mine_rows)
                                    : torch::zeros_like(slot.output);
  } else if (!grad.defined() && entrain_leaves_.count({op.module, op.microbatch})) {
    // Entrain: accumulated over the LLM micro-batches that took this micro-batch's rows.
    const torch::Tensor& leaf = entrain_leaves_.at({op.module, op.microbatch});
    grad = leaf.grad().defined() ? leaf.grad() : torch::zeros_like(slot.output);
  } else if (!grad.defined()) {
    // The consumer on this rank computed it: the gradient of its input from this module.
    const std::string& name = st.module().name;
    for (std::size_t c = 0; c < scenario_.model.modules.size() && !grad.defined(); ++c) {
      const auto& inputs = scenario_.model.modules[c].inputs;
      const auto it = std::find(inputs.begin(), inputs.end(), name);
      if (it == inputs.end()) continue;
      for (auto& [k, other] : stages_)
        if (k.first == static_cast<int>(c) && other->first()) {
          const auto found = slots_.find({k.first, k.second, op.microbatch, op.sub_microbatch});
          if (found != slots_.end() && !found->second.input_grads.empty())
            grad = found->second.input_grads.at(static_cast<std::size_t>(it - inputs.begin()));
        }
    }
    TESSERA_CHECK(grad.defined(), "no output gradient for " + op_name(*program_, op));
  }
  return grad;
}

void Worker::backward(const Op& op, bool weights) {
  const Key key{op.module, op.chunk, op.microbatch, op.sub_microbatch};
  Stage& st = stage(op.module, op.chunk);
  Slot& slot = slots_.at(key);
  const bool has_w = has_w_.count(key) > 0;
  if (!slot.output.defined() || !slot.output.requires_grad()) {
    // Nothing flowed through (a frozen module whose micro-batch has no media): zero gradients
    // for the producers.
    if (!weights && slot.input_grads.empty())
      for (const torch::Tensor& in : slot.inputs) slot.input_grads.push_back(torch::zeros_like(in));
    return;
  }
  // A gradient bucket's piece runs layers [a, b) only: from the cut at b (or the stage's
  // output) down to the cut at a (or the stage's inputs).
  int64_t a = st.begin(), b = st.end();
  if ((op.flags & kOpGradientBucket) != 0) {
    a = op.first_layer;
    b = op.first_layer + op.layers;
  }
  const bool top = b == st.end(), bottom = a == st.begin();
  std::vector<torch::Tensor> outputs, grads;
  if (top) {
    outputs = {slot.output};
    grads = {output_gradient(op, slot)};
  } else {
    outputs = slot.cuts.below.at(b);
    grads = slot.cut_grads.at(b);
  }
  const std::vector<torch::Tensor>& starts = bottom ? slot.inputs : slot.cuts.above.at(a);
  std::vector<torch::Tensor> targets;
  if (!weights)
    for (const torch::Tensor& in : starts)
      if (in.requires_grad()) targets.push_back(in);
  if (weights || !has_w)
    for (const Param* p : st.params_of(a, b))
      if (p->tensor.requires_grad()) targets.push_back(p->tensor);
  if (!targets.empty())
    torch::autograd::backward(outputs, grads, /*retain_graph=*/!weights && has_w,
                              /*create_graph=*/false, targets);
  if (!weights) {
    std::vector<torch::Tensor> start_grads;
    for (const torch::Tensor& in : starts)
      start_grads.push_back(in.grad().defined() ? in.grad() : torch::zeros_like(in));
    if (bottom)
      slot.input_grads = start_grads;
    else
      slot.cut_grads[a] = start_grads;
  }
  if (bottom && (weights || !has_w)) {
    slot.output = torch::Tensor();
    slot.inputs.clear();
    slot.cuts = Cuts{};
    slot.cut_grads.clear();
  }
}

void Worker::reduce_gradients(const Op& op) {
  TESSERA_CHECK(
      op.purpose == Purpose::kDp,
      op_name(*program_, op) + ": only data-parallel collectives are in the executor so far");
  if (op.collective == CollectiveKind::kAllGather) return gather_parameters(op);
  TESSERA_CHECK(op.collective == CollectiveKind::kAllReduce ||
                    op.collective == CollectiveKind::kReduceScatter,
                op_name(*program_, op) + ": unexpected gradient collective");
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  const bool bucketed = (op.flags & kOpGradientBucket) != 0;
  if (op.collective == CollectiveKind::kReduceScatter) {
    // The sharded optimizer: each rank receives the sum of its slices only; a bucket's in the
    // background while the backward goes on.
    for (PendingCollective& r : shards_.at(op.module)->reduce_scatter(op, comm, bucketed))
      reductions_.push_back(std::move(r));
    return;
  }
  if (bucketed && comm.size() > 1) {
    // One bucket, summed in the background while the backward goes on; the global norm waits.
    std::vector<torch::Tensor> grads, flat;
    for (Param* p :
         stage(op.module, op.chunk).params_of(op.first_layer, op.first_layer + op.layers))
      if (p->tensor.requires_grad()) {
        grads.push_back(p->tensor.mutable_grad());
        flat.push_back(grads.back().reshape({-1}));
      }
    if (flat.empty()) return;
    std::vector<at::Tensor> tensors{torch::cat(flat)};
    reductions_.push_back({comm.group->allreduce(tensors), [grads, sum = tensors[0]]() mutable {
                             int64_t at = 0;
                             for (torch::Tensor& g : grads) {
                               g.copy_(sum.narrow(0, at, g.numel()).view_as(g));
                               at += g.numel();
                             }
                           }});
    return;
  }
  std::vector<torch::Tensor> params = trainable(op.module);
  if (params.empty()) return;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) grads.push_back(p.grad().view({-1}));
  torch::Tensor flat = torch::cat(grads);
  // Buckets of at most 25 MB, as DDP and Megatron reduce them.
  constexpr int64_t kBucket = 25 * 1000 * 1000 / 4;
  for (int64_t begin = 0; begin < flat.numel(); begin += kBucket) {
    torch::Tensor bucket = flat.narrow(0, begin, std::min(kBucket, flat.numel() - begin));
    all_reduce(comm, bucket);
  }
  int64_t at = 0;
  for (torch::Tensor& p : params) {
    const int64_t n = p.numel();
    p.mutable_grad().copy_(flat.narrow(0, at, n).view_as(p));
    at += n;
  }
}

void Worker::finish_reductions() {
  for (PendingCollective& r : reductions_) r.finish();
  reductions_.clear();
}

void Worker::synchronize_norm_and_loss() {
  finish_reductions();
  // Each distinct gradient counted once: a shard held by `copies` ranks contributes 1/copies.
  double norm2 = 0;
  for (auto& [m, sh] : shards_) norm2 += sh->norm_squared();
  for (auto& [key, st] : stages_) {
    const auto m = static_cast<std::size_t>(key.first);
    if (shards_.count(key.first)) continue;
    for (const Param& p : st->params()) {
      if (!p.tensor.requires_grad()) continue;
      const double copies = static_cast<double>((p.tp_sharded ? 1 : tp_[m]->size()) * dpcp_[m]);
      norm2 += p.tensor.grad().to(torch::kFloat64).pow(2).sum().item<double>() / copies;
    }
  }
  torch::Tensor t = torch::tensor({norm2, loss_sum_}, torch::kFloat64);
  all_reduce(groups_.world(), t);
  grad_norm_ = std::sqrt(t[0].item<double>());
  loss_ = t[1].item<double>();
  clip_coefficient_ = options_.clip > 0 ? std::min(1.0, options_.clip / (grad_norm_ + 1e-6)) : 1.0;
  synchronized_ = true;
}

void Worker::optimizer_step(const Op& op) {
  if (!synchronized_) synchronize_norm_and_loss();
  if (const auto shard = shards_.find(op.module); shard != shards_.end())
    return shard->second->step(clip_coefficient_);
  const auto it = optimizers_.find(op.module);
  if (it == optimizers_.end()) return;
  if (clip_coefficient_ < 1.0)
    for (torch::Tensor& p : trainable(op.module)) p.mutable_grad().mul_(clip_coefficient_);
  it->second->step();
}

void Worker::gather_parameters(const Op& op) {
  const auto shard = shards_.find(op.module);
  TESSERA_CHECK(shard != shards_.end(), op_name(*program_, op) + ": no sharded optimizer here");
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  // A bucket's gather (overlap_param_gather) runs in the background: the ops that depend on it
  // wait for it.
  const bool bucket = (op.flags & kOpGradientBucket) != 0;
  std::vector<PendingCollective> pending = shard->second->all_gather(op, comm, bucket);
  if (!pending.empty()) gathers_[current_op_] = std::move(pending);
}

double Worker::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void Worker::await_gathers(const Op& op) {
  for (const int32_t dep : op.deps) {
    const auto it = gathers_.find(dep);
    if (it == gathers_.end()) continue;
    for (PendingCollective& g : it->second) g.finish();
    gathers_.erase(it);
  }
}

int64_t Worker::parameter_bytes() const {
  // fp32 weights, gradients of the trainable ones, and AdamW's two moments for what this
  // rank's optimizer holds (its slice, with the sharded optimizer).
  int64_t bytes = 0;
  for (const auto& [key, st] : stages_)
    for (const Param& p : const_cast<Stage&>(*st).params())
      bytes += p.tensor.numel() * 4 * (p.tensor.requires_grad() ? 2 : 1);
  for (const auto& [m, opt] : optimizers_)
    for (const auto& group : opt->param_groups())
      for (const torch::Tensor& t : group.params()) bytes += t.numel() * 4 * 2;
  for (const auto& [m, sh] : shards_) bytes += sh->master().numel() * 4 * 2;
  return bytes;
}

void Worker::save(const std::string& path) {
  torch::serialize::OutputArchive archive;
  for (auto& [key, st] : stages_)
    for (const Param& p : st->params()) archive.write("param/" + p.name, p.tensor.detach());
  for (auto& [m, opt] : optimizers_) {
    torch::serialize::OutputArchive sub;
    opt->save(sub);
    archive.write("optimizer/" + std::to_string(m), sub);
  }
  // The distributed optimizer's slices hold the latest parameters (with overlap_param_gather
  // the parameters above are gathered from them only as the next step begins).
  for (auto& [m, sh] : shards_) {
    torch::serialize::OutputArchive sub;
    sh->adam().save(sub);
    archive.write("optimizer/" + std::to_string(m), sub);
    archive.write("shard/" + std::to_string(m), sh->master().detach());
  }
  archive.save_to(path);
}

void Worker::load(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::NoGradGuard no_grad;
  for (auto& [key, st] : stages_)
    for (Param& p : st->params()) {
      torch::Tensor t;
      archive.read("param/" + p.name, t);
      TESSERA_CHECK(t.sizes() == p.tensor.sizes(), path + ": " + p.name + " has another shape");
      p.tensor.copy_(t);
    }
  for (auto& [m, opt] : optimizers_) {
    torch::serialize::InputArchive sub;
    archive.read("optimizer/" + std::to_string(m), sub);
    opt->load(sub);
  }
  for (auto& [m, sh] : shards_) {
    torch::serialize::InputArchive sub;
    archive.read("optimizer/" + std::to_string(m), sub);
    sh->adam().load(sub);
    torch::Tensor master;
    archive.read("shard/" + std::to_string(m), master);
    TESSERA_CHECK(master.sizes() == sh->master().sizes(),
                  path + ": the distributed optimizer's slice of module " + std::to_string(m) +
                      " has another shape");
    sh->master().detach().copy_(master);
  }
}

}  // namespace tessera::exec

#include "shared/search/plan_search.hpp"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <exception>
#include <mutex>
#include <set>
#include <thread>

#include "shared/model/model_math.hpp"
#include "shared/search/memory_bound.hpp"
#include "shared/search/memory_gate.hpp"
#include "shared/search/scenario_report.hpp"
#include "shared/search/stage_split.hpp"

namespace tessera {

namespace {

ModuleLayout layout(int64_t tp, int64_t cp, int64_t pp, int64_t dp, int64_t vpp, int64_t ep = 1,
                    int64_t etp = 0) {
  ModuleLayout l;
  l.tp = tp;
  l.cp = cp;
  l.pp = pp;
  l.dp = dp;
  l.vpp = vpp;
  l.ep = ep;
  l.etp = etp;
  return l;
}

// The LLM-side grids of the space on `gpus` devices: (tp, cp, pp, vpp, ep, etp, micro-batch
// size).
struct LlmChoice {
  int64_t tp, cp, pp, dp, vpp, ep, etp, mbs;
  Recompute recompute;
  bool sequence_parallel, distributed_optimizer, fully_sharded;
  Fp8Recipe fp8;
  MoeDispatcher dispatcher = MoeDispatcher::kAllToAll;
  bool a2a_overlap = false;
};

// `experts`: the LLM's per layer (0: dense, EP 1 only).
std::vector<LlmChoice> llm_choices(const SearchSpace& space, int64_t gpus, int64_t experts) {
  std::vector<LlmChoice> out;
  for (int64_t tp : space.tp)
    for (int64_t cp : space.cp)
      for (int64_t pp : space.pp) {
        if (gpus % (tp * cp * pp) != 0) continue;  // the grid does not tile the devices
        const int64_t dp = gpus / (tp * cp * pp);
        // EP splits the experts evenly, carved out of cp·dp where the experts split over TP
        // (etp "tp", 0 here) and out of tp·cp·dp where they are whole on each rank (etp 1, a
        // distinct plan only where tp > 1, and then with sequence parallelism).
        std::vector<std::pair<int64_t, int64_t>> experts_grids;  // (ep, etp)
        std::set<int64_t> etps;
        for (int64_t etp : experts > 0 ? space.etp : std::vector<int64_t>{0})
          etps.insert(tp > 1 ? etp : 0);
        for (int64_t etp : etps) {
          const int64_t carved = etp == 1 ? tp * cp * dp : cp * dp;
          for (int64_t ep : experts > 0 ? space.ep : std::vector<int64_t>{1})
            if (ep == 1 || (experts % ep == 0 && carved % ep == 0))
              experts_grids.emplace_back(ep, etp);
        }
        for (int64_t vpp : space.vpp) {
          if (vpp > 1 && pp == 1) continue;  // virtual stages need a pipeline
          for (const auto& [ep, etp] : experts_grids)
            for (int64_t mbs : space.micro_batch_sizes)
              for (Recompute recompute : space.recompute)
                // Sequence parallelism splits over tp: one value where tp = 1.
                for (bool sp : tp > 1 ? space.sequence_parallel : std::vector<bool>{false}) {
                  if (etp == 1 && !sp) continue;  // each TP rank routes its own tokens
                  for (bool distributed : space.distributed_optimizer) {
                    // Full sharding needs the distributed optimizer and replicas to shard over.
                    const bool shardable = distributed && dp * cp > 1;
                    for (bool full : shardable ? space.fully_sharded : std::vector<bool>{false})
                      for (Fp8Recipe fp8 : space.fp8)
                        // The dispatch options where there is an all-to-all (EP > 1).
                        for (MoeDispatcher dispatcher :
                             ep > 1 ? space.moe_dispatchers
                                    : std::vector<MoeDispatcher>{MoeDispatcher::kAllToAll})
                          for (bool overlap :
                               ep > 1 ? space.moe_a2a_overlap : std::vector<bool>{false})
                            out.push_back({tp, cp, pp, dp, vpp, ep, etp, mbs, recompute, sp,
                                           distributed, full, fp8, dispatcher, overlap});
                  }
                }
        }
      }
  return out;
}

// A candidate's stable id: the canonical JSON of (gpus, plan).
std::string candidate_key(int64_t gpus, const ParallelPlan& plan) {
  return Json{{"gpus", gpus}, {"plan", to_json(plan)}}.dump();
}

void base_options(ParallelPlan& p, const LlmChoice& c) {
  p.micro_batch_size = c.mbs;
  p.recompute = c.recompute;
  p.sequence_parallel = c.sequence_parallel && c.tp > 1;
  p.distributed_optimizer = c.distributed_optimizer;
  p.fully_sharded = c.fully_sharded;
  // FP8 as NeMo's recipes run it: with the distributed optimizer, weights kept and gathered in FP8.
  p.fp8 = c.fp8;
  p.fp8_param_gather = c.fp8 != Fp8Recipe::kNone && c.distributed_optimizer;
  p.moe_dispatcher = c.dispatcher;
  p.moe_a2a_overlap = c.a2a_overlap;
  p.stage_split = StageSplit::kUniform;  // plans without a pipeline; consider() varies it
}

}  // namespace

ClusterSpec cluster_with_devices(const ClusterSpec& cluster, int64_t gpus) {
  ClusterSpec c = cluster;
  if (c.kind == ClusterKind::kCpuLocal) return c;
  if (gpus <= c.devices_per_node) {
    c.nodes = 1;
    c.devices_per_node = gpus;
  } else {
    c.nodes = (gpus + c.devices_per_node - 1) / c.devices_per_node;
  }
  return c;
}

std::string rejection_reason(const std::string& m) {
  const std::pair<const char*, const char*> rules[] = {
      {"kv_heads", "kv_heads vs tp"},
      {"heads=", "heads % tp"},
      {"experts", "experts % ep"},
      {"fewer than pp*vpp", "layers < pp*vpp"},
      {"not divisible into", "sequence % cp"},
      {"global_batch", "batch divisibility"},
      {"interleaved 1F1B needs", "micro-batches % pp"},
      {"must divide one another", "boundary dp"},
      {"ranks, cluster", "world != devices"},
      {"needs", "memory"},
  };
  for (const auto& [needle, reason] : rules)
    if (m.find(needle) != std::string::npos) return reason;
  return m.substr(0, 40);
}

Enumeration enumerate_plans(const Scenario& s, const SearchSpace& space, int64_t gpus,
                            const CostParams* cost, double encoder_share) {
  Enumeration e;
  const ClusterSpec cluster = cluster_with_devices(s.cluster, gpus);
  const ModuleSpec* llm = find_llm(s.model);
  std::vector<const ModuleSpec*> encoders;
  for (const ModuleSpec& m : s.model.modules)
    if (m.role == ModuleRole::kEncoder) encoders.push_back(&m);
  const int64_t experts = llm != nullptr && llm->transformer ? llm->transformer->experts : 0;
  auto consider_one = [&](ParallelPlan plan) {
    ++e.considered;
    Diagnostics diag;
    validate_plan(plan, s.model, s.workload, cluster, "", "", diag);
    if (!diag.ok()) {
      ++e.rejected[rejection_reason(diag.errors().front().message)];
      return;
    }
    // Frozen-aware boundaries go into the plan, so a run of it uses them as they are.
    plan = resolve_stage_split(plan, s.model, s.workload, cluster, cost);
    // Where they come out even, the plan is its uniform twin: considered once, as that.
    if (plan.stage_split == StageSplit::kFrozenAware && splits_evenly(plan, s.model) &&
        std::find(space.stage_splits.begin(), space.stage_splits.end(), StageSplit::kUniform) !=
            space.stage_splits.end()) {
      ++e.rejected["same as its uniform split"];
      return;
    }
    std::string key = candidate_key(gpus, plan);
    e.valid.push_back({std::move(key), gpus, std::move(plan)});
  };
  // A pipelined plan once per stage split of the space, a context-parallel one once per CP
  // split; others once.
  auto consider = [&](ParallelPlan plan) {
    plan.framework = space.framework;
    bool pipelined = plan.layout.pp * plan.layout.vpp > 1, context = plan.layout.cp > 1;
    for (const auto& [name, l] : plan.modules) {
      pipelined = pipelined || l.pp * l.vpp > 1;
      context = context || l.cp > 1;
    }
    const std::vector<StageSplit> stage_splits =
        pipelined ? space.stage_splits : std::vector<StageSplit>{plan.stage_split};
    const std::vector<CpSplit> cp_splits =
        context ? space.cp_splits : std::vector<CpSplit>{plan.cp_split};
    // Where a module's heads do not divide its TP, each way the space offers to run it.
    std::vector<IndivisibleHeads> heads = {IndivisibleHeads::kRefuse};
    if (std::any_of(s.model.modules.begin(), s.model.modules.end(), [&](const ModuleSpec& m) {
          return m.transformer && m.role != ModuleRole::kProjector &&
                 !accepts_tp(*m.transformer, module_tp(plan, s.model, m));
        })) {
      heads.clear();
      for (IndivisibleHeads option : space.indivisible_heads)
        if (option != IndivisibleHeads::kReplicate || plan.placement == Placement::kHomogeneous)
          heads.push_back(option);
      if (heads.empty()) heads = {IndivisibleHeads::kRefuse};  // rejected, and counted so
    }
    // Where encoders fan in to the LLM, each way of dealing them its samples.
    std::vector<EncoderDataParallel> dealing = {EncoderDataParallel::kSamples};
    plan.encoder_data_parallel = EncoderDataParallel::kMedia;
    if (std::any_of(s.model.modules.begin(), s.model.modules.end(),
                    [&](const ModuleSpec& m) { return media_parallel(plan, s.model, m); }))
      dealing = space.encoder_data_parallel;
    for (EncoderDataParallel deal : dealing)
      for (IndivisibleHeads option : heads)
        for (StageSplit stage : stage_splits)
          for (CpSplit cp : cp_splits)
            for (MicrobatchPolicy policy : space.microbatching) {
              plan.encoder_data_parallel = deal;
              plan.indivisible_heads = option;
              plan.stage_split = stage;
              plan.cp_split = cp;
              plan.microbatching = policy;
              consider_one(plan);
            }
  };
  for (Placement placement : space.placements) {
    for (const LlmChoice& c : llm_choices(space, gpus, experts)) {
      const Schedule pipeline = c.vpp > 1 ? Schedule::kInterleaved1F1B : Schedule::k1F1B;
      if (placement == Placement::kHomogeneous) {
        for (Schedule schedule : space.homogeneous_schedules) {
          if (schedule == Schedule::kDip && (c.pp < 2 || encoders.empty() || c.fully_sharded))
            continue;
          ParallelPlan p;
          p.placement = placement;
          p.layout = layout(c.tp, c.cp, c.pp, c.dp, c.vpp, c.ep, c.etp);
          p.schedule = schedule == Schedule::kDip ? schedule : pipeline;
          base_options(p, c);
          consider(p);
        }
      } else if (placement == Placement::kColocated && !encoders.empty()) {
        // Every encoder on all devices with its own TP (and DP = the rest); the LLM grid c.
        for (int64_t tp_e : space.tp)
          for (int64_t cp_e : space.encoder_cp) {
            if (gpus % (tp_e * cp_e) != 0 || c.vpp > 1) continue;
            ParallelPlan p;
            p.placement = placement;
            for (const ModuleSpec* enc : encoders)
              p.modules.emplace_back(enc->name, layout(tp_e, cp_e, 1, gpus / (tp_e * cp_e), 1));
            p.modules.emplace_back(llm->name, layout(c.tp, c.cp, c.pp, c.dp, 1, c.ep, c.etp));
            p.schedule = Schedule::kThreePhase;
            base_options(p, c);
            consider(p);
          }
      }
    }
    if (placement != Placement::kNonColocated || encoders.empty()) continue;
    // Non-colocated: the encoders share 1/16 .. 1/2 of the devices equally, each with its own
    // TP; the LLM takes the rest with any grid of the space.
    // Each encoder's devices: 1/16 .. 1/2 of them shared equally, and with an encoder work
    // share (Entrain's static layout) the devices in that proportion.
    const auto n_enc = static_cast<int64_t>(encoders.size());
    std::set<int64_t> shares;
    for (int64_t fraction : {16, 8, 4, 2}) {
      const int64_t share = gpus / fraction / n_enc;
      if (share >= 1 && share * fraction * n_enc == gpus) shares.insert(share);
    }
    // Devices beyond the largest power of two, for the encoders: the LLM keeps a grid as large
    // as the homogeneous plans' (72 GPUs: 64 for the LLM, 8 for the encoders).
    if (const auto llm_devices = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(gpus)));
        llm_devices < gpus && (gpus - llm_devices) % n_enc == 0)
      shares.insert((gpus - llm_devices) / n_enc);
    if (encoder_share > 0) {
      const auto share = static_cast<int64_t>(
          std::llround(static_cast<double>(gpus) * encoder_share / static_cast<double>(n_enc)));
      if (share >= 1 && share * n_enc < gpus) shares.insert(share);
    }
    for (int64_t share : shares) {
      const int64_t rest = gpus - share * n_enc;
      for (int64_t tp_e : space.tp)
        for (int64_t pp_e : space.encoder_pp)
          for (int64_t cp_e : space.encoder_cp) {
            // Encoders pipelined over pp_e stages of their own (Cornstarch's per-module stage
            // counts).
            if (share % (tp_e * pp_e * cp_e) != 0) continue;
            for (const LlmChoice& c : llm_choices(space, rest, experts)) {
              ParallelPlan p;
              p.placement = placement;
              int64_t first = 0;
              for (const ModuleSpec* enc : encoders) {
                ModuleLayout l = layout(tp_e, cp_e, pp_e, share / (tp_e * pp_e * cp_e), 1);
                l.ranks = RankSpan{first, share};
                first += share;
                p.modules.emplace_back(enc->name, l);
              }
              ModuleLayout l = layout(c.tp, c.cp, c.pp, c.dp, c.vpp, c.ep, c.etp);
              l.ranks = RankSpan{first, rest};
              p.modules.emplace_back(llm->name, l);
              p.schedule = c.vpp > 1 ? Schedule::kInterleaved1F1B : Schedule::kGraph1F1B;
              base_options(p, c);
              consider(p);
            }
          }
    }
  }
  return e;
}

std::vector<Refinement> refinements(const Scenario& s, const SearchSpace& space,
                                    const std::vector<const Candidate*>& bases, int64_t gpus,
                                    const std::set<std::string>& known) {
  const ClusterSpec cluster = cluster_with_devices(s.cluster, gpus);
  const bool has_encoders =
      std::any_of(s.model.modules.begin(), s.model.modules.end(),
                  [](const ModuleSpec& m) { return m.role == ModuleRole::kEncoder; });
  std::vector<Refinement> out;
  std::set<std::string> seen = known;
  for (std::size_t b = 0; b < bases.size(); ++b) {
    const ParallelPlan& base = bases[b]->plan;
    std::vector<std::pair<std::string, ParallelPlan>> variants;
    const auto with_policy = [](ParallelPlan p, MicrobatchPolicy policy) {
      p.microbatching = policy;
      return p;
    };
    for (MicrobatchPolicy policy : space.refine.microbatching)
      if (policy != base.microbatching)
        variants.emplace_back(enum_name(policy, kMicrobatching), with_policy(base, policy));
    if (space.refine.dip && has_encoders && base.placement == Placement::kHomogeneous &&
        base.layout.pp > 1 && base.schedule != Schedule::kDip && !base.fully_sharded) {
      ParallelPlan dip = base;
      dip.schedule = Schedule::kDip;
      variants.emplace_back("dip", dip);
      for (MicrobatchPolicy policy : space.refine.microbatching)
        if (policy != base.microbatching)
          variants.emplace_back("dip+" + enum_name(policy, kMicrobatching),
                                with_policy(dip, policy));
    }
    bool context = base.layout.cp > 1;
    for (const auto& [name, l] : base.modules) context = context || l.cp > 1;
    if (context)
      for (CpSplit split : space.refine.cp_splits)
        if (split != base.cp_split) {
          ParallelPlan p = base;
          p.cp_split = split;
          variants.emplace_back("cp " + enum_name(split, kCpSplits), p);
        }
    for (auto& [technique, plan] : variants) {
      Diagnostics diag;
      validate_plan(plan, s.model, s.workload, cluster, "", "", diag);
      if (!diag.ok()) continue;
      std::string key = candidate_key(gpus, plan);
      if (!seen.insert(key).second) continue;
      out.push_back({{std::move(key), gpus, std::move(plan)}, b, technique});
    }
  }
  return out;
}

std::vector<RankedCandidate> rank_candidates(const Scenario& s, std::vector<Candidate> candidates,
                                             int64_t iteration,
                                             std::map<std::string, int64_t>& rejected, int threads,
                                             const CostParams* cost, int64_t batches,
                                             const EstimateProgress& progress,
                                             std::optional<RankedCandidate>* leanest) {
  // Estimates are pure: each thread takes every n-th candidate; results are kept by index.
  std::vector<Estimate> estimates(candidates.size());
  std::mutex reporting;
  std::size_t done = 0;
  // Side by side, the estimates' Programs share the memory this machine has now (with a margin
  // for the rest of the process).
  MemoryGate gate(0.6 * available_memory_bytes());
  constexpr double kTrimAbove = 1e9;
  // One candidate's estimate. A plan whose parameter state alone cannot fit is dropped before
  // it is lowered: its Program would cost as much as a fitting plan's, only to be refused.
  auto priced = [&](const Candidate& c) {
    Scenario sized = s;
    sized.cluster = cluster_with_devices(s.cluster, c.gpus);
    const double capacity = memory_capacity_bytes(sized.cluster, world_size(c.plan, s.model));
    if (const RankMemory floor = mean_parameter_memory(c.plan, s.model); floor.total() > capacity) {
      Estimate e;
      e.failure = PlanFailure::kOutOfMemory;
      e.capacity_bytes = capacity;
      e.peak_memory = floor;
      e.reason = "the ranks' parameter state needs " + human_bytes(floor.total()) +
                 " each on average > " + human_bytes(capacity);
      return e;
    }
    const CostParams params = cost != nullptr ? *cost : default_cost_params(sized.cluster);
    const double footprint = lowering_footprint_bytes(c.plan, s.model, s.workload);
    gate.acquire(footprint);
    struct Release {
      MemoryGate& gate;
      double bytes;
      ~Release() { gate.release(bytes); }
    } release{gate, footprint};
    Estimate e = estimate(sized, c.plan, iteration, params);
    // A large Program's pages go back to the system at once, so that the next one has them
    // (glibc keeps freed memory in each thread's arena otherwise).
    if (footprint > kTrimAbove) malloc_trim(0);
    // More batches: the mean step and throughput over them; infeasible if any is.
    for (int64_t k = 1; k < batches && e.metrics.step_s > 0; ++k) {
      const Estimate more = estimate(sized, c.plan, iteration + k, params);
      if (more.metrics.step_s <= 0 || !more.feasible) return more;
      const auto w = static_cast<double>(k);
      e.metrics.step_s = (e.metrics.step_s * w + more.metrics.step_s) / (w + 1);
      e.metrics.samples_per_s =
          (e.metrics.samples_per_s * w + more.metrics.samples_per_s) / (w + 1);
      e.metrics.tokens_per_s = (e.metrics.tokens_per_s * w + more.metrics.tokens_per_s) / (w + 1);
    }
    return e;
  };
  // A failure on any thread (an internal error) stops them all and reaches the caller.
  std::exception_ptr failure;
  std::atomic<bool> failed = false;
  auto work = [&](std::size_t first, std::size_t stride) {
    try {
      for (std::size_t i = first; i < candidates.size() && !failed; i += stride) {
        estimates[i] = priced(candidates[i]);
        if (progress) {
          const std::lock_guard<std::mutex> lock(reporting);
          progress(++done, candidates.size());
        }
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(reporting);
      if (!failure) failure = std::current_exception();
      failed = true;
    }
  };
  const auto n = static_cast<std::size_t>(std::max(1, threads));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < n; ++t) pool.emplace_back(work, t, n);
  work(0, n);
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  std::vector<RankedCandidate> ranked;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    Estimate& e = estimates[i];
    if (e.metrics.step_s <= 0 || !e.feasible) {
      ++rejected[e.metrics.step_s <= 0 ? rejection_reason(e.reason) : "memory"];
      if (leanest != nullptr && e.failure == PlanFailure::kOutOfMemory &&
          (!*leanest || e.peak_memory.total() < (*leanest)->estimate.peak_memory.total()))
        *leanest = RankedCandidate{std::move(candidates[i]), std::move(e)};
      continue;
    }
    ranked.push_back({std::move(candidates[i]), std::move(e)});
  }
  sort_by_estimate(ranked);
  return ranked;
}

void sort_by_estimate(std::vector<RankedCandidate>& ranked) {
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const RankedCandidate& a, const RankedCandidate& b) {
                     if (a.estimate.metrics.step_s != b.estimate.metrics.step_s)
                       return a.estimate.metrics.step_s < b.estimate.metrics.step_s;
                     return a.candidate.key < b.candidate.key;
                   });
}

}  // namespace tessera

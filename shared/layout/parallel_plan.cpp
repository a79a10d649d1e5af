#include "shared/layout/parallel_plan.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "shared/base/check.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

const EnumTable<Placement> kPlacements = {{"homogeneous", Placement::kHomogeneous},
                                          {"colocated", Placement::kColocated},
                                          {"non_colocated", Placement::kNonColocated}};
const EnumTable<Schedule> kSchedules = {{"gpipe", Schedule::kGpipe},
                                        {"1f1b", Schedule::k1F1B},
                                        {"interleaved_1f1b", Schedule::kInterleaved1F1B},
                                        {"graph_1f1b", Schedule::kGraph1F1B},
                                        {"three_phase", Schedule::kThreePhase},
                                        {"dip", Schedule::kDip}};

const EnumTable<MicrobatchPolicy> kMicrobatching = {{"arrival", MicrobatchPolicy::kArrival},
                                                    {"sorted", MicrobatchPolicy::kSorted},
                                                    {"entrain", MicrobatchPolicy::kEntrain}};

const EnumTable<CpSplit> kCpSplits = {
    {"uniform", CpSplit::kUniform}, {"zigzag", CpSplit::kZigzag}, {"makespan", CpSplit::kMakespan}};
const EnumTable<StageSplit> kStageSplits = {{"frozen_aware", StageSplit::kFrozenAware},
                                            {"uniform", StageSplit::kUniform}};

const EnumTable<Recompute> kRecomputes = {{"none", Recompute::kNone},
                                          {"selective", Recompute::kSelective},
                                          {"full", Recompute::kFull},
                                          {"per_op", Recompute::kPerOp}};
const EnumTable<RecomputeModule> kRecomputeModules = {{"core_attn", kRecomputeCoreAttn},
                                                      {"layernorm", kRecomputeLayernorm},
                                                      {"mla_up_proj", kRecomputeMlaUpProj},
                                                      {"moe_act", kRecomputeMoeAct},
                                                      {"mlp", kRecomputeMlp},
                                                      {"moe", kRecomputeMoe},
                                                      {"shared_experts", kRecomputeSharedExperts}};
const EnumTable<IndivisibleHeads> kIndivisibleHeads = {{"refuse", IndivisibleHeads::kRefuse},
                                                       {"pad", IndivisibleHeads::kPad},
                                                       {"replicate", IndivisibleHeads::kReplicate}};
const EnumTable<EncoderDataParallel> kEncoderDataParallel = {
    {"samples", EncoderDataParallel::kSamples}, {"media", EncoderDataParallel::kMedia}};
const EnumTable<Fp8Recipe> kFp8Recipes = {{"none", Fp8Recipe::kNone},
                                          {"delayed", Fp8Recipe::kDelayed},
                                          {"current", Fp8Recipe::kCurrent},
                                          {"blockwise", Fp8Recipe::kBlockwise}};
const EnumTable<MoeDispatcher> kMoeDispatchers = {{"alltoall", MoeDispatcher::kAllToAll},
                                                  {"deepep", MoeDispatcher::kDeepEp},
                                                  {"hybridep", MoeDispatcher::kHybridEp}};
const EnumTable<Framework> kFrameworks = {{"megatron", Framework::kMegatron},
                                          {"pytorch", Framework::kPytorch}};

namespace {

ModuleLayout read_layout(const Json& json, const std::string& file, const std::string& path,
                         Diagnostics& diag) {
  ModuleLayout l;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return l;
  // Short names, with Megatron-LM's argument names accepted as aliases.
  struct Degree {
    std::string_view name, megatron_name;
    int64_t* field;
  };
  const Degree degrees[] = {{"tp", "tensor_model_parallel_size", &l.tp},
                            {"cp", "context_parallel_size", &l.cp},
                            {"pp", "pipeline_model_parallel_size", &l.pp},
                            {"dp", "data_parallel_size", &l.dp},
                            {"ep", "expert_model_parallel_size", &l.ep},
                            {"etp", "expert_tensor_parallel_size", &l.etp},
                            {"vpp", "virtual_pipeline_model_parallel_size", &l.vpp}};
  for (const Degree& d : degrees)
    if (r.optional({d.name, d.megatron_name}, *d.field)) r.check_positive(r.found_name(), *d.field);
  // Past any machine, and the rank arithmetic downstream (products of degrees) would overflow.
  constexpr double kMaxRanks = double(int64_t{1} << 24);
  if (static_cast<double>(l.tp) * l.cp * l.pp * l.dp > kMaxRanks)
    diag.error(file, path, "tp*cp*pp*dp is over " + std::to_string(int64_t{1} << 24) + " ranks");
  if (static_cast<double>(l.pp) * l.vpp > kMaxRanks)
    diag.error(file, path, "pp*vpp is over " + std::to_string(int64_t{1} << 24) + " stages");
  if (const Json* span = r.find("ranks")) {
    std::vector<int64_t> bounds;
    if (read_value(*span, file, r.path_of("ranks"), bounds, diag)) {
      if (bounds.size() != 2 || bounds[0] < 0 || bounds[1] <= bounds[0])
        r.error("ranks", "expected [first, end) with 0 <= first < end");
      else
        l.ranks = RankSpan{bounds[0], bounds[1] - bounds[0]};
    }
  }
  if (r.optional("stage_layers", l.stage_layers))
    for (std::size_t i = 0; i < l.stage_layers.size(); ++i)
      if (l.stage_layers[i] < 1)
        diag.error(file, index_path(r.path_of("stage_layers"), i),
                   "a stage needs at least 1 layer");
  r.finish();
  return l;
}

std::string layout_path(const ParallelPlan& plan, const std::string& path,
                        const std::string& name) {
  return plan.placement == Placement::kHomogeneous ? join_path(path, "layout")
                                                   : join_path(join_path(path, "modules"), name);
}

// The module that owns `m`'s ranks in a non-homogeneous plan: itself, or (for a projector
// without its own entry) the module that feeds it.
const PlacedModule* host_of(const std::vector<PlacedModule>& placed, const std::string& name) {
  for (const PlacedModule& p : placed)
    if (p.module->name == name) return p.host.empty() ? &p : host_of(placed, p.host);
  return nullptr;
}

}  // namespace

ParallelPlan read_plan(const Json& json, const std::string& file, const std::string& path,
                       Diagnostics& diag) {
  ParallelPlan p;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return p;
  r.required_enum("placement", p.placement, kPlacements);
  const bool has_layout = r.has("layout");
  const bool has_modules = r.has("modules");
  if (p.placement == Placement::kHomogeneous) {
    if (has_modules) r.error("modules", "a homogeneous plan has one 'layout' for the whole model");
    if (has_layout)
      p.layout = read_layout(*r.find("layout"), file, r.path_of("layout"), diag);
    else
      r.missing("layout");
  } else {
    if (has_layout)
      r.error("layout", "a colocated or non_colocated plan gives 'modules', one layout each");
    if (const Json* modules = r.find("modules")) {
      if (!modules->is_object() || modules->empty()) {
        r.error("modules", "expected an object {module name: layout}");
      } else {
        for (const auto& item : modules->items())
          p.modules.emplace_back(
              item.key(),
              read_layout(item.value(), file, join_path(r.path_of("modules"), item.key()), diag));
      }
    } else {
      r.missing("modules");
    }
  }
  if (r.optional("micro_batch_size", p.micro_batch_size))
    r.check_positive("micro_batch_size", p.micro_batch_size);
  if (r.optional({"num_micro_batches", "num_microbatches"}, p.num_micro_batches))
    r.check_positive(r.found_name(), p.num_micro_batches);
  r.optional_enum("schedule", p.schedule, kSchedules);
  r.optional_enum("microbatching", p.microbatching, kMicrobatching);
  r.optional_enum("cp_split", p.cp_split, kCpSplits);
  r.optional_enum("stage_split", p.stage_split, kStageSplits);
  if (const Json* v = r.find({"recompute", "recompute_granularity"}))
    read_enum(*v, file, r.path_of(r.found_name()), p.recompute, kRecomputes, diag);
  if (r.optional({"recompute_layers", "recompute_num_layers"}, p.recompute_layers))
    r.check_positive(r.found_name(), p.recompute_layers);
  if (const Json* v = r.find("recompute_modules")) {
    std::string names;
    for (const std::string& n : enum_names(kRecomputeModules))
      names += (names.empty() ? "" : ", ") + n;
    if (p.recompute != Recompute::kSelective) {
      r.error("recompute_modules",
              "needs recompute selective (it says what selective recomputation runs again)");
    } else if (!v->is_array() || v->empty()) {
      r.error("recompute_modules", "expected a non-empty array of " + names);
    } else {
      p.recompute_modules = 0;
      for (std::size_t i = 0; i < v->size(); ++i) {
        RecomputeModule m{};
        if (read_enum((*v)[i], file, index_path(r.path_of("recompute_modules"), i), m,
                      kRecomputeModules, diag))
          p.recompute_modules |= m;
      }
    }
  }
  r.optional("sequence_parallel", p.sequence_parallel);
  r.optional("encoder_sequence_parallel", p.encoder_sequence_parallel);
  r.optional({"distributed_optimizer", "use_distributed_optimizer"}, p.distributed_optimizer);
  r.optional({"flash_attention", "use_flash_attn"}, p.flash_attention);
  r.optional("fused_kernels", p.fused_kernels);
  r.optional_enum("framework", p.framework, kFrameworks);
  r.optional("tp_comm_overlap", p.tp_comm_overlap);
  r.optional({"tp_backward_overlap", "async_tensor_model_parallel_allreduce"},
             p.tp_backward_overlap);
  r.optional({"pipeline_scatter_gather", "scatter_gather_tensors_in_pipeline"},
             p.pipeline_scatter_gather);
  r.optional("pad_to_longest", p.pad_to_longest);
  r.optional("overlap_grad_reduce", p.overlap_grad_reduce);
  r.optional("overlap_param_gather", p.overlap_param_gather);
  r.optional({"fully_sharded", "fsdp"}, p.fully_sharded);
  if (const Json* v = r.find({"fp8", "fp8_recipe"}))
    read_enum(*v, file, r.path_of(r.found_name()), p.fp8, kFp8Recipes, diag);
  r.optional("fp8_param_gather", p.fp8_param_gather);
  if (const Json* v = r.find({"moe_dispatcher"}))
    read_enum(*v, file, r.path_of(r.found_name()), p.moe_dispatcher, kMoeDispatchers, diag);
  r.optional("moe_a2a_overlap", p.moe_a2a_overlap);
  r.optional("moe_fp8_dispatch", p.moe_fp8_dispatch);
  r.optional("moe_permute_fusion", p.moe_permute_fusion);
  r.optional({"grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32"}, p.grad_reduce_in_fp32);
  r.optional_enum("indivisible_heads", p.indivisible_heads, kIndivisibleHeads);
  r.optional_enum("encoder_data_parallel", p.encoder_data_parallel, kEncoderDataParallel);
  if (r.optional("grad_bucket_mb", p.grad_bucket_mb))
    r.check_positive("grad_bucket_mb", p.grad_bucket_mb);
  r.finish();
  return p;
}

int64_t reduced_gradient_bytes(const ParallelPlan& plan, DType dtype) {
  return plan.grad_reduce_in_fp32 ? 4 : dtype_bytes(dtype);
}

int64_t kept_gradient_bytes(const ParallelPlan& plan, DType dtype) {
  return plan.framework == Framework::kMegatron && !plan.fully_sharded
             ? reduced_gradient_bytes(plan, dtype)
             : 4;
}

Json to_json(const ModuleLayout& l) {
  Json j{{"tp", l.tp}, {"cp", l.cp}, {"pp", l.pp}, {"dp", l.dp}, {"ep", l.ep}, {"vpp", l.vpp}};
  if (l.etp > 0) j["etp"] = l.etp;
  if (l.ranks) j["ranks"] = {l.ranks->first, l.ranks->first + l.ranks->count};
  if (!l.stage_layers.empty()) j["stage_layers"] = l.stage_layers;
  return j;
}

Json to_json(const ParallelPlan& p) {
  Json j;
  j["placement"] = enum_name(p.placement, kPlacements);
  if (p.placement == Placement::kHomogeneous) {
    j["layout"] = to_json(p.layout);
  } else {
    Json modules = Json::object();
    for (const auto& [name, layout] : p.modules) modules[name] = to_json(layout);
    j["modules"] = modules;
  }
  j["micro_batch_size"] = p.micro_batch_size;
  if (p.num_micro_batches > 0) j["num_micro_batches"] = p.num_micro_batches;
  j["schedule"] = enum_name(p.schedule, kSchedules);
  j["microbatching"] = enum_name(p.microbatching, kMicrobatching);
  j["cp_split"] = enum_name(p.cp_split, kCpSplits);
  j["stage_split"] = enum_name(p.stage_split, kStageSplits);
  j["recompute"] = enum_name(p.recompute, kRecomputes);
  if (p.recompute_layers > 0) j["recompute_layers"] = p.recompute_layers;
  if (p.recompute == Recompute::kSelective && p.recompute_modules != kRecomputeCoreAttn) {
    Json modules = Json::array();
    for (const auto& [name, m] : kRecomputeModules)
      if ((p.recompute_modules & m) != 0) modules.push_back(name);
    j["recompute_modules"] = modules;
  }
  j["sequence_parallel"] = p.sequence_parallel;
  if (p.encoder_sequence_parallel) j["encoder_sequence_parallel"] = true;
  j["distributed_optimizer"] = p.distributed_optimizer;
  if (!p.flash_attention) j["flash_attention"] = false;
  if (!p.fused_kernels) j["fused_kernels"] = false;
  if (p.framework != Framework::kMegatron) j["framework"] = enum_name(p.framework, kFrameworks);
  if (p.tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (!p.tp_backward_overlap) j["tp_backward_overlap"] = false;
  if (!p.pipeline_scatter_gather) j["pipeline_scatter_gather"] = false;
  if (p.pad_to_longest) j["pad_to_longest"] = true;
  if (p.overlap_grad_reduce) j["overlap_grad_reduce"] = true;
  if (p.overlap_param_gather) j["overlap_param_gather"] = true;
  if (p.fully_sharded) j["fully_sharded"] = true;
  if (p.fp8 != Fp8Recipe::kNone) j["fp8"] = enum_name(p.fp8, kFp8Recipes);
  if (p.fp8_param_gather) j["fp8_param_gather"] = true;
  if (p.moe_dispatcher != MoeDispatcher::kAllToAll)
    j["moe_dispatcher"] = enum_name(p.moe_dispatcher, kMoeDispatchers);
  if (p.moe_a2a_overlap) j["moe_a2a_overlap"] = true;
  if (p.moe_fp8_dispatch) j["moe_fp8_dispatch"] = true;
  if (!p.moe_permute_fusion) j["moe_permute_fusion"] = false;
  if (p.overlap_grad_reduce || p.fully_sharded) j["grad_bucket_mb"] = p.grad_bucket_mb;
  if (p.grad_reduce_in_fp32) j["grad_reduce_in_fp32"] = true;
  if (p.indivisible_heads != IndivisibleHeads::kRefuse)
    j["indivisible_heads"] = enum_name(p.indivisible_heads, kIndivisibleHeads);
  if (p.encoder_data_parallel != EncoderDataParallel::kSamples)
    j["encoder_data_parallel"] = enum_name(p.encoder_data_parallel, kEncoderDataParallel);
  return j;
}

namespace {

// The grid `module` runs on: the one layout (homogeneous), its own, or that of the module that
// feeds it (a module without an entry runs with its input's).
const ModuleLayout& module_grid(const ParallelPlan& plan, const ModelSpec& model,
                                const ModuleSpec& module) {
  static const ModuleLayout kAlone;
  if (plan.placement == Placement::kHomogeneous) return plan.layout;
  for (const auto& [name, layout] : plan.modules)
    if (name == module.name) return layout;
  const ModuleSpec* input = module.inputs.empty() ? nullptr : find_module(model, module.inputs[0]);
  return input != nullptr ? module_grid(plan, model, *input) : kAlone;
}

}  // namespace

int64_t module_tp(const ParallelPlan& plan, const ModelSpec& model, const ModuleSpec& module) {
  return module_grid(plan, model, module).tp;
}

bool media_parallel(const ParallelPlan& plan, const ModelSpec& model, const ModuleSpec& module) {
  if (plan.encoder_data_parallel != EncoderDataParallel::kMedia ||
      plan.placement != Placement::kColocated || module.role == ModuleRole::kLlm ||
      module.role == ModuleRole::kGenerator)
    return false;
  const ModuleSpec* llm = find_llm(model);
  return llm != nullptr && module_grid(plan, model, module).dp > module_grid(plan, model, *llm).dp;
}

bool sequence_parallel_for(const ParallelPlan& plan, const ModuleSpec& module) {
  return plan.sequence_parallel &&
         (module.role == ModuleRole::kLlm ||
          (plan.encoder_sequence_parallel && module.role == ModuleRole::kEncoder));
}

bool replicated_over_tp(const ParallelPlan& plan, const ModelSpec& model,
                        const ModuleSpec& module) {
  return plan.indivisible_heads == IndivisibleHeads::kReplicate &&
         plan.placement == Placement::kHomogeneous && module.role != ModuleRole::kLlm &&
         module.role != ModuleRole::kGenerator && module.transformer &&
         !accepts_tp(*module.transformer, module_tp(plan, model, module));
}

ModelSpec heads_padded(const ModelSpec& model, const ParallelPlan& plan) {
  ModelSpec padded = model;
  if (plan.indivisible_heads != IndivisibleHeads::kPad) return padded;
  for (ModuleSpec& m : padded.modules)
    if (m.transformer) {
      const int64_t tp = module_tp(plan, model, m);
      if (!accepts_tp(*m.transformer, tp)) *m.transformer = pad_heads(*m.transformer, tp);
    }
  return padded;
}

std::vector<PlacedModule> place_modules(const ParallelPlan& plan, const ModelSpec& model,
                                        const std::string& file, const std::string& path,
                                        Diagnostics& diag) {
  std::vector<PlacedModule> placed;
  if (plan.placement == Placement::kHomogeneous) {
    for (const ModuleSpec& m : model.modules) placed.push_back({&m, plan.layout, 0, ""});
    return placed;
  }
  std::vector<std::string> names;
  for (const ModuleSpec& m : model.modules) names.push_back(m.name);
  for (const auto& [name, layout] : plan.modules) {
    if (find_module(model, name) == nullptr) {
      std::string message = "no module '" + name + "' in model " + model.name;
      const std::string guess = closest_match(name, names);
      if (!guess.empty()) message += " (did you mean '" + guess + "'?)";
      diag.error(file, join_path(join_path(path, "modules"), name), message);
    }
  }
  int64_t next_rank = 0;  // non_colocated default spans: consecutive in plan order
  for (const auto& [name, layout] : plan.modules) {
    const ModuleSpec* m = find_module(model, name);
    if (m == nullptr) continue;
    int64_t first = 0;
    if (plan.placement == Placement::kNonColocated) {
      first = layout.ranks ? layout.ranks->first : next_rank;
      next_rank = first + layout.size();
    }
    placed.push_back({m, layout, first, ""});
  }
  // Modules without an entry: a projector borrows its producer's ranks (its last stage), a
  // generator the LLM's; others are an error.
  for (const ModuleSpec* m : topological_order(model)) {
    const bool has_entry = std::any_of(plan.modules.begin(), plan.modules.end(),
                                       [&](const auto& e) { return e.first == m->name; });
    if (has_entry) continue;
    if ((m->role == ModuleRole::kProjector || m->role == ModuleRole::kGenerator) &&
        !m->inputs.empty()) {
      const PlacedModule* host = host_of(placed, m->inputs.front());
      if (host != nullptr) {
        placed.push_back({m, host->layout, host->first_rank, host->module->name});
        continue;
      }
    }
    diag.error(file, join_path(path, "modules"),
               "module '" + m->name +
                   "' has no layout (only a projector or generator may run with its input)");
  }
  return placed;
}

bool stage_split_pending(const ParallelPlan& plan, const ModuleLayout& layout,
                         const ModuleSpec& module) {
  return plan.stage_split == StageSplit::kFrozenAware && layout.stage_layers.empty() &&
         layout.pp * layout.vpp > 1 && module.transformer.has_value();
}

bool stage_split_resolved(const ParallelPlan& plan, const ModelSpec& model) {
  if (plan.placement == Placement::kHomogeneous) {
    const ModuleSpec* llm = find_llm(model);
    return llm == nullptr || !stage_split_pending(plan, plan.layout, *llm);
  }
  for (const auto& [name, layout] : plan.modules)
    if (const ModuleSpec* m = find_module(model, name); m && stage_split_pending(plan, layout, *m))
      return false;
  return true;
}

std::vector<int64_t> even_stage_layers(int64_t layers, int64_t chunks) {
  std::vector<int64_t> out;
  for (int64_t k = 0; k < chunks; ++k)
    out.push_back(layers / chunks + (k < layers % chunks ? 1 : 0));
  return out;
}

bool splits_evenly(const ParallelPlan& plan, const ModelSpec& model) {
  const auto even = [](const ModuleLayout& l, const ModuleSpec* m) {
    return l.stage_layers.empty() || m == nullptr || !m->transformer ||
           l.stage_layers == even_stage_layers(m->transformer->layers, l.pp * l.vpp);
  };
  if (plan.placement == Placement::kHomogeneous) return even(plan.layout, find_llm(model));
  return std::all_of(plan.modules.begin(), plan.modules.end(), [&](const auto& named) {
    return even(named.second, find_module(model, named.first));
  });
}

int64_t world_size(const ParallelPlan& plan, const ModelSpec& model) {
  if (plan.placement == Placement::kHomogeneous) return plan.layout.size();
  Diagnostics ignored;
  int64_t world = 0;
  for (const PlacedModule& p : place_modules(plan, model, "", "", ignored))
    if (p.host.empty()) world = std::max(world, p.first_rank + p.layout.size());
  return world;
}

int64_t micro_batches(const ParallelPlan& plan, const ModelSpec& model, const WorkloadSpec& w) {
  if (plan.num_micro_batches > 0) return plan.num_micro_batches;
  int64_t dp = plan.layout.dp;
  if (plan.placement != Placement::kHomogeneous) {
    const ModuleSpec* llm = find_llm(model);
    for (const auto& [name, layout] : plan.modules)
      if (llm != nullptr && name == llm->name) dp = layout.dp;
  }
  return std::max<int64_t>(1, w.global_batch / (plan.micro_batch_size * dp));
}

void validate_plan(const ParallelPlan& plan, const ModelSpec& model, const WorkloadSpec& w,
                   const ClusterSpec& cluster, const std::string& file, const std::string& path,
                   Diagnostics& diag) {
  const std::vector<PlacedModule> placed = place_modules(plan, model, file, path, diag);
  const ModuleSpec* llm = find_llm(model);
  auto err = [&](const PlacedModule& p, std::string_view key, const std::string& message) {
    diag.error(file, join_path(layout_path(plan, path, p.module->name), key), message);
  };
  auto top = [&](std::string_view key, const std::string& message) {
    diag.error(file, join_path(path, key), message);
  };
  const std::string placement = enum_name(plan.placement, kPlacements);

  if (plan.indivisible_heads == IndivisibleHeads::kReplicate &&
      plan.placement != Placement::kHomogeneous)
    top("indivisible_heads",
        "replicate runs a homogeneous plan's encoders whole on every TP rank; in a " + placement +
            " plan each module chooses its own TP");
  if (plan.encoder_data_parallel == EncoderDataParallel::kMedia &&
      plan.placement != Placement::kColocated)
    top("encoder_data_parallel",
        "media deals items to the encoder replicas that share a colocated LLM replica's batch; "
        "a " +
            placement + " plan's encoders take whole samples");
  // Per-module grid rules.
  for (const PlacedModule& p : placed) {
    if (!p.host.empty()) continue;  // borrowed layout, checked with its host
    // Homogeneous: one layout, checked once (against every module below).
    if (plan.placement == Placement::kHomogeneous && p.module != llm && llm != nullptr) continue;
    const ModuleLayout& l = p.layout;
    for (const PlacedModule& q : placed) {
      // Homogeneous: every module shares the one layout, so each must accept its TP.
      if (plan.placement != Placement::kHomogeneous && q.module != p.module &&
          q.host != p.module->name)
        continue;
      const TransformerArch* a = q.module->transformer ? &*q.module->transformer : nullptr;
      if (a == nullptr || q.module->role == ModuleRole::kProjector) continue;
      const std::string who = q.module->name;
      // Heads TP does not divide: padded (then its key/value heads must still split), run whole
      // on every TP rank, or refused.
      const bool padded = plan.indivisible_heads == IndivisibleHeads::kPad;
      if (!replicated_over_tp(plan, model, *q.module))
        if (const std::string why = tp_refusal(padded ? pad_heads(*a, l.tp) : *a, who, l.tp);
            !why.empty())
          err(p, "tp", why);
      if (l.ep > 1 && a->experts == 0 && q.module == p.module)
        err(p, "ep", "ep=" + std::to_string(l.ep) + " but " + who + " has no experts");
      if (l.expert_tp() != l.tp && a->experts == 0 && q.module == p.module)
        err(p, "etp", "etp=" + std::to_string(l.etp) + " but " + who + " has no experts");
      if (a->experts > 0 && a->experts % l.ep != 0)
        err(p, "ep",
            std::to_string(l.ep) + " does not divide " + who +
                " experts=" + std::to_string(a->experts));
    }
    if (l.expert_tp() == l.tp) {
      if ((l.cp * l.dp) % l.ep != 0)
        err(p, "ep",
            std::to_string(l.ep) + " does not divide cp*dp=" + std::to_string(l.cp * l.dp));
    } else if (l.etp != 1) {
      err(p, "etp",
          "expert tensor parallelism is 1 or tp=" + std::to_string(l.tp) + ", not " +
              std::to_string(l.etp));
    } else {
      if ((l.tp * l.cp * l.dp) % l.ep != 0)
        err(p, "ep",
            std::to_string(l.ep) + " does not divide tp*cp*dp=" +
                std::to_string(l.tp * l.cp * l.dp) + " (etp 1 carves EP out of TP too)");
      if (!plan.sequence_parallel)
        err(p, "etp",
            "etp 1 below tp=" + std::to_string(l.tp) +
                " needs sequence_parallel (each TP rank routes its own share of the tokens)");
    }
    // Pipeline: the LLM's layers (homogeneous: the LLM carries the pipeline).
    const ModuleSpec* staged = plan.placement == Placement::kHomogeneous ? llm : p.module;
    if (staged != nullptr && staged->transformer) {
      const int64_t layers = staged->transformer->layers;
      const int64_t chunks = l.pp * l.vpp;
      if (layers < chunks)
        err(p, "pp",
            staged->name + " has " + std::to_string(layers) +
                " layers, fewer than pp*vpp=" + std::to_string(chunks));
      if (!l.stage_layers.empty()) {
        if (static_cast<int64_t>(l.stage_layers.size()) != chunks)
          err(p, "stage_layers",
              "has " + std::to_string(l.stage_layers.size()) +
                  " entries, expected pp*vpp=" + std::to_string(chunks));
        const int64_t sum =
            std::accumulate(l.stage_layers.begin(), l.stage_layers.end(), int64_t{0});
        if (sum != layers)
          err(p, "stage_layers",
              "sums to " + std::to_string(sum) + ", " + staged->name + " has " +
                  std::to_string(layers) + " layers");
      }
    } else if (l.pp > 1 || !l.stage_layers.empty()) {
      err(p, "pp", p.module->name + " has no layer stack to pipeline");
    }
    if (l.vpp > 1 && l.pp == 1) err(p, "vpp", "virtual pipeline chunks need pp > 1");
    if (l.vpp > 1 && plan.schedule != Schedule::kInterleaved1F1B && plan.schedule != Schedule::kDip)
      err(p, "vpp", "vpp > 1 needs schedule interleaved_1f1b or dip");
    // Context parallelism splits the sequence into cp pieces (2·cp for zig-zag).
    const int64_t pieces = plan.cp_split == CpSplit::kZigzag ? 2 * l.cp : l.cp;
    if (l.cp > 1 && w.max_seq_len > 0 && w.max_seq_len % pieces != 0)
      err(p, "cp",
          "max_seq_len=" + std::to_string(w.max_seq_len) + " is not divisible into " +
              std::to_string(pieces) + " pieces");
    // An encoder dealt media items may have more replicas than the step has samples.
    if (w.global_batch > 0 && w.global_batch % l.dp != 0 && !media_parallel(plan, model, *p.module))
      err(p, "dp",
          std::to_string(l.dp) + " does not divide global_batch=" + std::to_string(w.global_batch));
    if (p.layout.ranks && plan.placement != Placement::kNonColocated)
      err(p, "ranks", "only non_colocated modules have their own rank span");
    if (p.layout.ranks && p.layout.ranks->count != l.size())
      err(p, "ranks",
          "span has " + std::to_string(p.layout.ranks->count) +
              " ranks, tp*cp*pp*dp=" + std::to_string(l.size()));
  }
  if (placed.empty()) return;

  // World: spans coincide (colocated) or tile [0, world) (non_colocated).
  int64_t world = 0;
  std::vector<const PlacedModule*> owners;
  for (const PlacedModule& p : placed)
    if (p.host.empty()) owners.push_back(&p);
  if (plan.placement == Placement::kHomogeneous) {
    world = plan.layout.size();
  } else if (plan.placement == Placement::kColocated) {
    for (const PlacedModule* p : owners) world = std::max(world, p->layout.size());
    for (const PlacedModule* p : owners)
      if (p->layout.size() != world)
        err(*p, "dp",
            "colocated modules span all ranks: tp*cp*pp*dp=" + std::to_string(p->layout.size()) +
                ", but another module spans " + std::to_string(world));
  } else {
    std::vector<const PlacedModule*> sorted = owners;
    std::sort(sorted.begin(), sorted.end(),
              [](auto* a, auto* b) { return a->first_rank < b->first_rank; });
    int64_t expected = 0;
    for (const PlacedModule* p : sorted) {
      if (p->first_rank != expected)
        err(*p, "ranks",
            p->first_rank < expected
                ? "span [" + std::to_string(p->first_rank) + ", " +
                      std::to_string(p->first_rank + p->layout.size()) + ") overlaps another module"
                : "ranks [" + std::to_string(expected) + ", " + std::to_string(p->first_rank) +
                      ") belong to no module");
      expected = std::max(expected, p->first_rank + p->layout.size());
    }
    world = expected;
  }
  const int64_t devices = device_count(cluster);
  if (devices > 0 && world != devices)
    top(plan.placement == Placement::kHomogeneous ? "layout" : "modules",
        "plan uses " + std::to_string(world) + " ranks, cluster " + cluster.name + " has " +
            std::to_string(devices) + " devices");

  // Batch: global_batch = micro_batch_size · micro-batches · LLM dp.
  const PlacedModule* llm_place = nullptr;
  for (const PlacedModule& p : placed)
    if (p.module == llm) llm_place = p.host.empty() ? &p : host_of(placed, p.module->name);
  if (llm_place != nullptr && w.global_batch > 0) {
    const int64_t per_step = plan.micro_batch_size * llm_place->layout.dp;
    if (plan.num_micro_batches > 0) {
      if (per_step * plan.num_micro_batches != w.global_batch)
        top("num_micro_batches",
            "micro_batch_size*num_micro_batches*dp = " + std::to_string(plan.micro_batch_size) +
                "*" + std::to_string(plan.num_micro_batches) + "*" +
                std::to_string(llm_place->layout.dp) +
                " != global_batch=" + std::to_string(w.global_batch));
    } else if (w.global_batch % per_step != 0) {
      top("micro_batch_size",
          "micro_batch_size*dp = " + std::to_string(per_step) +
              " does not divide global_batch=" + std::to_string(w.global_batch));
    }
    const int64_t m = plan.num_micro_batches > 0
                          ? plan.num_micro_batches
                          : std::max<int64_t>(1, w.global_batch / std::max<int64_t>(1, per_step));
    if (plan.schedule == Schedule::kInterleaved1F1B && m % llm_place->layout.pp != 0)
      top("num_micro_batches", "interleaved 1F1B needs micro-batches (" + std::to_string(m) +
                                   ") divisible by pp=" + std::to_string(llm_place->layout.pp));
  }

  // Boundaries: producer and consumer DP (leader counts) must divide one another.
  for (const PlacedModule& p : placed) {
    for (const std::string& in : p.module->inputs) {
      const PlacedModule* producer = host_of(placed, in);
      const PlacedModule* consumer = host_of(placed, p.module->name);
      if (producer == nullptr || consumer == nullptr || producer == consumer) continue;
      const int64_t a = producer->layout.dp, b = consumer->layout.dp;
      if (a % b != 0 && b % a != 0)
        err(*consumer, "dp",
            "boundary " + producer->module->name + " -> " + consumer->module->name + ": dp " +
                std::to_string(a) + " and " + std::to_string(b) + " must divide one another");
    }
  }

  // Schedules by placement.
  const bool pipelined = llm_place != nullptr && llm_place->layout.pp > 1;
  if (plan.schedule == Schedule::kThreePhase && plan.placement != Placement::kColocated)
    top("schedule", "three_phase is the colocated schedule; placement is " + placement);
  if (plan.schedule == Schedule::kGraph1F1B && plan.placement != Placement::kNonColocated)
    top("schedule", "graph_1f1b is the non_colocated schedule; placement is " + placement);
  if (plan.schedule == Schedule::kDip && plan.placement != Placement::kHomogeneous)
    top("schedule",
        "dip interleaves encoder segments onto the LLM's pipeline ranks; it needs "
        "placement homogeneous, not " +
            placement);
  if (plan.schedule == Schedule::kDip && !pipelined)
    top("schedule", "dip needs the LLM to have pp > 1 (its segments share the pipeline's stages)");
  if (plan.schedule == Schedule::kInterleaved1F1B && !pipelined)
    top("schedule", "interleaved_1f1b needs the LLM to have pp > 1");
  if (plan.sequence_parallel && plan.placement == Placement::kHomogeneous && plan.layout.tp == 1)
    top("sequence_parallel", "needs tp > 1");
  if (plan.encoder_sequence_parallel && !plan.sequence_parallel)
    top("encoder_sequence_parallel", "needs sequence_parallel");
  if (plan.recompute_layers > 0 && plan.recompute != Recompute::kFull)
    top("recompute_layers",
        "needs recompute full (it limits which layers full recomputation runs again)");
  if (plan.recompute == Recompute::kSelective) {
    // Each submodule named must exist in some module of the model.
    bool latent = false, experts = false, shared = false, dense = false;
    for (const ModuleSpec& m : model.modules)
      if (const auto& a = m.transformer; a && a->layers > 0) {
        latent |= a->kv_lora_rank > 0;
        experts |= a->experts > 0;
        shared |= a->experts > 0 && a->shared_expert_ffn > 0;
        dense |= moe_layers(*a, 0, a->layers) < a->layers;
      }
    const std::pair<RecomputeModule, bool> present[] = {{kRecomputeMlaUpProj, latent},
                                                        {kRecomputeMoeAct, experts},
                                                        {kRecomputeMoe, experts},
                                                        {kRecomputeSharedExperts, shared},
                                                        {kRecomputeMlp, dense}};
    for (const auto& [m, there] : present)
      if ((plan.recompute_modules & m) != 0 && !there)
        top("recompute_modules", enum_name(m, kRecomputeModules) + ": the model has no " +
                                     (m == kRecomputeMlaUpProj       ? "multi-head latent attention"
                                      : m == kRecomputeSharedExperts ? "shared expert"
                                      : m == kRecomputeMlp           ? "dense layer"
                                                                     : "MoE layer"));
  }
  if (plan.tp_comm_overlap && !plan.sequence_parallel)
    top("tp_comm_overlap",
        "needs sequence_parallel (it overlaps its all-gathers and reduce-scatters)");
  if (plan.pad_to_longest && llm_place != nullptr && llm_place->layout.cp > 1)
    top("pad_to_longest",
        "pads micro-batches of whole samples; context parallelism splits one packed sequence "
        "(cp=" +
            std::to_string(llm_place->layout.cp) + ")");
  if (plan.overlap_param_gather && !plan.distributed_optimizer)
    top("overlap_param_gather",
        "needs distributed_optimizer (it overlaps the all-gather of the parameters each rank's "
        "optimizer slice updated)");
  else if (plan.overlap_param_gather && !plan.overlap_grad_reduce)
    top("overlap_param_gather", "needs overlap_grad_reduce (it gathers that option's buckets)");
  if (plan.fp8 != Fp8Recipe::kNone) {
    if (model.dtype != DType::kBf16 && model.dtype != DType::kFp16)
      top("fp8", "quantizes a 16-bit model's GEMMs; the model's dtype is " +
                     enum_name(model.dtype, kDTypes));
    if (cluster.device.peak_flops.count(DType::kFp8) == 0)
      top("fp8", "the device " + cluster.device.name + " states no fp8 peak");
  }
  if (plan.fp8_param_gather && plan.fp8 == Fp8Recipe::kNone)
    top("fp8_param_gather", "needs fp8 (the weights it keeps and gathers are FP8)");
  else if (plan.fp8_param_gather && !plan.distributed_optimizer)
    top("fp8_param_gather", "needs distributed_optimizer (it gathers the optimizer's slices)");
  if (plan.moe_fp8_dispatch && plan.fp8 == Fp8Recipe::kNone)
    top("moe_fp8_dispatch", "needs fp8 (the experts' FP8 GEMMs take what it sends)");
  if (plan.fully_sharded) {
    if (!plan.distributed_optimizer)
      top("fully_sharded", "needs distributed_optimizer (ZeRO-3 shards the optimizer state too)");
    if (plan.overlap_param_gather)
      top("fully_sharded",
          "gathers each unit's parameters before it runs; overlap_param_gather (a gather after "
          "the optimizer step) does not apply");
    if (plan.schedule == Schedule::kDip)
      top("fully_sharded",
          "with schedule dip, each replica orders its steps and cuts its media by its own batch, "
          "so the replicas' per-unit gathers and reductions would not line up");
    if (plan.microbatching == MicrobatchPolicy::kEntrain)
      top("fully_sharded",
          "with microbatching entrain, an encoder micro-batch's backward comes after a different "
          "LLM micro-batch on each replica, so the replicas' per-unit gathers and reductions "
          "would not line up");
  }
}

}  // namespace tessera

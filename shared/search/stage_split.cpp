#include "shared/search/stage_split.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "shared/base/check.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/lowering/compute_flags.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

std::vector<int64_t> linear_partition(const std::vector<double>& costs, int64_t stages,
                                      double first_extra, double last_extra) {
  const auto n = static_cast<int64_t>(costs.size());
  TESSERA_CHECK(stages >= 1 && stages <= n, "cannot cut " + std::to_string(n) + " layers into " +
                                                std::to_string(stages) + " stages");
  std::vector<double> prefix(static_cast<std::size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i)
    prefix[static_cast<std::size_t>(i + 1)] =
        prefix[static_cast<std::size_t>(i)] + costs[static_cast<std::size_t>(i)];
  auto part = [&](int64_t from, int64_t to, int64_t stage) {  // layers [from, to) as `stage`
    double c = prefix[static_cast<std::size_t>(to)] - prefix[static_cast<std::size_t>(from)];
    if (stage == 0) c += first_extra;
    if (stage == stages - 1) c += last_extra;
    return c;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  using Table = std::vector<std::vector<double>>;
  const auto rows = static_cast<std::size_t>(stages + 1), cols = static_cast<std::size_t>(n + 1);
  // Pass 1 — largest[k][i]: the least possible largest part when the first i layers form
  // stages 0..k-1.
  Table largest(rows, std::vector<double>(cols, kInf));
  largest[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k)
    for (int64_t i = k; i <= n - (stages - k); ++i)
      for (int64_t j = k - 1; j < i; ++j)
        largest[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] =
            std::min(largest[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)],
                     std::max(largest[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(j)],
                              part(j, i, k - 1)));
  const double bound =
      largest[static_cast<std::size_t>(stages)][static_cast<std::size_t>(n)] * (1 + 1e-9);
  // Pass 2 — among the splits that reach it, the most even one (least sum of squared parts):
  // several splits often tie on the largest part, and a lopsided one lengthens the pipeline's
  // fill and drain.
  Table squares(rows, std::vector<double>(cols, kInf));
  std::vector<std::vector<int64_t>> cut(rows, std::vector<int64_t>(cols, 0));
  squares[0][0] = 0;
  for (int64_t k = 1; k <= stages; ++k)
    for (int64_t i = k; i <= n - (stages - k); ++i)
      for (int64_t j = k - 1; j < i; ++j) {
        const double c = part(j, i, k - 1);
        const double prev = squares[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(j)];
        if (c > bound || prev == kInf) continue;
        const double v = prev + c * c;
        // Ties keep the latest cut: earlier stages take the extra layer, as the even split does.
        if (v <= squares[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] * (1 + 1e-12)) {
          squares[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = v;
          cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = j;
        }
      }
  std::vector<int64_t> layers(static_cast<std::size_t>(stages));
  int64_t end = n;
  for (int64_t k = stages; k >= 1; --k) {
    const int64_t begin = cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(end)];
    layers[static_cast<std::size_t>(k - 1)] = end - begin;
    end = begin;
  }
  return layers;
}

namespace {

struct MeanWork {
  double tokens = 0;         // per sample
  double attended = 0;       // keys per query
  double output_tokens = 0;  // per sample: what it hands on
};

MeanWork mean_work(const ModelSpec& model, const ModuleSpec& module, const WorkloadSpec& workload) {
  constexpr int64_t kBatches = 4;
  std::vector<Batch> batches;
  std::vector<const Sample*> samples;
  for (int64_t it = 0; it < kBatches; ++it) batches.push_back(draw_batch(workload, it));
  for (const Batch& b : batches)
    for (const Sample& s : b.samples) samples.push_back(&s);
  const ModuleWork w = module_work(model, module, samples, workload.max_seq_len);
  MeanWork m;
  if (samples.empty() || w.tokens == 0) return m;
  m.tokens = static_cast<double>(w.tokens) / static_cast<double>(samples.size());
  m.attended = w.attention_pairs / static_cast<double>(w.tokens);
  m.output_tokens = static_cast<double>(w.output_tokens) / static_cast<double>(samples.size());
  return m;
}

}  // namespace

namespace {

// Prices the ops one layer (or front end, head, projector) of a module adds to a stage the way
// the cost model prices lower()'s ops — compute per phase that runs (F; B with attention twice
// when a gradient passes; W when the module trains; the recomputed F), TP all-reduces inside,
// per-layer overheads — with the given parameters (a calibration profile's) or the cluster's
// analytic defaults. `chunks`: the pipeline chunks the module's layers are cut into (1 for a
// module hosted whole on a stage); with plan.recompute_layers, each layer is charged its chunk's
// share of the recomputation, the split being what it decides.
class Pricer {
 public:
  Pricer(const ModelSpec& model, const ParallelPlan& plan, const ClusterSpec& cluster, int64_t tp,
         int64_t cp, const CostParams* params, int64_t chunks = 1)
      : model_(model),
        plan_(plan),
        cost_(cluster, model.dtype, params != nullptr ? *params : default_cost_params(cluster),
              model),
        flow_(gradient_flow(model)),
        shard_(static_cast<double>(tp * cp)),
        cp_(static_cast<double>(cp)),
        chunks_(static_cast<double>(chunks)) {
    program_.world = static_cast<int32_t>(tp);
    RankList group(static_cast<std::size_t>(tp));
    for (int64_t r = 0; r < tp; ++r) group[static_cast<std::size_t>(r)] = r;
    program_.groups = {group};
  }

  // Seconds of `linear` + `attention` forward FLOPs (whole micro-batch, before sharding) of
  // module `m` over `layers` layers, with `calls` TP all-reduces of `act` bytes per direction.
  // `tokens` of the whole micro-batch; `logits` (the head's, before sharding) count in F and B.
  // `whole_op`: the work is an op of its own (a module hosted on the stage), whose fixed cost
  // counts; otherwise it is part of the stage's op of its module, and only what it adds counts.
  // `checkpointed`: full recomputation runs this work again (transformer layers; not a module's
  // front end or head, nor a projector: see Lowering::recomputes).
  // `first_layer`: the first of the layers, which says their kind (MoE or dense).
  // `per_op_linear`: of `linear`, the matmuls per-op recomputation runs again.
  double seconds(std::size_t m, double linear, double attention, int32_t layers, int32_t calls,
                 double act, double tokens, double logits = 0, bool whole_op = false,
                 bool checkpointed = true, int32_t first_layer = 0,
                 double per_op_linear = 0) const {
    const GradientFlow& f = flow_[m];
    const bool per_op = plan_.recompute == Recompute::kPerOp;
    const bool recompute = (plan_.recompute == Recompute::kFull || (per_op && per_op_linear > 0)) &&
                           f.backward() && checkpointed;
    const Work w{layers, first_layer, calls, act, tokens, logits, attention, whole_op};
    double s = phase(m, Phase::kF, phase_flops(linear, attention, Phase::kF), w);
    if (f.backward()) {
      // Selective recomputation's submodules run their matrices again before the backward.
      double again = 0;
      if (const auto& a = model_.modules[m].transformer;
          a && layers > 0 && plan_.recompute == Recompute::kSelective)
        again =
            tokens * sum_over_layers(
                         *a, first_layer, first_layer + layers, [&](const TransformerArch& layer) {
                           return 2.0 * static_cast<double>(selective_recomputed_matmul_parameters(
                                            layer, plan_.recompute_modules));
                         });
      s += phase(m, Phase::kB, phase_flops(linear, attention, Phase::kB) + again, w);
    }
    if (f.trainable)
      s += phase(m, Phase::kW, phase_flops(linear, attention, Phase::kW),
                 {layers, first_layer, 0, act, tokens, 0, attention, whole_op});
    if (recompute)
      s += recompute_share(m) *
           phase(m, Phase::kR, per_op ? per_op_linear : phase_flops(linear, attention, Phase::kR),
                 w);
    return s;
  }
  double activation_bytes(double tokens, int64_t hidden) const {
    return tokens / cp_ * static_cast<double>(hidden) *
           static_cast<double>(dtype_bytes(model_.dtype));
  }

 private:
  struct Work {
    int32_t layers = 0, first_layer = 0, calls = 0;
    double act = 0, tokens = 0, logits = 0;
    double attention = 0;  // forward attention FLOPs of the whole micro-batch
    bool whole_op = false;
  };
  // The op lower() would make for this work on one rank (tokens and logits sharded as it does).
  double phase(std::size_t m, Phase ph, double flops, const Work& w) const {
    Op op;
    op.module = static_cast<int16_t>(m);
    op.phase = ph;
    op.tp = static_cast<int16_t>(program_.world);
    op.flags =
        compute_op_flags(plan_, ph, program_.world, model_.modules[m].transformer && w.layers > 0,
                         flow_[m].trainable, sequence_parallel_for(plan_, model_.modules[m]));
    // Routed experts whole on each TP rank (expert TP 1), as the lowering marks them.
    if (const auto& a = model_.modules[m].transformer;
        a && a->experts > 0 && program_.world > 1 && expert_tp(m) < program_.world)
      op.flags |= kOpExpertsWhole;
    op.layers = w.layers;
    op.first_layer = w.first_layer;
    op.tokens = static_cast<int64_t>(w.tokens / cp_);
    op.logits = w.logits / shard_;
    op.flops = flops / shard_;
    // The query-key pairs of one layer on this rank, as the lowering counts them: the kernel
    // cost prices attention by them, at the fused kernel's rate.
    if (const auto& a = model_.modules[m].transformer; a && w.layers > 0 && w.attention > 0)
      op.attention_pairs =
          w.attention / (static_cast<double>(w.layers) * layer_attention_flops(*a, 1.0)) / cp_;
    if (program_.world > 1 && w.calls > 0)
      op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kTp, 0, w.calls, w.act});
    // A stage runs one op per phase and module: its fixed cost is not the layer's.
    return cost_.compute_s(program_, op) - (w.whole_op ? 0 : cost_.fixed_compute_s(op));
  }
  // The expert TP of module `m`'s grid: its own layout's, or the homogeneous plan's.
  int64_t expert_tp(std::size_t m) const {
    for (const auto& [name, l] : plan_.modules)
      if (name == model_.modules[m].name) return l.expert_tp();
    return plan_.layout.expert_tp();
  }
  // Of a module's layers, the share full recomputation runs again: the first
  // plan.recompute_layers of each chunk.
  double recompute_share(std::size_t m) const {
    const auto& a = model_.modules[m].transformer;
    if (plan_.recompute != Recompute::kFull || plan_.recompute_layers == 0 || !a || a->layers == 0)
      return 1;
    return std::min(1.0, static_cast<double>(plan_.recompute_layers) * chunks_ /
                             static_cast<double>(a->layers));
  }
  const ModelSpec& model_;
  const ParallelPlan& plan_;
  CostModel cost_;
  std::vector<GradientFlow> flow_;
  Program program_;
  double shard_, cp_, chunks_;
};

// Linear and attention forward FLOPs of one layer for `tokens` tokens attending `attended` keys.
std::pair<double, double> layer_flops(const TransformerArch& a, double tokens, double attended) {
  const double attention = tokens * layer_attention_flops(a, attended);
  return {tokens * layer_forward_flops_per_token(a, attended) - attention, attention};
}

// Layer `layer` of module `m` (architecture `a`) for `tokens` tokens attending `attended` keys.
double layer_seconds(const Pricer& price, std::size_t m, const TransformerArch& a, int64_t layer,
                     double tokens, double attended) {
  const TransformerArch& arch = moe_layer(a, layer) ? a : dense_layer_arch(a);
  const auto [linear, attention] = layer_flops(arch, tokens, attended);
  return price.seconds(
      m, linear, attention, 1, 2, price.activation_bytes(tokens, a.hidden), tokens, 0, false, true,
      static_cast<int32_t>(layer),
      tokens * 2.0 * static_cast<double>(per_op_recomputed_matmul_parameters(arch)));
}

// The whole of module `m` for one micro-batch (its layers, front end, head or projector).
// `output_tokens`: what a projector hands on, of the micro-batch.
double module_seconds(const Pricer& price, const ModelSpec& model, std::size_t m, double tokens,
                      double attended, double output_tokens) {
  const ModuleSpec& spec = model.modules[m];
  if (spec.projector) {
    const ProjectorArch& pr = *spec.projector;
    const ProjectorFlops f = projector_forward_flops(pr, tokens, output_tokens, 1);
    // Not recomputed: full recomputation runs transformer layers again (Lowering::recomputes).
    return price.seconds(m, f.linear, f.attention, 0, 1,
                         price.activation_bytes(output_tokens, pr.out), tokens, 0,
                         /*whole_op=*/true, /*checkpointed=*/false);
  }
  if (!spec.transformer) return 0;
  const TransformerArch& a = *spec.transformer;
  double layers = 0;
  for (int64_t l = 0; l < a.layers; ++l) layers += layer_seconds(price, m, a, l, tokens, attended);
  return layers + price.seconds(
                      m,
                      tokens * (forward_flops_per_token(spec, attended) -
                                sum_over_layers(a, 0, a.layers,
                                                [&](const TransformerArch& x) {
                                                  return layer_forward_flops_per_token(x, attended);
                                                })),
                      0, 0, 0, 0, tokens, 0, /*whole_op=*/true,
                      /*checkpointed=*/false);  // the module's one op: its fixed cost counts
}

const ModuleLayout& layout_of(const ParallelPlan& plan, const ModelSpec& model, std::size_t m) {
  if (plan.placement == Placement::kHomogeneous) return plan.layout;
  for (const auto& [name, layout] : plan.modules)
    if (name == model.modules[m].name) return layout;
  return plan.layout;
}

}  // namespace

ChainCosts chain_costs(const ModelSpec& model, std::size_t module, const ParallelPlan& plan,
                       const WorkloadSpec& workload, const ClusterSpec& cluster,
                       const CostParams* params) {
  const ModuleSpec& spec = model.modules[module];
  TESSERA_CHECK(spec.transformer.has_value());
  const ModuleLayout& layout = layout_of(plan, model, module);
  const Pricer price(model, plan, cluster, layout.tp, layout.cp, params, layout.pp * layout.vpp);
  const double mbs = static_cast<double>(plan.micro_batch_size);
  const TransformerArch& a = *spec.transformer;
  const MeanWork w = mean_work(model, spec, workload);
  const double tokens = mbs * w.tokens;
  ChainCosts c;
  // Layers of one kind cost the same: price each kind once.
  std::optional<double> moe, dense;
  for (int64_t l = 0; l < a.layers; ++l) {
    std::optional<double>& kind = moe_layer(a, l) ? moe : dense;
    if (!kind) kind = layer_seconds(price, module, a, l, tokens, w.attended);
    c.layers.push_back(*kind);
  }
  // Front end (patches, mel frames) on the first stage; the head and loss on the last.
  ModuleSpec front = spec;
  front.transformer->layers = 0;
  front.transformer->mtp_layers = 0;
  front.transformer->vocab = 0;
  c.first_extra = price.seconds(module, tokens * forward_flops_per_token(front, 0), 0, 0, 0, 0,
                                tokens, 0, /*whole_op=*/false, /*checkpointed=*/false);
  if (a.vocab > 0) {
    // The head and loss, once more for each multi-token-prediction layer, which follows the
    // stack's last layer with its projection.
    const double heads = static_cast<double>(1 + a.mtp_layers);
    c.last_extra =
        price.seconds(module,
                      tokens * (heads * 2.0 * static_cast<double>(a.hidden * a.vocab) +
                                static_cast<double>(a.mtp_layers) * 2.0 *
                                    static_cast<double>(mtp_projection_parameters(a))),
                      0, 0, static_cast<int32_t>(heads), price.activation_bytes(tokens, a.hidden),
                      tokens, heads * tokens * static_cast<double>(a.vocab), /*whole_op=*/false,
                      /*checkpointed=*/false);
    for (int64_t l = a.layers; l < stack_end(a); ++l)
      c.last_extra += layer_seconds(price, module, a, l, tokens, w.attended);
  }
  // A homogeneous plan runs every other module on the LLM's first stage, on the LLM's grid —
  // sharded over its TP, whole on every CP rank, as lower() runs them (compute_op.cpp) — and
  // under DIP as segments of their own, spread over every stage.
  if (plan.placement == Placement::kHomogeneous && spec.role == ModuleRole::kLlm &&
      plan.schedule != Schedule::kDip) {
    const Pricer hosted(model, plan, cluster, layout.tp, 1, params);
    for (std::size_t i = 0; i < model.modules.size(); ++i)
      if (i != module) {
        const MeanWork mw = mean_work(model, model.modules[i], workload);
        c.first_extra +=
            module_seconds(hosted, model, i, mbs * mw.tokens, mw.attended, mbs * mw.output_tokens);
      }
  }
  return c;
}

ParallelPlan resolve_stage_split(const ParallelPlan& plan, const ModelSpec& model,
                                 const WorkloadSpec& workload, const ClusterSpec& cluster,
                                 const CostParams* params) {
  if (plan.stage_split != StageSplit::kFrozenAware) return plan;
  ParallelPlan out = plan;
  auto resolve = [&](ModuleLayout& layout, std::size_t module) {
    const ModuleSpec& spec = model.modules[module];
    if (!stage_split_pending(out, layout, spec)) return;
    const int64_t chunks = layout.pp * layout.vpp;
    const ChainCosts c = chain_costs(model, module, out, workload, cluster, params);
    layout.stage_layers = linear_partition(c.layers, chunks, c.first_extra, c.last_extra);
  };
  if (plan.placement == Placement::kHomogeneous) {
    const ModuleSpec* llm = find_llm(model);
    resolve(out.layout, static_cast<std::size_t>(llm - model.modules.data()));
  } else {
    for (auto& [name, layout] : out.modules)
      if (const ModuleSpec* m = find_module(model, name))
        resolve(layout, static_cast<std::size_t>(m - model.modules.data()));
  }
  return out;
}

namespace {

// "1,5,5,5,5,4,3": layers per (virtual) stage; three or more equal neighbours as "5×4".
std::string layers_text(const ModuleLayout& l) {
  if (l.stage_layers.empty()) return "even";
  std::string out;
  const std::vector<int64_t>& v = l.stage_layers;
  for (std::size_t i = 0; i < v.size();) {
    std::size_t run = 1;
    while (i + run < v.size() && v[i + run] == v[i]) ++run;
    const std::string one = std::to_string(v[i]);
    out += out.empty() ? "" : ",";
    if (run >= 3) {
      out += one + "×" + std::to_string(run);
    } else {
      out += one + (run == 2 ? "," + one : "");
    }
    i += run;
  }
  return out;
}

}  // namespace

std::string stage_layers_text(const ParallelPlan& plan, const ModelSpec& model) {
  if (plan.placement == Placement::kHomogeneous) {
    const ModuleSpec* llm = find_llm(model);
    return (llm != nullptr ? llm->name : std::string("llm")) + " " + layers_text(plan.layout);
  }
  std::string out;
  for (const auto& [name, l] : plan.modules)
    out += (out.empty() ? "" : " | ") + name + " " + layers_text(l);
  return out;
}

}  // namespace tessera

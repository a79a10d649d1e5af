// Frozen-aware pipeline partitioning: the linear partition is optimal (hand cases and an
// exhaustive check), layer costs follow what is frozen, and lower() cuts stages where it says.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>

#include "shared/cost/cost_model.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

// The least possible largest part, by trying every split.
double brute_force(const std::vector<double>& costs, int64_t stages, double first, double last) {
  const auto n = static_cast<int64_t>(costs.size());
  double best = 1e300;
  std::vector<int64_t> cuts;
  std::function<void(int64_t, int64_t)> go = [&](int64_t from, int64_t k) {
    if (k == stages - 1) {
      double worst = 0, sum = 0;
      int64_t begin = 0;
      std::vector<int64_t> ends = cuts;
      ends.push_back(n);
      for (std::size_t s = 0; s < ends.size(); ++s) {
        sum = 0;
        for (int64_t i = begin; i < ends[s]; ++i) sum += costs[static_cast<std::size_t>(i)];
        if (s == 0) sum += first;
        if (static_cast<int64_t>(s) == stages - 1) sum += last;
        worst = std::max(worst, sum);
        begin = ends[s];
      }
      best = std::min(best, worst);
      return;
    }
    for (int64_t c = from + 1; c <= n - (stages - 1 - k); ++c) {
      cuts.push_back(c);
      go(c, k + 1);
      cuts.pop_back();
    }
  };
  go(0, 0);
  return best;
}

double largest(const std::vector<double>& costs, const std::vector<int64_t>& layers, double first,
               double last) {
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t s = 0; s < layers.size(); ++s) {
    double sum = s == 0 ? first : 0;
    if (s + 1 == layers.size()) sum += last;
    for (int64_t i = 0; i < layers[s]; ++i) sum += costs[at++];
    worst = std::max(worst, sum);
  }
  return worst;
}

const char* kModel = R"({"name": "vlm", "modules": [
  {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
   "transformer": {"layers": 8, "hidden": 512, "heads": 8, "ffn": 2048, "linear_bias": true, "norm": "layernorm"},
   "patching": {"patch_size": 8, "resize": "fixed", "image_size": 128}},
  {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 512, "out": 256}},
  {"name": "llm", "role": "llm", "inputs": ["proj"],
   "transformer": {"layers": 12, "hidden": 256, "heads": 8, "ffn": 688, "gated_ffn": true, "vocab": 1000}}]})";
const char* kWorkload = R"({"global_batch": 8, "max_seq_len": 1024, "seed": 3,
  "samples": {"text_tokens": {"dist": "uniform", "min": 32, "max": 64}, "image": {"count": 1, "width": 128, "height": 128}}})";

ModelSpec model(bool vision_frozen, bool llm_frozen = false) {
  Diagnostics diag;
  Json j = Json::parse(kModel);
  j["modules"][0]["frozen"] = vision_frozen;
  j["modules"][2]["frozen"] = llm_frozen;
  ModelSpec m = read_model(j, "m", "", diag);
  REQUIRE(diag.ok());
  return m;
}

WorkloadSpec workload() {
  Diagnostics diag;
  WorkloadSpec w = read_workload(Json::parse(kWorkload), "w", "", ".", diag);
  REQUIRE(diag.ok());
  return w;
}

ClusterSpec cluster() {
  Diagnostics diag;
  ClusterSpec c = read_cluster(Json::parse(R"({"name": "c", "nodes": 1, "devices_per_node": 8,
    "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 2e12},
    "intra_node": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6}})"),
                               "", "", diag);
  REQUIRE(diag.ok());
  return c;
}

ParallelPlan plan(const std::string& text) {
  Diagnostics diag;
  ParallelPlan p = read_plan(Json::parse(text), "p", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  return p;
}

}  // namespace

TEST_CASE("linear_partition: hand cases") {
  CHECK(linear_partition({1, 1, 1, 1}, 2) == std::vector<int64_t>{2, 2});
  CHECK(linear_partition({1, 1, 1}, 2) == std::vector<int64_t>{2, 1});  // ties: earlier longer
  CHECK(linear_partition({4, 1, 1, 1, 1}, 2) == std::vector<int64_t>{1, 4});
  // Work outside the layers moves the cut: a heavy first stage takes fewer layers.
  CHECK(linear_partition({1, 1, 1, 1}, 2, 2, 0) == std::vector<int64_t>{1, 3});
  CHECK(linear_partition({1, 1, 1, 1, 1, 1}, 3, 0, 2) == std::vector<int64_t>{3, 2, 1});
  CHECK(linear_partition({1, 2, 3}, 3) == std::vector<int64_t>{1, 1, 1});
  CHECK(linear_partition({5}, 1) == std::vector<int64_t>{1});
}

TEST_CASE("linear_partition is optimal (exhaustive check on small chains)") {
  uint64_t state = 7;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>((state >> 33) % 100 + 1);
  };
  for (int trial = 0; trial < 200; ++trial) {
    const auto n = static_cast<int64_t>(next()) % 9 + 1;
    std::vector<double> costs;
    for (int64_t i = 0; i < n; ++i) costs.push_back(next());
    const int64_t stages = static_cast<int64_t>(next()) % n + 1;
    const double first = trial % 3 == 0 ? next() : 0, last = trial % 4 == 0 ? next() : 0;
    const std::vector<int64_t> layers = linear_partition(costs, stages, first, last);
    REQUIRE(static_cast<int64_t>(layers.size()) == stages);
    int64_t total = 0;
    for (int64_t l : layers) {
      CHECK(l >= 1);
      total += l;
    }
    CHECK(total == n);
    CHECK(largest(costs, layers, first, last) ==
          doctest::Approx(brute_force(costs, stages, first, last)));
  }
}

TEST_CASE("layer costs follow what is frozen: F, F + B_in, F + B_in + B_w") {
  const WorkloadSpec w = workload();
  const ClusterSpec c = cluster();
  const ParallelPlan p =
      plan(R"({"placement": "non_colocated", "modules": {"vision": {"pp": 2}, "llm": {"pp": 2}}})");
  const double frozen = chain_costs(model(true), 0, p, w, c).layers[0];
  const double trainable = chain_costs(model(false), 0, p, w, c).layers[0];
  // Forward only, against forward + input backward (attention twice) + weight backward.
  CHECK(trainable > 2.8 * frozen);
  CHECK(trainable < 3.6 * frozen);
  // A frozen LLM behind a trainable projector passes gradients back but computes no weight
  // gradients: about two thirds of a trainable one.
  const double llm_frozen = chain_costs(model(true, true), 2, p, w, c).layers[0];
  const double llm_trainable = chain_costs(model(true, false), 2, p, w, c).layers[0];
  CHECK(llm_trainable > 1.3 * llm_frozen);
  CHECK(llm_trainable < 1.6 * llm_frozen);
  // The LLM's head sits on its last stage.
  CHECK(chain_costs(model(true), 2, p, w, c).last_extra > 0);
}

TEST_CASE(
    "frozen-aware stage split: the LLM's first stage hosting the encoder takes fewer layers") {
  const WorkloadSpec w = workload();
  const ParallelPlan aware =
      plan(R"({"placement": "homogeneous", "layout": {"pp": 2}, "stage_split": "frozen_aware"})");
  const ParallelPlan uniform =
      plan(R"({"placement": "homogeneous", "layout": {"pp": 2}, "stage_split": "uniform"})");
  const ClusterSpec c = cluster();
  const std::vector<int64_t> frozen =
      resolve_stage_split(aware, model(true), w, c).layout.stage_layers;
  const std::vector<int64_t> trainable =
      resolve_stage_split(aware, model(false), w, c).layout.stage_layers;
  REQUIRE(frozen.size() == 2);
  CHECK(frozen[0] + frozen[1] == 12);
  CHECK(frozen[0] < 6);
  // A trainable encoder costs three times as much on stage 0: fewer LLM layers still.
  CHECK(trainable[0] < frozen[0]);
  // Uniform leaves the even split to lower(); explicit stage layers are kept as given.
  CHECK(resolve_stage_split(uniform, model(true), w, c).layout.stage_layers.empty());
  const ParallelPlan given =
      plan(R"({"placement": "homogeneous", "layout": {"pp": 2, "stage_layers": [7, 5]}})");
  CHECK(resolve_stage_split(given, model(true), w, c).layout.stage_layers ==
        std::vector<int64_t>{7, 5});

  // lower() cuts the stages there: the ops of stage 0 and 1 carry those layer counts.
  const Lowered l =
      lower(model(true), c, resolve_stage_split(aware, model(true), w, c), w, draw_batch(w, 0));
  REQUIRE(l.error.empty());
  for (int32_t rank = 0; rank < 2; ++rank)
    for (const Op& op : l.program.ranks[static_cast<std::size_t>(rank)])
      if (op.kind == OpKind::kCompute && op.module == 2)
        CHECK(op.layers == frozen[static_cast<std::size_t>(op.stage)]);
}

TEST_CASE("frozen-aware split priced with a profile: fixed costs once per stage, measured rates") {
  const WorkloadSpec w = workload();
  const ClusterSpec c = cluster();
  const ParallelPlan aware =
      plan(R"({"placement": "homogeneous", "layout": {"pp": 2}, "stage_split": "frozen_aware"})");
  auto fit = [](ModuleRole role, Phase phase, double overhead, double per_flop,
                double per_token_layer) {
    ComputeFit f;
    f.role = role;
    f.phase = phase;
    f.overhead_s = overhead;
    f.seconds_per_flop = per_flop;
    f.seconds_per_token_layer = per_token_layer;
    return f;
  };
  auto params = [&](double encoder_per_flop, double llm_overhead) {
    CostParams p = default_cost_params(c);
    p.compute_fits = {fit(ModuleRole::kEncoder, Phase::kF, 0, encoder_per_flop, 0),
                      fit(ModuleRole::kProjector, Phase::kF, 0, 1e-12, 0),
                      fit(ModuleRole::kProjector, Phase::kB, 0, 1e-12, 0),
                      fit(ModuleRole::kLlm, Phase::kF, llm_overhead, 1e-12, 1e-7),
                      fit(ModuleRole::kLlm, Phase::kB, llm_overhead, 1e-12, 1e-7)};
    return p;
  };
  auto split = [&](const CostParams& p) {
    return resolve_stage_split(aware, model(true), w, c, &p).layout.stage_layers;
  };
  const CostParams cheap = params(1e-13, 0);
  const std::vector<int64_t> base = split(cheap);
  REQUIRE(base.size() == 2);
  // An encoder measured a hundred times as slow leaves fewer LLM layers beside it on stage 0.
  const std::vector<int64_t> slow = split(params(1e-11, 0));
  CHECK(slow[0] < base[0]);
  // Every stage runs one LLM op per phase: a large fixed cost per op moves no boundary.
  CHECK(split(params(1e-11, 1.0)) == slow);
  // The per token·layer rate counts (lower()'s ops carry their tokens): without any other
  // LLM cost, the layers still weigh.
  const ChainCosts costs = chain_costs(model(true), 2, aware, w, c, &cheap);
  CHECK(costs.layers.front() > 0);
}

TEST_CASE(
    "the stage split's pricer and the lowering price a stage's layers alike, option by option") {
  // Llama 3.1 8B on one DGX H100, four uniform stages: stage 1 holds layers 8-15 and nothing
  // else. Its ops of one micro-batch cost what the pricer's layers do, plus each op's fixed cost.
  Diagnostics diag;
  const auto s = load_scenario(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/published/nvidia-llama3.1-8b-h100-8.json",
      diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  ParallelPlan base = *s->plan;
  base.layout = ModuleLayout{};
  base.layout.pp = 4;
  base.layout.dp = 2;
  base.num_micro_batches = 0;
  base.overlap_grad_reduce = false;
  base.overlap_param_gather = false;
  const CostModel cost(s->cluster, s->model.dtype, default_cost_params(s->cluster), s->model);
  const std::vector<std::pair<const char*, std::function<void(ParallelPlan&)>>> options = {
      {"defaults", [](ParallelPlan&) {}},
      {"framework pytorch", [](ParallelPlan& p) { p.framework = Framework::kPytorch; }},
      {"eager element-wise kernels", [](ParallelPlan& p) { p.fused_kernels = false; }},
      {"unfused attention", [](ParallelPlan& p) { p.flash_attention = false; }},
      {"fp8", [](ParallelPlan& p) { p.fp8 = Fp8Recipe::kDelayed; }},
      {"full recomputation", [](ParallelPlan& p) { p.recompute = Recompute::kFull; }},
      {"full recomputation of each stage's first 3 layers",
       [](ParallelPlan& p) {
         p.recompute = Recompute::kFull;
         p.recompute_layers = 3;
       }},
      {"selective, unfused",
       [](ParallelPlan& p) {
         p.recompute = Recompute::kSelective;
         p.flash_attention = false;
       }},
      {"per-op recomputation", [](ParallelPlan& p) { p.recompute = Recompute::kPerOp; }},
      {"selective of the norms and the MLP", [](ParallelPlan& p) {
         p.recompute = Recompute::kSelective;
         p.recompute_modules = kRecomputeLayernorm | kRecomputeMlp;
       }}};
  for (const auto& [name, edit] : options) {
    INFO(std::string(name));
    ParallelPlan plan = base;
    edit(plan);
    Diagnostics v;
    validate_plan(plan, s->model, s->workload, s->cluster, "p.json", "plan", v);
    REQUIRE(v.ok());
    const Lowered lowered =
        lower(s->model, s->cluster, plan, s->workload, draw_batch(s->workload, 0));
    REQUIRE(lowered.error.empty());
    double lowering = 0, fixed = 0;
    int ops = 0;
    for (const auto& rank : lowered.program.ranks) {
      if (ops > 0) break;
      for (const Op& op : rank)
        if (op.kind == OpKind::kCompute && op.stage == 1 && op.microbatch == 0) {
          CHECK(op.layers == (op.phase == Phase::kR && plan.recompute_layers > 0 ? 3 : 8));
          CHECK((op.flags & (kOpFrontEnd | kOpHead)) == 0);
          lowering += cost.compute_s(lowered.program, op);
          fixed += cost.fixed_compute_s(op);
          // FP8 delayed scaling's amax reduction, once an op (a chunk's), none a layer's.
          for (const NestedCollective& n : op.nested)
            if (n.purpose == Purpose::kAmax)
              fixed += n.count * (cost.collective_s(lowered.program, n) +
                                  2 * cost.params().kernel_tuning.launch_s);
          ++ops;
        }
    }
    CHECK(ops ==
          (plan.recompute == Recompute::kFull || plan.recompute == Recompute::kPerOp ? 4 : 3));
    const ChainCosts c = chain_costs(s->model, 0, plan, s->workload, s->cluster);
    double priced = fixed;
    for (std::size_t l = 8; l < 16; ++l) priced += c.layers[l];
    CHECK(priced == doctest::Approx(lowering).epsilon(1e-6));
  }
}

TEST_CASE("full recomputation runs the LLM's layers again, not a projector its first stage hosts") {
  // LLaVA-1.5-7B (frozen ViT, trainable projector) homogeneous on two stages: stage 0 hosts the
  // encoder and the projector before the LLM's layers. The lowering gives the projector no
  // recomputed op, so the pricer charges its stage nothing more for it under full
  // recomputation (the frozen encoder, without a backward, is not recomputed either).
  Diagnostics diag;
  const auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/default.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  ParallelPlan plan = *s->plan;
  plan.placement = Placement::kHomogeneous;
  plan.modules.clear();
  plan.layout = ModuleLayout{};
  plan.layout.pp = 2;
  plan.layout.dp = 2;
  plan.num_micro_batches = 0;
  std::size_t llm = 0, projector = 0;
  for (std::size_t m = 0; m < s->model.modules.size(); ++m) {
    if (s->model.modules[m].role == ModuleRole::kLlm) llm = m;
    if (s->model.modules[m].projector) projector = m;
  }
  REQUIRE(s->model.modules[projector].projector.has_value());
  const auto first_extra = [&](Recompute r) {
    ParallelPlan p = plan;
    p.recompute = r;
    return chain_costs(s->model, llm, p, s->workload, s->cluster).first_extra;
  };
  CHECK(first_extra(Recompute::kFull) ==
        doctest::Approx(first_extra(Recompute::kNone)).epsilon(1e-12));
  plan.recompute = Recompute::kFull;
  plan = resolve_stage_split(plan, s->model, s->workload, s->cluster);
  const Lowered lowered =
      lower(s->model, s->cluster, plan, s->workload, draw_batch(s->workload, 0));
  REQUIRE(lowered.error.empty());
  int recomputed_llm = 0;
  for (const auto& rank : lowered.program.ranks)
    for (const Op& op : rank)
      if (op.kind == OpKind::kCompute && op.phase == Phase::kR) {
        CHECK(op.module != static_cast<int16_t>(projector));
        recomputed_llm += op.module == static_cast<int16_t>(llm) ? 1 : 0;
      }
  CHECK(recomputed_llm > 0);
}

// lower() and evaluate(): textbook schedules on uniform work, every placement passes the
// Program checks, frozen-aware emission, memory and metrics.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/layout/schedule.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"
#include "shared/search/estimate.hpp"
#include "shared/search/stage_split.hpp"
#include "tests/ir/small_models.hpp"

using namespace tessera;

namespace {

using test::kTextModel;
using test::kVlm;
const char* kValm = R"({"name": "valm", "modules": [
  {"name": "vision", "role": "encoder", "modality": "image",
   "transformer": {"layers": 4, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm"},
   "patching": {"patch_size": 8, "resize": "fixed", "image_size": 64}},
  {"name": "vproj", "role": "projector", "inputs": ["vision"], "projector": {"in": 128, "out": 256}},
  {"name": "audio", "role": "encoder", "modality": "audio", "frozen": true,
   "transformer": {"layers": 2, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm", "positions": 100},
   "audio": {"mel_bins": 16, "max_seconds": 2}},
  {"name": "aproj", "role": "projector", "inputs": ["audio"], "projector": {"in": 128, "out": 256}},
  {"name": "llm", "role": "llm", "inputs": ["vproj", "aproj"],
   "transformer": {"layers": 8, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1000}}]})";

ClusterSpec cluster(int64_t devices) {
  Diagnostics diag;
  const std::string text =
      R"({"name": "c", "nodes": 1, "devices_per_node": )" + std::to_string(devices) + R"(,
    "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 2e12},
    "intra_node": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6}})";
  return read_cluster(Json::parse(text), "", "", diag);
}

struct Case {
  ModelSpec model;
  WorkloadSpec workload;
  ClusterSpec cluster;
  ParallelPlan plan;
};

Case make(const char* model, const char* workload, const char* plan) {
  Diagnostics diag;
  Case c;
  c.model = read_model(Json::parse(model), "m", "", diag);
  c.workload = read_workload(Json::parse(workload), "w", "", ".", diag);
  c.plan = read_plan(Json::parse(plan), "p", "", diag);
  REQUIRE(diag.ok());
  c.cluster = cluster(world_size(c.plan, c.model));
  validate_plan(c.plan, c.model, c.workload, c.cluster, "p", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  return c;
}

// Costs with no overheads and free communication: pure compute, so schedules show exactly.
CostModel ideal(const Case& c) {
  CostParams params;
  params.overhead_per_layer_s = 0;
  params.overhead_per_op_s = 0;
  params.default_efficiency = 1;
  ClusterSpec fast = c.cluster;
  fast.intra_node = {1e30, 0};
  fast.device.memory_bandwidth_bytes_per_s = 1e30;
  return CostModel(fast, c.model.dtype, params, c.model);
}

Program lowered(const Case& c, int64_t iteration = 0) {
  Lowered l = lower(c.model, c.cluster, resolve_stage_split(c.plan, c.model, c.workload, c.cluster),
                    c.workload, draw_batch(c.workload, iteration));
  REQUIRE(l.error.empty());
  const auto problems = check_program(l.program);
  INFO((problems.empty() ? std::string() : problems.front()));
  CHECK(problems.empty());
  return std::move(l.program);
}

const char* kUniformText =
    R"({"global_batch": 16, "max_seq_len": 512, "samples": {"text_tokens": 256}})";

// kVlm with its ViT trained, and eight samples of one or two images each.
std::string vlm_with_trained_vit() {
  std::string model = kVlm;
  model.replace(model.find(R"("frozen": true)"), 14, R"("frozen": false)");
  return model;
}
const char* kOneOrTwoImages = R"({"global_batch": 8, "max_seq_len": 1024, "seed": 3, "samples": {
    "text_tokens": {"dist": "uniform", "min": 32, "max": 300},
    "image": {"count": {"dist": "choice", "values": [1, 2]}, "width": 64, "height": 64}}})";

// The evaluated step of `p` on the case's cluster with its devices linked at 2 GB/s, where
// communication costs enough for hiding it to show.
double step_on_slow_network(const Case& c, const Program& p) {
  ClusterSpec slow = c.cluster;
  slow.intra_node.bandwidth_bytes_per_s = 2e9;
  const CostModel cost(slow, c.model.dtype, CostParams{}, c.model);
  const Timeline t = evaluate(p, cost);
  REQUIRE(t.error.empty());
  return t.step_s;
}

}  // namespace

TEST_CASE("schedule tables") {
  CHECK(one_f_one_b_order(4, 2) == std::vector<ScheduleItem>{{0, 0, false},
                                                             {1, 0, false},
                                                             {2, 0, false},
                                                             {0, 0, true},
                                                             {3, 0, false},
                                                             {1, 0, true},
                                                             {2, 0, true},
                                                             {3, 0, true}});
  CHECK(gpipe_order(2) ==
        std::vector<ScheduleItem>{{0, 0, false}, {1, 0, false}, {1, 0, true}, {0, 0, true}});
  // Interleaved, 2 stages x 2 chunks, 4 micro-batches: Megatron's order on stage 0.
  const auto inter = interleaved_order(4, 2, 0, 2);
  REQUIRE(inter.size() == 16);
  CHECK(inter[0] == ScheduleItem{0, 0, false});
  CHECK(inter[1] == ScheduleItem{1, 0, false});
  CHECK(inter[2] == ScheduleItem{0, 1, false});
  CHECK(inter[3] == ScheduleItem{1, 1, false});
  CHECK(inter[4] == ScheduleItem{2, 0, false});
  CHECK(inter[5] == ScheduleItem{0, 1, true});  // first backward: the last chunk of micro-batch 0
}

TEST_CASE("uniform 1F1B: the bubble is (p-1)/m exactly, and GPipe takes as long") {
  for (const auto& [pp, m] : {std::pair{2, 8}, std::pair{4, 8}, std::pair{4, 16}}) {
    const std::string workload = R"({"global_batch": )" + std::to_string(m) +
                                 R"(, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
    const std::string plan_json = R"({"placement": "homogeneous", "layout": {"pp": )" +
                                  std::to_string(pp) + R"(}, "num_micro_batches": )" +
                                  std::to_string(m) + "}";
    Case c = make(kTextModel, workload.c_str(), plan_json.c_str());
    // Equal layers and no output head work difference: give every stage the same FLOPs.
    c.model.modules[0].transformer->vocab = 1;
    const Program p = lowered(c);
    const Timeline t = evaluate(p, ideal(c));
    REQUIRE(t.error.empty());
    for (std::size_t r = 0; r < t.compute_busy_s.size(); ++r) {
      INFO("pp " << pp << " m " << m << " rank " << r);
      CHECK((t.step_s - t.compute_busy_s[r]) / t.compute_busy_s[r] ==
            doctest::Approx(double(pp - 1) / m).epsilon(1e-3));
    }
    Case g = c;
    g.plan.schedule = Schedule::kGpipe;
    const Timeline tg = evaluate(lowered(g), ideal(g));
    CHECK(tg.step_s == doctest::Approx(t.step_s).epsilon(1e-9));
    // ... but GPipe holds every micro-batch's activations, 1F1B at most pp on stage 0.
    CHECK(tg.peak_activation_bytes[0] == doctest::Approx(t.peak_activation_bytes[0] * m / pp));
  }
}

TEST_CASE("interleaved 1F1B shrinks the bubble to (p-1)/(v·m)") {
  Case c = make(
      kTextModel, R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 256}})",
      R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"pp": 2, "vpp": 2}, "num_micro_batches": 8})");
  c.model.modules[0].transformer->vocab = 1;
  const Timeline t = evaluate(lowered(c), ideal(c));
  REQUIRE(t.error.empty());
  CHECK((t.step_s - t.compute_busy_s[0]) / t.compute_busy_s[0] ==
        doctest::Approx(1.0 / (2 * 8)).epsilon(1e-3));
}

TEST_CASE("every placement and schedule lowers, passes the Program checks and evaluates") {
  const char* image_workload = R"({"global_batch": 16, "max_seq_len": 1024, "seed": 3, "samples": {
    "text_tokens": {"dist": "uniform", "min": 32, "max": 300},
    "image": {"count": {"dist": "choice", "values": [0, 1, 2]}, "width": 64, "height": 64}}})";
  const char* av_workload = R"({"global_batch": 16, "max_seq_len": 1024, "seed": 4, "samples": {
    "text_tokens": {"dist": "uniform", "min": 32, "max": 300},
    "image": {"count": {"dist": "choice", "values": [0, 1]}, "width": 64, "height": 64},
    "audio": {"count": {"dist": "choice", "values": [0, 1]}, "seconds": 1.5}}})";
  const std::vector<std::pair<const char*, const char*>> plans = {
      {kVlm,
       R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}, "sequence_parallel": true})"},
      {kVlm,
       R"({"placement": "homogeneous", "schedule": "gpipe", "layout": {"pp": 4, "cp": 2}, "recompute": "full"})"},
      {kVlm,
       R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"pp": 2, "vpp": 2, "dp": 2}, "num_micro_batches": 8})"},
      {kVlm,
       R"({"placement": "colocated", "schedule": "three_phase", "modules": {"vision": {"dp": 8}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})"},
      {kVlm,
       R"({"placement": "colocated", "modules": {"vision": {"tp": 2, "dp": 4}, "llm": {"tp": 2, "dp": 4}}, "distributed_optimizer": true})"},
      {kVlm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 4}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})"},
      {kVlm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2, "pp": 2}, "llm": {"tp": 2, "cp": 2, "dp": 4}}})"},
      {kValm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2}, "audio": {"dp": 2}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})"},
      {kValm,
       R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "audio": {"dp": 4, "tp": 2}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})"},
      {kValm, R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}})"},
  };
  for (const auto& [model, plan] : plans) {
    INFO(plan);
    Case c = make(model, model == kValm ? av_workload : image_workload, plan);
    for (int64_t iteration : {0, 1}) {
      const Program p = lowered(c, iteration);
      const Timeline t = evaluate(p, ideal(c));
      CHECK(t.error.empty());
      CHECK(t.step_s > 0);
      CHECK(p.model_flops > 0);
    }
  }
}

TEST_CASE(
    "frozen modules: no weight gradients, no reduction, no optimizer; forward-only when nothing "
    "upstream trains") {
  Case c = make(
      kVlm,
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2, "pp": 2}, "llm": {"pp": 2, "dp": 2}}})");
  const Program p = lowered(c);
  // Ranks 0-3: the frozen ViT in two stages; its first stage runs forward only.
  for (const Op& op : p.ranks[0]) {
    CHECK(op.phase == Phase::kF);
    CHECK(op.purpose != Purpose::kDp);
    CHECK(op.kind != OpKind::kOptimizerStep);
  }
  // Its last stage carries the trainable projector: backward and weight gradients for it only.
  std::set<std::string> modules_with_w;
  for (const Op& op : p.ranks[2])
    if (op.kind == OpKind::kCompute && op.phase != Phase::kF)
      modules_with_w.insert(p.modules[static_cast<std::size_t>(op.module)]);
  CHECK(modules_with_w == std::set<std::string>{"proj"});
  // Freezing the LLM too: the projector still trains, so the LLM passes gradients (B) without W.
  c.model.modules[2].frozen = true;
  const Program q = lowered(c);
  bool llm_b = false, llm_w = false;
  for (const Op& op : q.ranks[4]) {
    if (op.module != 2 || op.kind != OpKind::kCompute) continue;
    llm_b |= op.phase == Phase::kB;
    llm_w |= op.phase == Phase::kW;
  }
  CHECK(llm_b);
  CHECK_FALSE(llm_w);
  // And with everything frozen but the LLM, the LLM's first stage sends nothing back.
  c.model.modules[1].frozen = true;
  c.model.modules[2].frozen = false;
  const Program frozen_encoders = lowered(c);  // (a temporary's ranks[4] would dangle)
  for (const Op& op : frozen_encoders.ranks[4])
    CHECK_FALSE(
        (op.kind == OpKind::kSend && op.purpose == Purpose::kBoundary && op.phase == Phase::kB));
}

TEST_CASE("graph-aware 1F1B on a two-module DAG matches the hand-drawn timeline") {
  // ViT (1 stage, trainable) -> LLM (2 stages); every op takes the same time u.
  // Depth 3: the ViT warms up 2 micro-batches, LLM stage 0 one, LLM stage 1 none.
  Case v = make(
      kVlm,
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 0, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 1}, "llm": {"pp": 2, "dp": 1}}, "num_micro_batches": 4})");
  v.model.modules[0].frozen = false;
  const Program p = lowered(v);
  // Order on the ViT rank: F0 F1 F2 B0 F3 B1 B2 B3 (warm-up 2).
  std::vector<std::pair<int, Phase>> order;
  for (const Op& op : p.ranks[0])
    if (op.kind == OpKind::kCompute && op.module == 0 && op.phase != Phase::kW)
      order.emplace_back(op.microbatch, op.phase);
  CHECK(order == std::vector<std::pair<int, Phase>>{{0, Phase::kF},
                                                    {1, Phase::kF},
                                                    {2, Phase::kF},
                                                    {0, Phase::kB},
                                                    {3, Phase::kF},
                                                    {1, Phase::kB},
                                                    {2, Phase::kB},
                                                    {3, Phase::kB}});
  const Timeline t = evaluate(p, ideal(v));
  CHECK(t.error.empty());
}

TEST_CASE(
    "three-phase colocated: encoder forward for the whole batch first, one encoder backward last") {
  Case c = make(
      kVlm,
      R"({"global_batch": 8, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "colocated", "schedule": "three_phase", "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}}})");
  c.model.modules[0].frozen = false;
  const Program p = lowered(c);
  auto names = [&](int32_t rank) {
    std::vector<std::string> out;
    for (const Op& op : p.ranks[static_cast<std::size_t>(rank)]) out.push_back(op_name(p, op));
    return out;
  };
  auto has = [](const std::vector<std::string>& v, const std::string& name) {
    return std::find(v.begin(), v.end(), name) != v.end();
  };
  // Phase 1 on rank 1 (encoder replica 1; its LLM replica 0 starts on rank 0): ViT F over the
  // whole local batch, projector F, then each micro-batch's rows to that first-stage leader.
  const std::vector<std::string> r1 = names(1), r0 = names(0);
  CHECK(r1[0] == "vision.s0.F");
  CHECK(r1[1] == "proj.s0.F");
  CHECK(r1[2] == "send:proj.s0.mb0.F>r0");
  // Rank 0 is replica 0 of both: nothing sent to itself; it receives replica 1's rows.
  CHECK(has(r0, "recv:proj.s0.mb0.F<r1"));
  CHECK_FALSE(has(r0, "send:proj.s0.mb0.F>r0"));
  // Phase 3 on rank 1: the gradients come back from rank 0, then projector and ViT backward.
  const auto back = std::find(r1.begin(), r1.end(), "recv:proj.s0.mb3.B<r0");
  REQUIRE(back != r1.end());
  CHECK(*(back + 1) == "proj.s0.B");
  CHECK(*(back + 3) == "vision.s0.B");
  CHECK(*(back + 4) == "vision.s0.W");
  CHECK(check_program(p).empty());
}

TEST_CASE("program checks catch broken programs") {
  Case c = make(kTextModel, kUniformText, R"({"placement": "homogeneous", "layout": {"pp": 2}})");
  Program p = lower(c.model, c.cluster, resolve_stage_split(c.plan, c.model, c.workload, c.cluster),
                    c.workload, draw_batch(c.workload, 0))
                  .program;
  REQUIRE(check_program(p).empty());
  Program missing = p;
  for (auto it = missing.ranks[1].begin(); it != missing.ranks[1].end(); ++it)
    if (it->kind == OpKind::kRecv) {
      missing.ranks[1].erase(it);
      break;
    }
  CHECK_FALSE(check_program(missing).empty());
  Program forward_dep = p;
  forward_dep.ranks[0][0].deps = {5};
  CHECK(check_program(forward_dep).front().find("not an earlier op") != std::string::npos);
  // A collective only rank 0 enters: its group never completes.
  Program reordered = p;
  Op lone;
  lone.kind = OpKind::kCollective;
  lone.stream = StreamKind::kCollective;
  reordered.groups.push_back({0, 1});
  lone.group = static_cast<int32_t>(reordered.groups.size() - 1);
  lone.message_bytes = 8;
  reordered.ranks[0].push_back(lone);
  CHECK(check_program(reordered).front().find("1 of 2 members") != std::string::npos);
  // The evaluator reports the deadlock instead of hanging.
  const Timeline t = evaluate(reordered, ideal(c));
  CHECK(t.error.find("cannot finish") != std::string::npos);
  // A compute op beyond the layers its chunk holds.
  Program overrun = p;
  for (Op& op : overrun.ranks[1])
    if (op.kind == OpKind::kCompute) {
      op.layers += 1;
      break;
    }
  CHECK(check_program(overrun).front().find("layers its chunk does not hold") != std::string::npos);
}

TEST_CASE("program checks catch a boundary message on the wrong link") {
  Case c = make(
      kVlm,
      R"({"global_batch": 8, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2}, "llm": {"dp": 1}}})");
  const Program p = lowered(c);
  REQUIRE(p.links.size() >= 2);
  Program swapped = p;
  Program nowhere = p;
  for (std::size_t r = 0; r < p.ranks.size(); ++r)
    for (std::size_t i = 0; i < p.ranks[r].size(); ++i)
      if (p.ranks[r][i].kind == OpKind::kSend && p.ranks[r][i].purpose == Purpose::kBoundary) {
        Op& op = swapped.ranks[r][i];
        op.link = (op.link + 1) % static_cast<int32_t>(p.links.size());
        nowhere.ranks[r][i].link = static_cast<int32_t>(p.links.size());
      }
  const auto wrong = check_program(swapped);
  REQUIRE_FALSE(wrong.empty());
  CHECK(wrong.front().find("the receive expects link") != std::string::npos);
  CHECK(check_program(nowhere).front().find("names no link of its module") != std::string::npos);
}

TEST_CASE("an encoder's tokens reach a projector on ranks of its own at the projector's width") {
  // The ViT's 8 x 8 patches merged 2 x 2: 16 tokens an image of 4 x 128 values each.
  std::string model = kVlm;
  const auto replace = [&](const std::string& from, const std::string& to) {
    model.replace(model.find(from), from.size(), to);
  };
  replace(R"("image_size": 64})", R"("image_size": 64, "spatial_merge": 2})");
  replace(R"("in": 128)", R"("in": 512)");
  Case c = make(
      model.c_str(),
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 1}, "proj": {"dp": 1}, "llm": {"dp": 1}}})");
  const Program p = lowered(c);
  double sent = 0;
  for (const auto& ops : p.ranks)
    for (const Op& op : ops)
      if (op.kind == OpKind::kSend && op.purpose == Purpose::kBoundary && op.phase == Phase::kF &&
          p.modules[static_cast<std::size_t>(op.module)] == "vision")
        sent += op.message_bytes;
  CHECK(sent == doctest::Approx(4.0 * 16 * 512 * 2));  // 4 images, bf16
}

TEST_CASE("a resampler: its FLOPs by hand, queries per piece to the LLM, patches from the ViT") {
  // kVlm's projector as a resampler of 4 queries at width 256 (in 128), then a 256 -> 256
  // matrix: each 64 px image is 64 patches of the ViT and 4 tokens of the LLM.
  std::string model = kVlm;
  const std::string from = R"("projector": {"in": 128, "out": 256})";
  model.replace(model.find(from), from.size(),
                R"("projector": {"in": 128, "out": 256, "layers": 1, "bias": false,
                                 "queries": 4, "query_heads": 2})");
  Case c = make(
      model.c_str(),
      R"({"global_batch": 2, "max_seq_len": 1024, "samples": {"text_tokens": 60, "image": {"count": 2, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 1}, "proj": {"dp": 1}, "llm": {"dp": 1}}})");
  const Program p = lowered(c);
  CHECK(p.llm_tokens == 2 * (60 + 2 * 4));
  const double d = 256, in = 128, tokens_in = 2 * 2 * 64.0, tokens_out = 2 * 2 * 4.0;
  double proj_f = 0, from_vision = 0, from_proj = 0;
  for (const auto& ops : p.ranks)
    for (const Op& op : ops) {
      const std::string& name = p.modules[static_cast<std::size_t>(op.module)];
      if (op.kind == OpKind::kCompute && name == "proj" && op.phase == Phase::kF)
        proj_f += op.flops;
      if (op.kind == OpKind::kSend && op.purpose == Purpose::kBoundary && op.phase == Phase::kF)
        (name == "vision" ? from_vision : from_proj) += op.message_bytes;
    }
  // Keys and values: kv_proj (in·D) and K, V (2D²) per patch; queries: Q and the attention's
  // output (2D²) and proj (D²) per query; attention: Q·Kᵀ and P·V at width D per pair.
  const double linear = 2 * (in * d + 2 * d * d) * tokens_in + 2 * (3 * d * d) * tokens_out;
  const double attention = 4 * d * 4 * tokens_in;
  CHECK(proj_f == doctest::Approx(linear + attention).epsilon(1e-12));
  // The ViT hands the projector every patch (bf16, width in); the projector the LLM its queries.
  CHECK(from_vision == doctest::Approx(tokens_in * in * 2));
  CHECK(from_proj == doctest::Approx(tokens_out * d * 2));
  // A resampler takes one encoder's tokens as they are: no merger, no DeepStack, an encoder as
  // its only input; its heads divide its width.
  for (const auto& [edit, message] :
       {std::pair{R"("queries": 4, "query_heads": 3)", "query_heads: 3 does not divide out=256"},
        std::pair{R"("queries": 4, "merger": 64)", "a resampler (queries) takes"},
        std::pair{R"("query_heads": 2)", "query_heads: needs queries > 0"}}) {
    std::string bad = kVlm;
    bad.replace(bad.find(from), from.size(),
                std::string(R"("projector": {"in": 128, "out": 256, )") + edit + "}");
    Diagnostics diag;
    read_model(Json::parse(bad), "m.json", "", diag);
    INFO(diag.format());
    CHECK(diag.format().find(message) != std::string::npos);
  }
}

TEST_CASE("boundary links: each consumer replica's links carry its micro-batch's samples") {
  const char* workload =
      R"({"global_batch": 16, "max_seq_len": 1024, "seed": 3, "samples": {"text_tokens": {"dist": "uniform", "min": 32, "max": 300},
    "image": {"count": {"dist": "choice", "values": [0, 1, 2]}, "width": 64, "height": 64}}})";
  struct Expect {
    const char* plan;
    int64_t links_per_consumer;  // fan-in degree, or 1
  };
  for (
      const Expect& e : {
          Expect{
              R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 4}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})",
              2},
          Expect{
              R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2, "pp": 2}, "llm": {"tp": 2, "cp": 2, "dp": 4}}})",
              1},
          Expect{
              R"({"placement": "colocated", "schedule": "three_phase", "modules": {"vision": {"dp": 8}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})",
              4},
      }) {
    INFO(e.plan);
    const Case c = make(kVlm, workload, e.plan);
    const Program p = lowered(c);
    REQUIRE_FALSE(p.links.empty());
    // (micro-batch, consumer replica) -> producer replica -> samples
    std::map<std::pair<int32_t, int64_t>, std::map<int64_t, std::vector<int32_t>>> into;
    for (const BoundaryLink& link : p.links) {
      CHECK(p.modules[static_cast<std::size_t>(link.producer)] == "proj");
      CHECK(p.modules[static_cast<std::size_t>(link.consumer)] == "llm");
      CHECK(into[{link.microbatch, link.consumer_replica}]
                .emplace(link.producer_replica, link.samples)
                .second);
    }
    const auto& llm = p.llm_microbatches;
    CHECK(into.size() == llm.size() * llm.front().size());
    for (const auto& [at, links] : into) {
      CHECK(static_cast<int64_t>(links.size()) == e.links_per_consumer);
      // In order of producer replica, the links' samples are the consumer's micro-batch.
      std::vector<int32_t> assembled;
      for (const auto& [producer, samples] : links)
        assembled.insert(assembled.end(), samples.begin(), samples.end());
      std::vector<int32_t> expected =
          llm[static_cast<std::size_t>(at.second)][static_cast<std::size_t>(at.first)];
      std::sort(assembled.begin(), assembled.end());
      std::sort(expected.begin(), expected.end());
      CHECK(assembled == expected);
    }
    // Every boundary message names its link, and the link's ends are the message's ranks'
    // replicas (checked by check_program in lowered(): both ends name the same link).
    int64_t messages = 0;
    for (const auto& ops : p.ranks)
      for (const Op& op : ops)
        if ((op.kind == OpKind::kSend || op.kind == OpKind::kRecv) &&
            op.purpose == Purpose::kBoundary) {
          ++messages;
          REQUIRE(op.link >= 0);
          CHECK(p.links[static_cast<std::size_t>(op.link)].microbatch == op.microbatch);
        }
    CHECK(messages > 0);
  }
}

TEST_CASE("chunk layers: each stage's chunks hold the plan's layers") {
  Case c = make(
      kTextModel, kUniformText,
      R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"pp": 2, "vpp": 2}})");
  const Program p = lowered(c);
  // 8 layers over 4 virtual stages: chunk c of stage s holds virtual stage c * 2 + s.
  REQUIRE(p.chunk_layers.size() == 4);
  for (const ChunkLayers& held : p.chunk_layers) {
    const int32_t k = held.chunk * 2 + held.stage;
    CHECK(held.first_layer == 2 * k);
    CHECK(held.end_layer == 2 * k + 2);
  }
  CHECK(find_chunk_layers(p, 0, 1, 1)->first_layer == 6);
  CHECK(find_chunk_layers(p, 0, 2, 0) == nullptr);
  // A projector in its encoder's last stage holds none of the encoder's layers, even where the
  // frozen-aware split gives that stage some.
  const Case v = make(
      kVlm,
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"pp": 2}, "llm": {"pp": 2}}})");
  const Program nc = lowered(v);
  REQUIRE(find_chunk_layers(nc, 1, 1, 0) != nullptr);
  CHECK(find_chunk_layers(nc, 1, 1, 0)->end_layer == 0);
  CHECK(find_chunk_layers(nc, 0, 1, 0)->end_layer == 4);
  for (const Op& op : nc.ranks[1])
    if (op.kind == OpKind::kCompute && op.module == 1) CHECK(op.layers == 0);
}

TEST_CASE("cost model: ring all-reduce and p2p times") {
  ClusterSpec cl = cluster(8);
  cl.nodes = 2;
  cl.devices_per_node = 4;
  cl.inter_node = NetworkSpec{};
  cl.inter_node.link = {2.5e10, 5e-6};
  CostParams params;
  params.bandwidth_efficiency = 1;
  const CostModel cost(cl, DType::kBf16, params, ModelSpec{});
  // 4 ranks in one node: 2(n-1) latency steps + 2(n-1)/n * S / B.
  const double bytes = 1e9;
  CHECK(cost.collective_s(CollectiveKind::kAllReduce, {0, 1, 2, 3}, bytes) ==
        doctest::Approx(6 * 1e-6 + 1.5 * bytes / 1e11));
  // Across nodes the NIC bandwidth and latency apply.
  CHECK(cost.collective_s(CollectiveKind::kAllReduce, {0, 4}, bytes) ==
        doctest::Approx(2 * 5e-6 + 1.0 * bytes / 2.5e10));
  CHECK(cost.collective_s(CollectiveKind::kAllGather, {0, 1, 2, 3}, bytes) ==
        doctest::Approx(3e-6 + 0.75 * bytes / 1e11));
  CHECK(cost.p2p_s(0, 5, 1e6) == doctest::Approx(5e-6 + 1e6 / 2.5e10));
  CHECK(cost.collective_s(CollectiveKind::kAllReduce, {3}, bytes) == 0);
}

TEST_CASE(
    "regression: fan-in with fewer samples per micro-batch than encoder replicas spreads the "
    "samples") {
  // 8 ViT replicas feed 1 LLM replica whose micro-batches hold 1 sample each: every ViT replica
  // must encode exactly one sample (a contiguous slice per micro-batch gave all 8 to the last).
  for (
      const char* plan :
      {R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "llm": {"pp": 8}}, "micro_batch_size": 1})",
       R"({"placement": "non_colocated", "modules": {"vision": {"dp": 8}, "llm": {"pp": 8}}, "micro_batch_size": 1})"}) {
    INFO(plan);
    Case c = make(
        kVlm,
        R"({"global_batch": 8, "max_seq_len": 1024, "samples": {"text_tokens": 16, "image": {"count": 1, "width": 64, "height": 64}}})",
        plan);
    const Program p = lowered(c);
    for (int64_t r = 0; r < 8; ++r) {
      int64_t tokens = 0;
      for (const Op& op : p.ranks[static_cast<std::size_t>(r)])
        if (op.kind == OpKind::kCompute && op.module == 0 && op.phase == Phase::kF)
          tokens += op.tokens;
      CHECK(tokens == 64);  // one 64x64 image = 8x8 patches
    }
  }
}

TEST_CASE("LLaVA-1.5-7B: FLOPs of one sample (one 336px image, 100 text tokens) by hand") {
  Diagnostics diag;
  const auto model =
      load_model(std::string(TESSERA_SOURCE_DIR) + "/scenarios/models/llava-1.5-7b.json", diag);
  REQUIRE(model.has_value());
  Case c;
  c.model = *model;
  c.workload = read_workload(Json::parse(R"({"global_batch": 1, "max_seq_len": 4096,
    "samples": {"text_tokens": 100, "image": {"count": 1, "width": 336, "height": 336}}})"),
                             "w", "", ".", diag);
  c.plan = read_plan(Json::parse(R"({"placement": "homogeneous", "layout": {}})"), "p", "", diag);
  c.cluster = cluster(1);
  REQUIRE(diag.ok());
  const Program p = lowered(c);
  double vit_f = 0, proj = 0, llm = 0, vit_backward = 0;
  for (const Op& op : p.ranks[0]) {
    if (op.kind != OpKind::kCompute) continue;
    if (op.module == 0) (op.phase == Phase::kF ? vit_f : vit_backward) += op.flops;
    if (op.module == 1) proj += op.flops;
    if (op.module == 2) llm += op.flops;
  }
  // ViT-L/14-336, frozen with nothing trainable before it: forward only. 577 tokens (CLS),
  // bidirectional attention over the image: per layer 2·(4h² + 2·h·4h)·577 + 4·h·577².
  const double h = 1024, vit_tokens = 577;
  const double vit_layer =
      2 * (4 * h * h + 2 * h * 4096) * vit_tokens + 4 * h * vit_tokens * vit_tokens;
  const double patch = 2 * 3 * 14 * 14 * h * vit_tokens;
  CHECK(vit_f == doctest::Approx(24 * vit_layer + patch).epsilon(1e-12));
  CHECK(vit_backward == 0);
  // Projector 1024 -> 4096 -> 4096 on 576 tokens, trainable: F + B + W = 3 forwards.
  CHECK(proj == doctest::Approx(3 * 2 * (1024 * 4096.0 + 4096 * 4096.0) * 576).epsilon(1e-12));
  // Vicuna-7B on 676 tokens under the multimodal mask: 576² image pairs (bidirectional) +
  // 100·576 text-to-image + 100·101/2 causal text pairs.
  const double H = 4096, tokens = 676, pairs = 576.0 * 576 + 100.0 * 576 + 100.0 * 101 / 2;
  const double linear = 32 * 2 * (4 * H * H + 3 * H * 11008) * tokens + 2 * H * 32064 * tokens;
  const double attention = 32 * 4 * H * pairs;
  // F = linear + attention, B = linear + 2·attention, W = linear.
  CHECK(llm == doctest::Approx(3 * linear + 3 * attention).epsilon(1e-12));
  CHECK(p.llm_tokens == 676);
}

TEST_CASE("graph-aware 1F1B and three-phase timelines, hand-drawn with free communication") {
  // ViT -> LLM stage 0 -> LLM stage 1: LLM stage 1 starts micro-batch 0 the moment ViT F0 and
  // LLM s0 F0 are done, and the ViT's first backward waits for LLM s0's B0.
  Case v = make(
      kVlm,
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 32, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 1}, "llm": {"pp": 2, "dp": 1}}, "num_micro_batches": 4})");
  v.model.modules[0].frozen = false;
  const Program p = lowered(v);
  const Timeline t = evaluate(p, ideal(v));
  REQUIRE(t.error.empty());
  auto find = [&](int32_t rank, const std::string& name) {
    const auto& ops = p.ranks[static_cast<std::size_t>(rank)];
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (op_name(p, ops[i]) == name) return t.ops[static_cast<std::size_t>(rank)][i];
    FAIL("no op " << name << " on rank " << rank);
    return OpTime{};
  };
  const OpTime proj_f0 = find(0, "proj.s0.mb0.F");
  const OpTime s0_f0 = find(1, "llm.s0.mb0.F");
  CHECK(s0_f0.start_s == doctest::Approx(proj_f0.finish_s));
  CHECK(find(2, "llm.s1.mb0.F").start_s == doctest::Approx(s0_f0.finish_s));
  CHECK(find(0, "proj.s0.mb0.B").start_s >= find(1, "llm.s0.mb0.B").finish_s);
  CHECK(find(0, "vision.s0.mb0.B").start_s == doctest::Approx(find(0, "proj.s0.mb0.W").finish_s));

  // Three-phase colocated: the LLM starts after the boundary gather; the ViT backward waits for
  // the last LLM backward of its rank and the gradient gather.
  Case c = make(
      kVlm,
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 32, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "colocated", "schedule": "three_phase", "modules": {"vision": {"dp": 2}, "llm": {"pp": 2}}})");
  c.model.modules[0].frozen = false;
  const Program q = lowered(c);
  const Timeline u = evaluate(q, ideal(c));
  REQUIRE(u.error.empty());
  auto at = [&](int32_t rank, const std::string& name) {
    const auto& ops = q.ranks[static_cast<std::size_t>(rank)];
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (op_name(q, ops[i]) == name) return u.ops[static_cast<std::size_t>(rank)][i];
    FAIL("no op " << name << " on rank " << rank);
    return OpTime{};
  };
  // Rank 1's encoder replica sends its rows to the LLM's first stage on rank 0.
  const OpTime rows = at(0, "recv:proj.s0.mb0.F<r1");
  CHECK(rows.finish_s >= at(1, "proj.s0.F").finish_s);
  CHECK(at(0, "llm.s0.mb0.F").start_s >= rows.finish_s);
  // The encoder backward waits for the gradients of every micro-batch from the first stage.
  CHECK(at(0, "proj.s0.B").start_s >= at(0, "llm.s0.mb3.W").finish_s);
  CHECK(at(1, "proj.s0.B").start_s >= at(1, "recv:proj.s0.mb3.B<r0").finish_s);
  CHECK(at(1, "recv:proj.s0.mb3.B<r0").finish_s >= at(0, "llm.s0.mb3.W").finish_s);
}

TEST_CASE("a generator after the LLM lowers in every placement") {
  const char* model = R"({"name": "gen", "modules": [
    {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
     "transformer": {"layers": 2, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm"},
     "patching": {"patch_size": 8, "resize": "fixed", "image_size": 64}},
    {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 128, "out": 256}},
    {"name": "llm", "role": "llm", "inputs": ["proj"], "frozen": true,
     "transformer": {"layers": 4, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1000}},
    {"name": "decoder", "role": "generator", "modality": "image", "inputs": ["llm"],
     "transformer": {"layers": 2, "hidden": 256, "heads": 8, "ffn": 1024}}]})";
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 40, "image": {"count": 1, "width": 64, "height": 64}}})";
  for (
      const char* plan :
      {R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}})",
       R"({"placement": "colocated", "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}}})",
       R"({"placement": "non_colocated", "modules": {"vision": {"dp": 2}, "llm": {"pp": 2, "dp": 2}, "decoder": {"dp": 2}}})",
       R"({"placement": "non_colocated", "modules": {"vision": {"dp": 2}, "llm": {"pp": 2, "dp": 2}}})"}) {
    INFO(plan);
    Case c = make(model, workload, plan);
    const Program p = lowered(c);
    CHECK(evaluate(p, ideal(c)).error.empty());
    // The trainable generator gets weight gradients; the frozen LLM gets none, but passes input
    // gradients (B) back because the projector before it trains.
    int generator_w = 0, llm_b = 0, llm_w = 0;
    for (const auto& ops : p.ranks)
      for (const Op& op : ops) {
        if (op.kind != OpKind::kCompute) continue;
        if (op.module == 3 && op.phase == Phase::kW) ++generator_w;
        if (op.module == 2 && op.phase == Phase::kB) ++llm_b;
        if (op.module == 2 && op.phase == Phase::kW) ++llm_w;
      }
    CHECK(generator_w > 0);
    CHECK(llm_b > 0);
    CHECK(llm_w == 0);
  }
}

TEST_CASE("lowering_refusal: the validated plans lower() cannot express, each with its reason") {
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 40, "image": {"count": 1, "width": 64, "height": 64}}})";
  const std::vector<std::pair<const char*, const char*>> refused = {
      {R"({"placement": "homogeneous", "schedule": "dip", "layout": {"pp": 2, "cp": 2}})",
       "schedule dip with context parallelism (cp > 1) is not lowered yet"},
      {R"({"placement": "non_colocated", "microbatching": "entrain", "modules": {"vision": {"dp": 1}, "llm": {"dp": 2}}})",
       "microbatching entrain: vision has fewer replicas (1) than the LLM (2)"},
      {R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "microbatching": "entrain", "layout": {"pp": 2, "vpp": 2}})",
       "microbatching entrain with interleaved 1F1B (vpp > 1) is not lowered yet"},
  };
  for (const auto& [plan, reason] : refused) {
    INFO(std::string(plan));
    const Case c = make(kVlm, workload, plan);
    const std::string why = lowering_refusal(c.plan, c.model);
    CHECK(why.starts_with(reason));
    const Lowered l =
        lower(c.model, c.cluster, resolve_stage_split(c.plan, c.model, c.workload, c.cluster),
              c.workload, draw_batch(c.workload, 0));
    CHECK(l.error == why);
    CHECK(l.program.ranks.empty());
  }
  // The same model and workload with a plan it can express: no reason, a Program.
  const Case ok = make(
      kVlm, workload,
      R"({"placement": "non_colocated", "microbatching": "entrain", "modules": {"vision": {"dp": 2}, "llm": {"dp": 2}}})");
  CHECK(lowering_refusal(ok.plan, ok.model).empty());
  CHECK_FALSE(lowered(ok).ranks.empty());
}

TEST_CASE(
    "memory model: mixed-precision Adam holds 18 bytes per trainable parameter, 6 + 12/dp "
    "sharded") {
  const RankMemory full = parameter_memory(1e9, true, 1, DType::kBf16, false, 4);
  CHECK(full.total() == doctest::Approx(18e9));
  const RankMemory sharded = parameter_memory(1e9, true, 8, DType::kBf16, false, 4);
  CHECK(sharded.total() == doctest::Approx((6 + 12.0 / 8) * 1e9));
  const RankMemory frozen = parameter_memory(1e9, false, 8, DType::kBf16, false, 4);
  CHECK(frozen.total() == doctest::Approx(2e9));

  // Lowered: a distributed optimizer divides only the optimizer state by the dp·cp group.
  Case c =
      make(kTextModel, kUniformText,
           R"({"placement": "homogeneous", "layout": {"dp": 4}, "distributed_optimizer": true})");
  const Program p = lowered(c);
  const double params = static_cast<double>(model_parameters(c.model));
  REQUIRE(c.model.dtype == DType::kBf16);
  CHECK(p.memory[0].weight_bytes == doctest::Approx(2 * params));
  // Megatron-LM keeps the gradients in the dtype it reduces them in: the model's bf16 by
  // default, fp32 with grad_reduce_in_fp32; a PyTorch-native stack keeps fp32 gradients.
  CHECK(p.memory[0].gradient_bytes == doctest::Approx(2 * params));
  CHECK(p.memory[0].optimizer_bytes == doctest::Approx(12 * params / 4));
  Case fp32_reduction = c;
  fp32_reduction.plan.grad_reduce_in_fp32 = true;
  CHECK(lowered(fp32_reduction).memory[0].gradient_bytes == doctest::Approx(4 * params));
  Case pytorch = c;
  pytorch.plan.framework = Framework::kPytorch;
  CHECK(lowered(pytorch).memory[0].gradient_bytes == doctest::Approx(4 * params));
}

TEST_CASE("regression: a non-colocated producer of an interleaved LLM does not deadlock") {
  // The graph-aware warm-up let the ViT run 2 forwards ahead, but the interleaved LLM's first
  // stage needs 3 micro-batches before its first backward: a circular wait.
  Case c = make(
      kVlm,
      R"({"global_batch": 16, "max_seq_len": 1024, "samples": {"text_tokens": 32, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "interleaved_1f1b", "micro_batch_size": 1,
                    "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "vpp": 2, "dp": 2}}})");
  c.model.modules[0].frozen = false;
  const Timeline t = evaluate(lowered(c), ideal(c));
  CHECK(t.error.empty());
}

TEST_CASE("context_split: every token on exactly one CP rank; zigzag pairs chunk i with 2cp-1-i") {
  for (CpSplit policy : {CpSplit::kUniform, CpSplit::kZigzag, CpSplit::kMakespan})
    for (int64_t tokens : {0, 1, 7, 81, 128})
      for (int64_t cp : {1, 2, 3, 4}) {
        const auto split = context_split(policy, tokens, cp);
        REQUIRE(split.size() == static_cast<std::size_t>(cp));
        std::vector<int> seen(static_cast<std::size_t>(tokens), 0);
        int64_t most = 0, least = tokens;
        for (const auto& part : split) {
          CHECK(std::is_sorted(part.begin(), part.end()));
          for (int64_t t : part) ++seen[static_cast<std::size_t>(t)];
          most = std::max<int64_t>(most, static_cast<int64_t>(part.size()));
          least = std::min<int64_t>(least, static_cast<int64_t>(part.size()));
        }
        CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
        CHECK(most - least <= 2);
      }
  // 8 tokens, cp 2: chunks of 2; rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2.
  const auto z = context_split(CpSplit::kZigzag, 8, 2);
  CHECK(z[0] == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(z[1] == std::vector<int64_t>{2, 3, 4, 5});
}

namespace {

// One sample: `media` tokens of one image item, then `text` tokens.
std::vector<TokenTag> sequence(int64_t media, int64_t text, int32_t sample = 0, int32_t item = 0) {
  std::vector<TokenTag> tags;
  for (int64_t t = 0; t < media; ++t) tags.push_back({sample, item});
  for (int64_t t = 0; t < text; ++t) tags.push_back({sample, -1});
  return tags;
}

double imbalance(const std::vector<TokenTag>& tags, CpSplit policy, int64_t cp) {
  const std::vector<double> work = cp_attention_work(tags, context_split(policy, tags, cp));
  double most = 0, sum = 0;
  for (double w : work) {
    most = std::max(most, w);
    sum += w;
  }
  return most / (sum / static_cast<double>(work.size()));
}

}  // namespace

TEST_CASE("multimodal mask: text attends causally within its sample, media within its item") {
  std::vector<TokenTag> tags = sequence(3, 2, 0, 0);                 // tokens 0-2 image, 3-4 text
  for (const TokenTag& t : sequence(2, 1, 1, 1)) tags.push_back(t);  // 5-6 image, 7 text
  const std::vector<KeySpan> keys = attended_keys(tags);
  CHECK(keys[0].first == 0);
  CHECK(keys[0].last == 2);  // an image token: its whole item, both ways
  CHECK(keys[4].first == 0);
  CHECK(keys[4].last == 4);  // text: everything before it in its sample
  CHECK(keys[5].first == 5);
  CHECK(keys[5].last == 6);
  CHECK(keys[7].first == 5);
  CHECK(keys[7].last == 7);  // the second sample starts afresh
  // Pairs per rank add up to the mask's pairs whatever the split.
  const std::vector<double> w = cp_attention_work(tags, context_split(CpSplit::kUniform, tags, 2));
  CHECK(w[0] + w[1] == 3 * 3 + 4 + 5 + 2 * 2 + 3);
}

TEST_CASE("makespan CP split (LPT over 128-token blocks): every token once, balanced work") {
  // A causal text sequence: the uniform split leaves the last rank with most of the work, zigzag
  // and makespan balance it.
  const std::vector<TokenTag> text = sequence(0, 2048);
  for (int64_t cp : {2, 4}) {
    CHECK(imbalance(text, CpSplit::kUniform, cp) > 1.3);
    CHECK(imbalance(text, CpSplit::kMakespan, cp) < 1.1);
  }
  // A multimodal sample — a 1024-token image (bidirectional) then 1024 text tokens — and a
  // text-only one: zigzag, made for a causal mask, is off; makespan balances to within 10%.
  std::vector<TokenTag> mixed = sequence(1024, 1024, 0, 0);
  for (const TokenTag& t : sequence(0, 1536, 1)) mixed.push_back(t);
  for (int64_t cp : {2, 4, 8}) {
    const auto split = context_split(CpSplit::kMakespan, mixed, cp);
    std::vector<int> seen(mixed.size(), 0);
    for (const auto& part : split) {
      CHECK(std::is_sorted(part.begin(), part.end()));
      for (int64_t t : part) ++seen[static_cast<std::size_t>(t)];
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    CHECK(imbalance(mixed, CpSplit::kMakespan, cp) < 1.1);
    CHECK(imbalance(mixed, CpSplit::kMakespan, cp) <=
          imbalance(mixed, CpSplit::kZigzag, cp) + 1e-9);
  }
  // LPT on hand cases: the costliest item first, each to the least-loaded bin.
  CHECK(lpt_assign({5, 9, 13}, 2) == std::vector<std::vector<int64_t>>{{2}, {0, 1}});
  CHECK(lpt_assign({5, 5, 4, 3, 3}, 2) == std::vector<std::vector<int64_t>>{{0, 2}, {1, 3, 4}});
  CHECK(lpt_assign({1, 1, 1}, 4) == std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {}});
  // Never worse than zigzag or uniform for the most loaded rank (it keeps the better of them
  // when 128-token blocks are too coarse, as for 384 causal tokens on 2 ranks).
  for (const auto& tags : {sequence(0, 384), mixed}) {
    const std::vector<double> made =
        cp_attention_work(tags, context_split(CpSplit::kMakespan, tags, 2));
    const std::vector<double> zig =
        cp_attention_work(tags, context_split(CpSplit::kZigzag, tags, 2));
    CHECK(*std::max_element(made.begin(), made.end()) <=
          *std::max_element(zig.begin(), zig.end()) * 1.02);
  }
  // Shorter than 128·cp: the uniform split.
  CHECK(context_split(CpSplit::kMakespan, sequence(0, 200), 2) ==
        context_split(CpSplit::kUniform, 200, 2));
}

TEST_CASE("lower() charges each CP rank its own tokens and attention under the split") {
  const char* workload = R"({"global_batch": 4, "max_seq_len": 2048, "seed": 5,
    "samples": {"text_tokens": {"dist": "uniform", "min": 1500, "max": 2000}}})";
  for (const char* split : {"uniform", "makespan"}) {
    const Case c =
        make(kTextModel, workload,
             (std::string(R"({"placement": "homogeneous", "layout": {"cp": 2}, "cp_split": ")") +
              split + "\"}")
                 .c_str());
    const Lowered l =
        lower(c.model, c.cluster, resolve_stage_split(c.plan, c.model, c.workload, c.cluster),
              c.workload, draw_batch(c.workload, 0));
    REQUIRE(l.error.empty());
    double f0 = 0, f1 = 0;
    for (const Op& op : l.program.ranks[0])
      if (op.kind == OpKind::kCompute && op.phase == Phase::kF) f0 += op.flops;
    for (const Op& op : l.program.ranks[1])
      if (op.kind == OpKind::kCompute && op.phase == Phase::kF) f1 += op.flops;
    // Causal text: the uniform split's second rank attends to more keys; makespan evens it out.
    if (std::string(split) == "uniform")
      CHECK(f1 > 1.05 * f0);
    else
      CHECK(std::abs(f1 - f0) < 0.05 * f0);
  }
}

TEST_CASE("the CP balance note: mean over micro-batches and the worst CP group, against uniform") {
  Diagnostics diag;
  auto s =
      load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cornstarch/cp-long.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  s->plan->layout.tp = 2;
  s->plan->layout.cp = 2;
  s->plan->layout.dp = 2;
  for (CpSplit policy : {CpSplit::kUniform, CpSplit::kZigzag, CpSplit::kMakespan}) {
    s->plan->cp_split = policy;
    const Lowered l = lower(s->model, s->cluster,
                            resolve_stage_split(*s->plan, s->model, s->workload, s->cluster),
                            s->workload, draw_batch(s->workload, 0));
    REQUIRE(l.error.empty());
    std::string note;
    for (const std::string& n : l.notes)
      if (n.rfind("cp_split", 0) == 0) note = n;
    INFO(note);
    double mean = 0, uniform = 0, worst = 0, worst_uniform = 0;
    int micro_batches = 0, groups = 0;
    const std::string format =
        "cp_split " + enum_name(policy, kCpSplits) +
        ": attention work max/mean over the CP ranks %lf (uniform split: %lf), "
        "mean of %d micro-batches; worst of %d CP groups %lf (uniform: %lf)";
    REQUIRE(std::sscanf(note.c_str(), format.c_str(), &mean, &uniform, &micro_batches, &groups,
                        &worst, &worst_uniform) == 6);
    CHECK(micro_batches == 4);  // 2 per replica
    CHECK(groups == 2);
    CHECK(worst >= mean - 1e-3);
    // One image-then-text sequence per micro-batch: the uniform split leaves the last rank the
    // text that attends to everything; the other policies balance it.
    CHECK(uniform > 1.4);
    if (policy == CpSplit::kUniform)
      CHECK(mean == doctest::Approx(uniform));
    else
      CHECK(mean < 1.1);
  }
}

TEST_CASE("microbatching entrain: encoders run level 1, the LLM level 2; backward waits for both") {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json", diag);
  REQUIRE(s.has_value());
  ParallelPlan plan;
  plan.layout.pp = 2;
  plan.micro_batch_size = 2;
  plan.schedule = Schedule::k1F1B;
  plan.microbatching = MicrobatchPolicy::kEntrain;
  WorkloadSpec w = s->workload;
  w.global_batch = 16;  // 8 micro-batches of 2
  s->workload = w;
  bool deferred_somewhere = false;
  for (int64_t iteration = 0; iteration < 6; ++iteration) {
    const Batch batch = draw_batch(w, iteration);
    const Lowered l =
        lower(s->model, s->cluster, resolve_stage_split(plan, s->model, w, s->cluster), w, batch);
    REQUIRE(l.error.empty());
    const EntrainAssignment a = entrain_assignment(batch, s->model, 1, 8, w.max_seq_len);
    deferred_somewhere |= a.encoder != a.llm;
    auto tokens = [&](const ModuleSpec& m, const std::vector<int32_t>& ids) {
      std::vector<const Sample*> samples;
      for (int32_t id : ids) samples.push_back(&batch.samples[static_cast<std::size_t>(id)]);
      return module_work(s->model, m, samples, w.max_seq_len).tokens;
    };
    const int llm = static_cast<int>(find_llm(s->model) - s->model.modules.data());
    std::map<int32_t, std::size_t> llm_backward_at, projector_backward_at;
    const auto& ops = l.program.ranks[0];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (op.kind != OpKind::kCompute) continue;
      const ModuleSpec& m = s->model.modules[static_cast<std::size_t>(op.module)];
      const auto mb = static_cast<std::size_t>(op.microbatch);
      if (op.phase == Phase::kF && op.module == llm) CHECK(op.tokens == tokens(m, a.llm[0][mb]));
      if (op.phase == Phase::kF && m.role == ModuleRole::kEncoder)
        CHECK(op.tokens == tokens(m, a.encoder[0][mb]));
      if (op.phase == Phase::kB && op.module == llm) llm_backward_at[op.microbatch] = i;
      if (op.phase == Phase::kB && m.role == ModuleRole::kProjector)
        projector_backward_at[op.microbatch] = i;
    }
    // The projector's backward of encoder micro-batch i follows the LLM backward of every
    // micro-batch holding its samples.
    REQUIRE(projector_backward_at.size() == 8);
    for (int32_t i = 0; i < 8; ++i)
      for (int32_t j = 0; j < 8; ++j)
        for (int32_t sample : a.encoder[0][static_cast<std::size_t>(i)])
          if (std::count(a.llm[0][static_cast<std::size_t>(j)].begin(),
                         a.llm[0][static_cast<std::size_t>(j)].end(), sample) > 0)
            CHECK(projector_backward_at.at(i) > llm_backward_at.at(j));
    // The program runs to the end.
    const ParallelPlan resolved = resolve_stage_split(plan, s->model, s->workload, s->cluster);
    CHECK(estimate(*s, resolved, iteration, default_cost_params(s->cluster)).metrics.step_s > 0);
  }
  CHECK(deferred_somewhere);
  // Non-colocated with fan-in (2 ViT replicas per LLM replica) runs too; fan-out is refused.
  ParallelPlan nc;
  nc.placement = Placement::kNonColocated;
  nc.schedule = Schedule::kGraph1F1B;
  nc.micro_batch_size = 2;
  nc.microbatching = MicrobatchPolicy::kEntrain;
  ModuleLayout vision, llm_layout;
  vision.dp = 2;
  llm_layout.pp = 2;
  nc.modules = {{"vision", vision}, {"llm", llm_layout}};
  CHECK(estimate(*s, resolve_stage_split(nc, s->model, s->workload, s->cluster), 0,
                 default_cost_params(s->cluster))
            .metrics.step_s > 0);
  nc.modules = {{"vision", ModuleLayout{}}, {"llm", ModuleLayout{}}};
  nc.modules[1].second.dp = 2;
  const Lowered refused = lower(
      s->model, s->cluster, resolve_stage_split(nc, s->model, w, s->cluster), w, draw_batch(w, 0));
  CHECK(refused.error.find("Entrain needs each encoder replica to feed whole LLM micro-batches") !=
        std::string::npos);
}

TEST_CASE("every compute op names its layer range: the virtual stages tile the layer stack") {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/default.json", diag);
  REQUIRE(s.has_value());
  for (const int64_t vpp : {1, 2}) {
    ParallelPlan plan = *s->plan;
    plan.layout.vpp = vpp;
    if (vpp > 1) plan.schedule = Schedule::kInterleaved1F1B;
    plan.stage_split = StageSplit::kUniform;
    plan.layout.stage_layers.clear();
    const Lowered lowered =
        lower(s->model, s->cluster, resolve_stage_split(plan, s->model, s->workload, s->cluster),
              s->workload, draw_batch(s->workload, 0));
    REQUIRE(lowered.error.empty());
    const Program& p = lowered.program;
    const auto llm = static_cast<int16_t>(std::find(p.modules.begin(), p.modules.end(), "llm") -
                                          p.modules.begin());
    std::map<int64_t, std::pair<int32_t, int32_t>> range;  // virtual stage -> (first, layers)
    for (const auto& ops : p.ranks)
      for (const Op& op : ops)
        if (op.kind == OpKind::kCompute && op.module == llm) {
          const int64_t v = op.chunk * plan.layout.pp + op.stage;
          const auto [it, added] = range.emplace(v, std::make_pair(op.first_layer, op.layers));
          CHECK(it->second == std::make_pair(op.first_layer, op.layers));  // one range per stage
        }
    REQUIRE(static_cast<int64_t>(range.size()) == plan.layout.pp * vpp);
    int32_t next = 0;
    for (const auto& [v, r] : range) {
      CHECK(r.first == next);
      next += r.second;
    }
    CHECK(next == s->model.modules.back().transformer->layers);
  }
}

TEST_CASE(
    "scatter-gather: without SP each TP rank sends 1/tp of a stage's activation, the consumer "
    "all-gathers it") {
  // Text only, 256 tokens per micro-batch, hidden 256, bf16: a whole activation is 128 KiB.
  const double whole = 256.0 * 256 * 2;
  struct Row {
    const char* plan;
    double message;  // bytes per send
    bool gathered;   // the consumer starts with an all-gather over its TP group
  };
  for (const Row& row : {
           Row{R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2}})", whole / 2, true},
           Row{R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2},
                   "pipeline_scatter_gather": false})",
               whole, false},
           Row{R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2},
                   "sequence_parallel": true})",
               whole / 2, false},
           Row{R"({"placement": "homogeneous", "layout": {"pp": 2}})", whole, false},
       }) {
    INFO(row.plan);
    const Case c = make(kTextModel, kUniformText, row.plan);
    const Program p = lowered(c);
    int sends = 0, gathers = 0;
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      const auto& ops = p.ranks[r];
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        if (op.kind == OpKind::kSend && op.purpose == Purpose::kPp) {
          ++sends;
          CHECK(op.message_bytes == doctest::Approx(row.message));
          CHECK(((op.flags & kOpTpScattered) != 0) == row.gathered);
          if (row.gathered)  // the sender's own TP group
            CHECK(p.groups[static_cast<std::size_t>(op.group)] ==
                  RankList{static_cast<int64_t>(r - r % 2), static_cast<int64_t>(r - r % 2 + 1)});
        }
        if (op.kind != OpKind::kRecv || op.purpose != Purpose::kPp) continue;
        // The next compute op consumes the message; it gathers a slice first.
        std::size_t next = i + 1;
        while (ops[next].kind != OpKind::kCompute) ++next;
        const auto gather =
            std::find_if(ops[next].nested.begin(), ops[next].nested.end(),
                         [](const NestedCollective& n) { return n.purpose == Purpose::kPp; });
        CHECK((gather != ops[next].nested.end()) == row.gathered);
        if (gather == ops[next].nested.end()) continue;
        ++gathers;
        CHECK(gather == ops[next].nested.begin());  // before the layers' collectives
        CHECK(gather->kind == CollectiveKind::kAllGather);
        CHECK(gather->group == op.group);
        CHECK(gather->bytes == doctest::Approx(whole));
        double calls = 0;
        for (const NestedCollective& n : ops[next].nested) calls += n.count;
        CHECK(nested_calls(ops[next]) == calls - 1);  // no stall among the layers' kernels
      }
    }
    CHECK(sends > 0);
    CHECK(gathers == (row.gathered ? sends : 0));
  }
}

TEST_CASE("padding to the longest sample: the LLM's ops count the pads, its attention does not") {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json", diag);
  REQUIRE(s.has_value());
  ParallelPlan plan;
  plan.layout.pp = 2;
  plan.micro_batch_size = 4;
  plan.schedule = Schedule::k1F1B;
  const Batch batch = draw_batch(s->workload, 0);
  const Lowered packed =
      lower(s->model, s->cluster, resolve_stage_split(plan, s->model, s->workload, s->cluster),
            s->workload, batch);
  plan.pad_to_longest = true;
  const Lowered padded =
      lower(s->model, s->cluster, resolve_stage_split(plan, s->model, s->workload, s->cluster),
            s->workload, batch);
  REQUIRE(packed.error.empty());
  REQUIRE(padded.error.empty());
  CHECK(check_program(padded.program).empty());
  const int llm = static_cast<int>(find_llm(s->model) - s->model.modules.data());
  const ModuleSpec& llm_spec = s->model.modules[static_cast<std::size_t>(llm)];
  int64_t padded_somewhere = 0;
  for (std::size_t r = 0; r < padded.program.ranks.size(); ++r) {
    const auto& a = packed.program.ranks[r];
    const auto& b = padded.program.ranks[r];
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (a[i].kind != OpKind::kCompute) continue;
      if (a[i].module != llm) {
        CHECK(b[i].tokens == a[i].tokens);  // encoders and projectors are not padded
        continue;
      }
      // By hand: the micro-batch's samples, each brought to the longest one's length.
      int64_t longest = 0, own = 0;
      const auto& samples =
          padded.program.llm_microbatches[0][static_cast<std::size_t>(b[i].microbatch)];
      for (int32_t id : samples) {
        const Sample* one[] = {&batch.samples[static_cast<std::size_t>(id)]};
        const int64_t t = module_work(s->model, llm_spec, one, s->workload.max_seq_len).tokens;
        longest = std::max(longest, t);
        own += t;
      }
      const int64_t pads = longest * static_cast<int64_t>(samples.size()) - own;
      CHECK(a[i].tokens == own);
      CHECK(b[i].tokens == own + pads);
      CHECK(b[i].attention_pairs == doctest::Approx(a[i].attention_pairs + pads));
      if (pads > 0) CHECK(b[i].flops > a[i].flops);
      padded_somewhere += pads;
    }
  }
  CHECK(padded_somewhere > 0);
  CHECK(padded.program.llm_tokens == packed.program.llm_tokens);  // throughput counts samples' own
  // Padding with context parallelism is refused, naming the key.
  plan.layout = ModuleLayout{};
  plan.layout.cp = 2;
  Diagnostics refused;
  validate_plan(plan, s->model, s->workload, s->cluster, "p.json", "plan", refused);
  CHECK(refused.format().find("plan.pad_to_longest") != std::string::npos);
}

TEST_CASE("overlap_grad_reduce: the last backward of each chunk in bucket pieces, each reduced") {
  const char* with = R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
      "schedule": "interleaved_1f1b", "num_micro_batches": 4, "overlap_grad_reduce": true,
      "grad_bucket_mb": 1})";
  const char* without = R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
      "schedule": "interleaved_1f1b", "num_micro_batches": 4})";
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  const Case c = make(kTextModel, workload, with);
  const Case plain = make(kTextModel, workload, without);
  const Program p = lowered(c), q = lowered(plain);
  REQUIRE(p.ranks.size() == q.ranks.size());
  // A layer's gradients are 12·256² + norms ≈ 1.6 MB in bf16: one layer per 1 MB bucket.
  const int64_t layers_per_chunk = 2;  // 8 layers over 2 stages × 2 chunks
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    INFO("rank " << r);
    const auto& ops = p.ranks[r];
    double flops = 0, plain_flops = 0, reduced = 0, plain_reduced = 0;
    for (const Op& op : ops) {
      if (op.kind == OpKind::kCompute) flops += op.flops;
      if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp) reduced += op.message_bytes;
    }
    for (const Op& op : q.ranks[r]) {
      if (op.kind == OpKind::kCompute) plain_flops += op.flops;
      if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp)
        plain_reduced += op.message_bytes;
    }
    // The pieces do the same work, and the buckets hold every gradient once.
    CHECK(flops == doctest::Approx(plain_flops).epsilon(1e-12));
    CHECK(reduced == doctest::Approx(plain_reduced).epsilon(1e-12));
    std::map<int16_t, std::vector<std::pair<int32_t, int32_t>>> pieces;  // chunk -> B pieces
    int32_t norm = -1;
    std::vector<int32_t> buckets;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (op.kind == OpKind::kCollective && op.purpose == Purpose::kNorm)
        norm = static_cast<int32_t>(i);
      if ((op.flags & kOpGradientBucket) == 0) continue;
      // Every chunk's last backward is micro-batch 3's.
      if (op.kind == OpKind::kCompute) CHECK(op.microbatch == 3);
      if (op.kind == OpKind::kCompute && op.phase == Phase::kB)
        pieces[op.chunk].emplace_back(op.first_layer, op.layers);
      if (op.kind == OpKind::kCollective) {
        CHECK(op.purpose == Purpose::kDp);
        CHECK(op.collective == CollectiveKind::kAllReduce);
        // It waits for the weight gradients of its own layers, just before it.
        REQUIRE(op.deps.size() == 1);
        const Op& w = ops[static_cast<std::size_t>(op.deps[0])];
        CHECK(w.phase == Phase::kW);
        CHECK(w.first_layer == op.first_layer);
        CHECK(w.layers == op.layers);
        CHECK(op.message_bytes > 1e6);
        buckets.push_back(static_cast<int32_t>(i));
      }
    }
    // Two chunks, each in two one-layer pieces, last layer first.
    REQUIRE(pieces.size() == 2);
    for (const auto& [chunk, list] : pieces) {
      REQUIRE(static_cast<int64_t>(list.size()) == layers_per_chunk);
      CHECK(list[0].first == list[1].first + 1);
      CHECK(list[0].second == 1);
    }
    CHECK(buckets.size() == 4);
    // No reduction after the backward: the global norm waits for the buckets.
    REQUIRE(norm >= 0);
    for (int32_t b : buckets) {
      CHECK(b < norm);
      const auto& deps = ops[static_cast<std::size_t>(norm)].deps;
      CHECK(std::find(deps.begin(), deps.end(), b) != deps.end());
    }
  }
  // With a costly reduction, hiding it behind the backward shortens the step.
  CHECK(step_on_slow_network(c, p) < step_on_slow_network(c, q));
}

TEST_CASE("fully_sharded in a colocated plan: every use of a unit gathered, every module") {
  // The VLM with its ViT trained, in 0.3 MB units (one layer each). A colocated encoder runs once
  // for the whole batch: its units are gathered for that forward and that backward and reduced
  // once; the LLM's for each micro-batch's forward and backward, and reduced each time.
  const std::string model = vlm_with_trained_vit();
  const char* images = kOneOrTwoImages;
  const std::string base =
      R"({"placement": "colocated", "schedule": "three_phase", "num_micro_batches": 4,
          "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}},
          "distributed_optimizer": true, "grad_bucket_mb": 0.3)";
  const Case c = make(model.c_str(), images, (base + R"(, "fully_sharded": true})").c_str());
  const Case plain = make(model.c_str(), images, (base + "}").c_str());
  const Program p = lowered(c), q = lowered(plain);
  REQUIRE(p.ranks.size() == q.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    INFO("rank " << r);
    const auto& ops = p.ranks[r];
    double flops = 0, plain_flops = 0;
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute) flops += op.flops;
    for (const Op& op : q.ranks[r])
      if (op.kind == OpKind::kCompute) plain_flops += op.flops;
    CHECK(flops == doctest::Approx(plain_flops).epsilon(1e-12));
    // module -> its units' gathers and reduce-scatters; no whole-module collective after the
    // backward
    std::map<std::string, std::array<int, 2>> units;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp) {
        CHECK((op.flags & kOpFullySharded) != 0);
        ++units[c.model.modules[static_cast<std::size_t>(op.module)].name]
               [op.collective == CollectiveKind::kAllGather ? 0 : 1];
      }
      // Every unit's compute waits for its own gather.
      if (op.kind == OpKind::kCompute && (op.flags & kOpGradientBucket) != 0 &&
          op.phase != Phase::kW) {
        const bool waits = std::any_of(op.deps.begin(), op.deps.end(), [&](int32_t d) {
          const Op& g = ops[static_cast<std::size_t>(d)];
          return g.kind == OpKind::kCollective && g.collective == CollectiveKind::kAllGather &&
                 g.module == op.module && g.first_layer == op.first_layer;
        });
        CHECK(waits);
      }
    }
    // The ViT's 4 units: gathered for the forward and the backward, reduced once.
    CHECK(units["vision"] == std::array<int, 2>{8, 4});
    // The LLM's 4 units a stage, each used by 4 micro-batches forward and backward.
    CHECK(units["llm"] == std::array<int, 2>{32, 16});
    // The projector is one unit.
    CHECK(units["proj"] == std::array<int, 2>{2, 1});
    CHECK(p.memory[r].weight_bytes < q.memory[r].weight_bytes);
  }
  const CostModel cost(c.cluster, c.model.dtype, CostParams{}, c.model);
  CHECK(evaluate(p, cost).error.empty());
  // Under DIP each replica orders its own steps and cuts its own media: refused, naming the key.
  Case dip = make(model.c_str(), images,
                  R"({"placement": "homogeneous", "schedule": "dip", "layout": {"pp": 2, "dp": 2},
                      "distributed_optimizer": true})");
  dip.plan.fully_sharded = true;
  Diagnostics diag;
  validate_plan(dip.plan, dip.model, dip.workload, dip.cluster, "p", "", diag);
  CHECK(diag.format().find("fully_sharded") != std::string::npos);
}

TEST_CASE("overlapped reduction and parameter gathers in colocated and DIP plans, bucket-wise") {
  // The VLM with its ViT trained: the ViT's gradients are reduced during its own backward (once
  // for the whole batch in a colocated plan, on each stage's last encoder piece under DIP), the
  // LLM's during each chunk's last backward.
  const std::string model = vlm_with_trained_vit();
  const char* images = kOneOrTwoImages;
  for (const std::string plan :
       {R"({"placement": "colocated", "schedule": "three_phase", "num_micro_batches": 4,
            "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}})",
        R"({"placement": "homogeneous", "schedule": "dip", "layout": {"pp": 2, "vpp": 2, "dp": 2},
            "num_micro_batches": 4)"}) {
    CAPTURE(plan);
    const Case c =
        make(model.c_str(), images,
             (plan + R"(, "overlap_grad_reduce": true, "grad_bucket_mb": 0.3})").c_str());
    const Case plain = make(model.c_str(), images, (plan + "}").c_str());
    const Program p = lowered(c), q = lowered(plain);
    REQUIRE(p.ranks.size() == q.ranks.size());
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      INFO("rank " << r);
      const auto& ops = p.ranks[r];
      auto totals = [](const std::vector<Op>& list) {
        double flops = 0, reduced = 0;
        for (const Op& op : list) {
          if (op.kind == OpKind::kCompute) flops += op.flops;
          if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp)
            reduced += op.message_bytes;
        }
        return std::pair{flops, reduced};
      };
      // The pieces do the same work, and the buckets hold every gradient once.
      const auto [flops, reduced] = totals(ops);
      const auto [plain_flops, plain_reduced] = totals(q.ranks[r]);
      CHECK(flops == doctest::Approx(plain_flops).epsilon(1e-12));
      CHECK(reduced == doctest::Approx(plain_reduced).epsilon(1e-12));
      int32_t norm = -1;
      std::map<std::string, int> buckets;  // module -> its bucket reductions
      std::vector<int32_t> bucket_ops;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        if (op.kind == OpKind::kCollective && op.purpose == Purpose::kNorm)
          norm = static_cast<int32_t>(i);
        if (op.kind != OpKind::kCollective || (op.flags & kOpGradientBucket) == 0) continue;
        // Each waits for the weight gradients of its own layers, just before it.
        REQUIRE(op.deps.size() == 1);
        const Op& w = ops[static_cast<std::size_t>(op.deps[0])];
        CHECK(w.phase == Phase::kW);
        CHECK((w.flags & kOpGradientBucket) != 0);
        CHECK(w.module == op.module);
        CHECK(w.first_layer == op.first_layer);
        CHECK(w.layers == op.layers);
        ++buckets[c.model.modules[static_cast<std::size_t>(op.module)].name];
        bucket_ops.push_back(static_cast<int32_t>(i));
      }
      // One layer a bucket: the LLM's 4 layers a stage, the ViT's 4 (colocated: all on every
      // rank) or 2 a stage (DIP).
      CHECK(buckets["llm"] == 4);
      CHECK(buckets["vision"] == (c.plan.schedule == Schedule::kDip ? 2 : 4));
      // The global norm waits for every bucket; nothing of theirs is reduced after it.
      REQUIRE(norm >= 0);
      const auto& deps = ops[static_cast<std::size_t>(norm)].deps;
      for (int32_t b : bucket_ops) CHECK(std::find(deps.begin(), deps.end(), b) != deps.end());
    }
    CHECK(step_on_slow_network(c, p) < step_on_slow_network(c, q));

    // overlap_param_gather: the step begins with every bucket's gather, and each module's first
    // forward on a rank (a colocated encoder's only one) runs in the buckets' pieces.
    const std::string sharded =
        plan +
        R"(, "overlap_grad_reduce": true, "grad_bucket_mb": 0.3, "distributed_optimizer": true)";
    const Case g =
        make(model.c_str(), images, (sharded + R"(, "overlap_param_gather": true})").c_str());
    const Case after_step = make(model.c_str(), images, (sharded + "}").c_str());
    const Program pg = lowered(g), qg = lowered(after_step);
    for (std::size_t r = 0; r < pg.ranks.size(); ++r) {
      INFO("rank " << r);
      const auto& ops = pg.ranks[r];
      auto totals = [](const std::vector<Op>& list) {
        double flops = 0, gathered = 0, stash = 0;
        for (const Op& op : list) {
          if (op.kind == OpKind::kCompute) {
            flops += op.flops;
            stash += op.stash_bytes;
          }
          if (op.kind == OpKind::kCollective && op.collective == CollectiveKind::kAllGather &&
              op.purpose == Purpose::kDp)
            gathered += op.message_bytes;
        }
        return std::array<double, 3>{flops, gathered, stash};
      };
      const auto a = totals(ops), b = totals(qg.ranks[r]);
      for (std::size_t i = 0; i < 3; ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-12));
      std::map<std::pair<int16_t, int32_t>, int32_t> gathers;  // (module, first layer) -> op
      std::map<std::string, int> per_module;
      bool computed = false;
      for (std::size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        computed |= op.kind == OpKind::kCompute;
        if (op.kind != OpKind::kCollective || op.collective != CollectiveKind::kAllGather ||
            op.purpose != Purpose::kDp)
          continue;
        // Not one after the optimizer step: the projector, without layers, has no buckets.
        if (g.model.modules[static_cast<std::size_t>(op.module)].name == "proj") continue;
        CHECK(!computed);
        CHECK((op.flags & kOpGradientBucket) != 0);
        gathers[{op.module, op.first_layer}] = static_cast<int32_t>(i);
        ++per_module[g.model.modules[static_cast<std::size_t>(op.module)].name];
      }
      CHECK(per_module["llm"] == 4);
      CHECK(per_module["vision"] == (g.plan.schedule == Schedule::kDip ? 2 : 4));
      int pieces = 0;
      for (const Op& op : ops) {
        if (op.kind != OpKind::kCompute || op.phase != Phase::kF ||
            (op.flags & kOpGradientBucket) == 0)
          continue;
        ++pieces;
        const auto it = gathers.find({op.module, op.first_layer});
        REQUIRE(it != gathers.end());
        CHECK(std::find(op.deps.begin(), op.deps.end(), it->second) != op.deps.end());
      }
      CHECK(pieces == static_cast<int>(gathers.size()));
    }
    CHECK(step_on_slow_network(g, pg) < step_on_slow_network(after_step, qg));
  }
}

TEST_CASE("overlap_param_gather: the step begins with bucket gathers, the first forwards wait") {
  const char* base = R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
      "schedule": "interleaved_1f1b", "num_micro_batches": 4, "distributed_optimizer": true,
      "overlap_grad_reduce": true, "grad_bucket_mb": 1)";
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  const Case c = make(kTextModel, workload,
                      (std::string(base) + R"(, "overlap_param_gather": true})").c_str());
  const Case plain = make(kTextModel, workload, (std::string(base) + "}").c_str());
  const Program p = lowered(c), q = lowered(plain);
  REQUIRE(p.ranks.size() == q.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    INFO("rank " << r);
    const auto& ops = p.ranks[r];
    // The same work, the same bytes gathered (at the start instead of after the step), the same
    // activations stashed.
    auto totals = [](const std::vector<Op>& list) {
      double flops = 0, gathered = 0, stash = 0;
      for (const Op& op : list) {
        if (op.kind == OpKind::kCompute) flops += op.flops;
        if (op.kind == OpKind::kCompute) stash += op.stash_bytes;
        if (op.kind == OpKind::kCollective && op.collective == CollectiveKind::kAllGather &&
            op.purpose == Purpose::kDp)
          gathered += op.message_bytes;
      }
      return std::array<double, 3>{flops, gathered, stash};
    };
    const auto a = totals(ops), b = totals(q.ranks[r]);
    CHECK(a[0] == doctest::Approx(b[0]).epsilon(1e-12));
    CHECK(a[1] == doctest::Approx(b[1]).epsilon(1e-12));
    CHECK(a[2] == doctest::Approx(b[2]).epsilon(1e-12));
    // One gather per bucket (two chunks of two one-layer buckets), before any compute op, in
    // the order the forward needs them; none after the optimizer step.
    std::map<std::pair<int16_t, int32_t>, int32_t> gathers;  // (chunk, first layer) -> op
    bool computed = false;
    int32_t previous_layer = -1;
    int16_t previous_chunk = -1;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      computed |= op.kind == OpKind::kCompute;
      if (op.kind != OpKind::kCollective || op.collective != CollectiveKind::kAllGather ||
          op.purpose != Purpose::kDp)
        continue;
      CHECK(!computed);
      CHECK((op.flags & kOpGradientBucket) != 0);
      CHECK(op.deps.empty());
      if (op.chunk == previous_chunk) CHECK(op.first_layer > previous_layer);
      previous_chunk = op.chunk;
      previous_layer = op.first_layer;
      gathers[{op.chunk, op.first_layer}] = static_cast<int32_t>(i);
    }
    CHECK(gathers.size() == 4);
    // Each chunk's first forward (micro-batch 0) in the buckets' pieces, bottom up, each piece
    // waiting for its own bucket; later forwards whole.
    std::map<int16_t, std::vector<int32_t>> pieces;  // chunk -> first layers of its F pieces
    for (const Op& op : ops) {
      if (op.kind != OpKind::kCompute || op.phase != Phase::kF) continue;
      if ((op.flags & kOpGradientBucket) == 0) {
        CHECK(op.microbatch > 0);
        continue;
      }
      CHECK(op.microbatch == 0);
      pieces[op.chunk].push_back(op.first_layer);
      const auto g = gathers.find({op.chunk, op.first_layer});
      REQUIRE(g != gathers.end());
      CHECK(std::find(op.deps.begin(), op.deps.end(), g->second) != op.deps.end());
      CHECK(ops[static_cast<std::size_t>(g->second)].layers == op.layers);
    }
    REQUIRE(pieces.size() == 2);
    for (const auto& [chunk, firsts] : pieces) {
      REQUIRE(firsts.size() == 2);
      CHECK(firsts[1] == firsts[0] + 1);
    }
  }
  // With a costly all-gather, hiding it behind the forward shortens the step.
  CHECK(step_on_slow_network(c, p) < step_on_slow_network(c, q));
  // It gathers the distributed optimizer's slices of overlap_grad_reduce's buckets: without
  // either, refused, naming the key.
  for (const char* missing : {"distributed_optimizer", "overlap_grad_reduce"}) {
    INFO(missing);
    Case off = c;
    if (std::string(missing) == "distributed_optimizer")
      off.plan.distributed_optimizer = false;
    else
      off.plan.overlap_grad_reduce = false;
    Diagnostics diag;
    validate_plan(off.plan, off.model, off.workload, off.cluster, "p", "", diag);
    CHECK(diag.format().find("overlap_param_gather") != std::string::npos);
    CHECK(diag.format().find(missing) != std::string::npos);
  }
  // The key survives a round trip.
  Diagnostics diag;
  CHECK(read_plan(to_json(c.plan), "p", "", diag) == c.plan);
}

TEST_CASE(
    "fully_sharded: each unit gathered before its forward and backward and reduce-scattered "
    "after, every micro-batch; weights and gradients sharded") {
  // Interleaved stages of one-layer units (buckets of 1 MB), four micro-batches, full
  // recomputation (each unit recomputed after its gather).
  const char* base = R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
      "schedule": "interleaved_1f1b", "num_micro_batches": 4, "distributed_optimizer": true,
      "recompute": "full", "grad_bucket_mb": 1)";
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  const Case c =
      make(kTextModel, workload, (std::string(base) + R"(, "fully_sharded": true})").c_str());
  const Case plain = make(kTextModel, workload, (std::string(base) + "}").c_str());
  const Program p = lowered(c), q = lowered(plain);
  REQUIRE(p.ranks.size() == q.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    INFO("rank " << r);
    const auto& ops = p.ranks[r];
    struct Totals {
      double flops = 0, stash = 0, gathered_f = 0, gathered_b = 0, reduced = 0;
      int gathers = 0, reductions = 0;
    };
    auto totals = [](const std::vector<Op>& list) {
      Totals t;
      for (const Op& op : list) {
        if (op.kind == OpKind::kCompute) {
          t.flops += op.flops;
          t.stash += op.stash_bytes;
        }
        if (op.kind != OpKind::kCollective || op.purpose != Purpose::kDp) continue;
        if (op.collective == CollectiveKind::kAllGather) {
          (op.phase == Phase::kB ? t.gathered_b : t.gathered_f) += op.message_bytes;
          ++t.gathers;
        } else {
          t.reduced += op.message_bytes;
          ++t.reductions;
        }
      }
      return t;
    };
    const Totals a = totals(ops), b = totals(q.ranks[r]);
    // The same work and activations; the weights gathered before every micro-batch's forward
    // and again before its backward (the plain plan gathers them once, after the step), the
    // gradients reduce-scattered after every micro-batch's backward (once, in the plain plan).
    CHECK(a.flops == doctest::Approx(b.flops).epsilon(1e-12));
    CHECK(a.stash == doctest::Approx(b.stash).epsilon(1e-12));
    CHECK(b.gathered_f > 0);
    CHECK(a.gathered_f == doctest::Approx(4 * b.gathered_f).epsilon(1e-12));
    CHECK(a.gathered_b == doctest::Approx(4 * b.gathered_f).epsilon(1e-12));
    CHECK(a.reduced == doctest::Approx(4 * b.reduced).epsilon(1e-12));
    CHECK(a.gathers == 2 * 4 * 2 * 2);  // F and B, micro-batches, chunks, one-layer units
    CHECK(a.reductions == 4 * 2 * 2);
    // Every F, R, B and W piece is one unit, and waits for the gather of that unit of its
    // micro-batch and phase (R, B and W: the backward's); every gather depends only on ops
    // before it; no gather after the optimizer step.
    std::map<std::tuple<int16_t, int32_t, int32_t, bool>, int32_t> gather_of;
    bool stepped = false;
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      stepped |= op.kind == OpKind::kOptimizerStep;
      for (int32_t d : op.deps) CHECK(d < static_cast<int32_t>(i));
      if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp &&
          op.collective == CollectiveKind::kAllGather) {
        CHECK(!stepped);
        CHECK((op.flags & kOpFullySharded) != 0);
        CHECK(op.layers == 1);
        gather_of[{op.chunk, op.first_layer, op.microbatch, op.phase == Phase::kB}] =
            static_cast<int32_t>(i);
      }
      if (op.kind != OpKind::kCompute) continue;
      CHECK(op.layers == 1);
      const auto g =
          gather_of.find({op.chunk, op.first_layer, op.microbatch, op.phase != Phase::kF});
      REQUIRE(g != gather_of.end());
      // The piece's first op waits for it directly; the next ones follow the first.
      if (op.phase == Phase::kF || op.phase == Phase::kR)
        CHECK(std::find(op.deps.begin(), op.deps.end(), g->second) != op.deps.end());
    }
    // Weights and gradients sharded over the two replicas, plus the largest unit whole twice
    // (the one that runs and the one prefetched) and its fp32 gradients once; the optimizer
    // state as before.
    double unit = 0;  // 16-bit weights
    for (const Op& op : ops)
      if (op.kind == OpKind::kCollective && op.collective == CollectiveKind::kAllGather)
        unit = std::max(unit, op.message_bytes);
    const RankMemory& m = p.memory[r];
    const RankMemory& n = q.memory[r];
    CHECK(m.optimizer_bytes == doctest::Approx(n.optimizer_bytes));
    CHECK(m.weight_bytes == doctest::Approx(n.weight_bytes / 2 + 2 * unit));
    // The unsharded plan keeps Megatron-LM's bf16 gradients, the sharded one fp32 shards.
    const double widened = static_cast<double>(kept_gradient_bytes(c.plan, c.model.dtype)) /
                           static_cast<double>(kept_gradient_bytes(plain.plan, c.model.dtype));
    CHECK(widened == 2);
    CHECK(m.gradient_bytes == doctest::Approx(n.gradient_bytes * widened / 2 + 2 * unit));
  }
  // With a costly all-gather, gathering every micro-batch costs more than once a step.
  CHECK(step_on_slow_network(c, p) > step_on_slow_network(plain, q));
  // Refused without the distributed optimizer, with overlap_param_gather and with Entrain's
  // micro-batching, naming the key; the key survives a round trip.
  for (int variant = 0; variant < 3; ++variant) {
    INFO(variant);
    Case off = c;
    if (variant == 0) off.plan.distributed_optimizer = false;
    if (variant == 1) {
      off.plan.overlap_grad_reduce = true;
      off.plan.overlap_param_gather = true;
    }
    if (variant == 2) off.plan.microbatching = MicrobatchPolicy::kEntrain;
    Diagnostics diag;
    validate_plan(off.plan, off.model, off.workload, off.cluster, "p", "", diag);
    CHECK(diag.format().find("fully_sharded") != std::string::npos);
  }
  Diagnostics diag;
  CHECK(read_plan(to_json(c.plan), "p", "", diag) == c.plan);
}

TEST_CASE("fp8: the sequence-parallel all-gathers of the linears' inputs carry them in FP8") {
  Case plain =
      make(kVlm, kUniformText,
           R"({"placement": "homogeneous", "layout": {"tp": 2}, "sequence_parallel": true})");
  plain.cluster.device.peak_flops[DType::kFp8] = 2e14;
  Case fp8 = plain, blocks = plain;
  fp8.plan.fp8 = Fp8Recipe::kDelayed;
  blocks.plan.fp8 = Fp8Recipe::kBlockwise;
  const Program p = lowered(plain), q = lowered(fp8), b = lowered(blocks);
  // The layer stack's gathers, two calls a layer (not the embedding's or the head's).
  const auto gathers = [](const Op& op) {
    std::vector<double> bytes;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kTp && n.kind == CollectiveKind::kAllGather &&
          n.count == 2 * op.layers)
        bytes.push_back(n.bytes);
    return bytes;
  };
  int forward = 0, backward = 0;
  for (std::size_t r = 0; r < p.ranks.size(); ++r)
    for (std::size_t i = 0; i < p.ranks[r].size(); ++i) {
      const Op& op = q.ranks[r][i];
      const std::vector<double> plain_bytes = gathers(p.ranks[r][i]);
      if (op.kind != OpKind::kCompute || plain_bytes.empty()) continue;
      const std::vector<double> fp8_bytes = gathers(op), block_bytes = gathers(b.ranks[r][i]);
      REQUIRE(fp8_bytes.size() == plain_bytes.size());
      REQUIRE(block_bytes.size() == plain_bytes.size());
      // A byte a value instead of two, an fp32 scale per 128 more with block scaling: the
      // forward's gathers of the inputs and the backward's second gather of them (its first,
      // of the output gradients, stays 16-bit).
      const bool fp8_layers = (op.flags & kOpFp8) != 0;
      for (std::size_t n = 0; n < plain_bytes.size(); ++n) {
        const bool input = fp8_layers && (op.phase != Phase::kB || n == 1);
        CHECK(fp8_bytes[n] == doctest::Approx(plain_bytes[n] * (input ? 0.5 : 1.0)));
        CHECK(block_bytes[n] ==
              doctest::Approx(plain_bytes[n] * (input ? 0.5 * (1 + 4.0 / 128) : 1.0)));
      }
      forward += fp8_layers && op.phase != Phase::kB ? 1 : 0;
      backward += fp8_layers && op.phase == Phase::kB && plain_bytes.size() == 2 ? 1 : 0;
    }
  CHECK(forward > 0);
  CHECK(backward > 0);
}

TEST_CASE("fp8: layer GEMMs flagged, FP8 weight copies in memory, FP8 parameter gathers") {
  // A VLM on two replicas with the distributed optimizer: the ViT's and the LLM's layers run
  // FP8 GEMMs, the projector does not.
  Case plain =
      make(kVlm, kUniformText,
           R"({"placement": "homogeneous", "layout": {"dp": 2}, "distributed_optimizer": true})");
  plain.cluster.device.peak_flops[DType::kFp8] = 2e14;
  Case fp8 = plain, gathered = plain;
  fp8.plan.fp8 = Fp8Recipe::kDelayed;
  gathered.plan.fp8 = Fp8Recipe::kCurrent;
  gathered.plan.fp8_param_gather = true;
  for (const Case* c : {&fp8, &gathered}) {
    Diagnostics diag;
    validate_plan(c->plan, c->model, c->workload, c->cluster, "p", "", diag);
    INFO(diag.format());
    REQUIRE(diag.ok());
  }
  const Program p = lowered(plain), q = lowered(fp8), g = lowered(gathered);
  REQUIRE(p.ranks.size() == q.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(p.ranks[r].size() == q.ranks[r].size());  // the same ops, flagged
    for (std::size_t i = 0; i < q.ranks[r].size(); ++i) {
      const Op& op = q.ranks[r][i];
      if (op.kind != OpKind::kCompute) continue;
      const bool layers = p.modules[static_cast<std::size_t>(op.module)] != "proj";
      CHECK(((op.flags & kOpFp8) != 0) == layers);
      CHECK((op.flags & kOpFp8CurrentScaling) == 0);
      CHECK(op.flops == p.ranks[r][i].flops);  // FP8 changes the rate, not the work
      // The linears' inputs kept for the backward in FP8: less stashed by each layer op.
      if ((op.flags & kOpFp8) != 0 && op.phase == Phase::kF && p.ranks[r][i].stash_bytes > 0) {
        CHECK(op.stash_bytes < 0.9 * p.ranks[r][i].stash_bytes);
        CHECK(op.stash_bytes > 0.5 * p.ranks[r][i].stash_bytes);
      }
    }
    for (const Op& op : g.ranks[r])
      if (op.kind == OpKind::kCompute && (op.flags & kOpFp8) != 0)
        CHECK((op.flags & kOpFp8CurrentScaling) != 0);
    // Two more bytes per layer parameter (the FP8 copy and its transpose) unless the weights
    // are kept in FP8 only; the rest of the state as before.
    CHECK(q.memory[r].weight_bytes > p.memory[r].weight_bytes * 1.8);
    CHECK(q.memory[r].weight_bytes < p.memory[r].weight_bytes * 2);
    CHECK(g.memory[r].weight_bytes == doctest::Approx(p.memory[r].weight_bytes));
    CHECK(q.memory[r].optimizer_bytes == doctest::Approx(p.memory[r].optimizer_bytes));
    // The parameter all-gathers after the step: 16-bit, or FP8 for the layers' weights (the
    // projector's and the embedding's stay 16-bit).
    auto gathered_bytes = [](const std::vector<Op>& ops) {
      double bytes = 0;
      for (const Op& op : ops)
        if (op.kind == OpKind::kCollective && op.collective == CollectiveKind::kAllGather &&
            op.purpose == Purpose::kDp)
          bytes += op.message_bytes;
      return bytes;
    };
    CHECK(gathered_bytes(q.ranks[r]) == doctest::Approx(gathered_bytes(p.ranks[r])));
    CHECK(gathered_bytes(g.ranks[r]) < 0.8 * gathered_bytes(p.ranks[r]));
    CHECK(gathered_bytes(g.ranks[r]) > 0.5 * gathered_bytes(p.ranks[r]));
  }
  // Refused, naming the key: an fp32 model, a device without an FP8 peak, FP8 gathers without
  // FP8 or without the distributed optimizer. The keys survive a round trip.
  for (int variant = 0; variant < 4; ++variant) {
    INFO(variant);
    Case off = variant == 2 ? plain : gathered;
    if (variant == 0) off.model.dtype = DType::kFp32;
    if (variant == 1) off.cluster.device.peak_flops.erase(DType::kFp8);
    if (variant == 2) off.plan.fp8_param_gather = true;
    if (variant == 3) off.plan.distributed_optimizer = false;
    Diagnostics diag;
    validate_plan(off.plan, off.model, off.workload, off.cluster, "p", "", diag);
    CHECK(diag.format().find(variant < 2 ? "p: fp8:" : "p: fp8_param_gather:") !=
          std::string::npos);
  }
  // FP8 gathers with neither FP8 nor the distributed optimizer: the missing FP8 alone is named.
  Case neither = plain;
  neither.plan.fp8_param_gather = true;
  neither.plan.distributed_optimizer = false;
  Diagnostics both;
  validate_plan(neither.plan, neither.model, neither.workload, neither.cluster, "p", "", both);
  CHECK(both.format().find("p: fp8_param_gather: needs fp8") != std::string::npos);
  CHECK(both.format().find("needs distributed_optimizer") == std::string::npos);
  Diagnostics diag;
  CHECK(read_plan(to_json(gathered.plan), "p", "", diag) == gathered.plan);
  // Block scales: the layer ops flagged so, nothing else changed; the recipe survives a round
  // trip.
  Case block = fp8;
  block.plan.fp8 = Fp8Recipe::kBlockwise;
  const Program b = lowered(block);
  for (std::size_t r = 0; r < b.ranks.size(); ++r)
    for (std::size_t i = 0; i < b.ranks[r].size(); ++i) {
      const Op& op = b.ranks[r][i];
      CHECK(op.flags ==
            (q.ranks[r][i].flags |
             ((op.flags & kOpFp8) != 0 ? static_cast<uint32_t>(kOpFp8BlockScaling) : 0u)));
      CHECK(op.flops == q.ranks[r][i].flops);
    }
  CHECK(read_plan(to_json(block.plan), "p", "", diag) == block.plan);
  CHECK(to_json(block.plan)["fp8"] == "blockwise");
  CHECK(diag.ok());
}

TEST_CASE(
    "grad_reduce_in_fp32: gradient reductions carry fp32, gathers and steps stay as they are") {
  // Per rank: bytes of gradient reductions (DP all-reduces and reduce-scatters, sums of
  // replicated key/value gradients), of parameter gathers, of optimizer steps, and FLOPs.
  struct Totals {
    double reduced = 0, kv = 0, gathered = 0, stepped = 0, flops = 0;
    std::size_t ops = 0;
  };
  auto totals = [](const std::vector<Op>& ops) {
    Totals t;
    t.ops = ops.size();
    for (const Op& op : ops) {
      if (op.kind == OpKind::kCompute) t.flops += op.flops;
      if (op.kind == OpKind::kOptimizerStep) t.stepped += op.memory_bytes;
      if (op.kind != OpKind::kCollective) continue;
      if ((op.flags & kOpKvReplicas) != 0) t.kv += op.message_bytes;
      if (op.purpose != Purpose::kDp) continue;
      (op.collective == CollectiveKind::kAllGather ? t.gathered : t.reduced) += op.message_bytes;
    }
    return t;
  };
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  // After the backward with the distributed optimizer; bucket by bucket with its overlaps; a
  // colocated LLM whose TP replicates key/value heads (4 of them over TP 8).
  const std::vector<std::pair<const char*, const char*>> plans = {
      {kTextModel,
       R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "distributed_optimizer": true)"},
      {kTextModel,
       R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
          "schedule": "interleaved_1f1b", "num_micro_batches": 4, "distributed_optimizer": true,
          "overlap_grad_reduce": true, "overlap_param_gather": true, "grad_bucket_mb": 1)"},
      {kVlm, R"({"placement": "colocated", "modules": {"vision": {"tp": 2, "dp": 8},
          "llm": {"tp": 8, "dp": 2}})"}};
  for (const auto& [model, plan] : plans) {
    INFO(plan);
    const Case bf16 = make(model, workload, (std::string(plan) + "}").c_str());
    const Case fp32 =
        make(model, workload, (std::string(plan) + R"(, "grad_reduce_in_fp32": true})").c_str());
    REQUIRE(fp32.plan.grad_reduce_in_fp32);
    const Program p = lowered(fp32), q = lowered(bf16);
    REQUIRE(p.ranks.size() == q.ranks.size());
    bool kv_summed = false;
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      INFO("rank " << r);
      const Totals a = totals(p.ranks[r]), b = totals(q.ranks[r]);
      CHECK(a.ops == b.ops);  // the same ops, only their bytes differ
      CHECK(b.reduced > 0);
      CHECK(a.reduced == doctest::Approx(2 * b.reduced).epsilon(1e-12));  // bf16 model: 4 / 2
      CHECK(a.kv == doctest::Approx(2 * b.kv).epsilon(1e-12));
      CHECK(a.gathered == doctest::Approx(b.gathered).epsilon(1e-12));
      CHECK(a.stepped == doctest::Approx(b.stepped).epsilon(1e-12));
      CHECK(a.flops == doctest::Approx(b.flops).epsilon(1e-12));
      kv_summed |= b.kv > 0;
    }
    if (std::string(model) == kVlm) CHECK(kv_summed);
    if (bf16.plan.distributed_optimizer) CHECK(totals(q.ranks[0]).gathered > 0);
    CHECK(step_on_slow_network(fp32, p) > step_on_slow_network(bf16, q));
  }
  // Megatron-LM's name reads too, and the key survives a round trip.
  Diagnostics diag;
  const ParallelPlan megatron =
      read_plan(Json::parse(R"({"placement": "homogeneous", "layout": {"dp": 2},
          "accumulate_allreduce_grads_in_fp32": true})"),
                "p", "", diag);
  INFO(diag.format());
  CHECK(diag.ok());
  CHECK(megatron.grad_reduce_in_fp32);
  CHECK(read_plan(to_json(megatron), "p", "", diag) == megatron);
  CHECK(reduced_gradient_bytes(megatron, DType::kBf16) == 4);
  CHECK(reduced_gradient_bytes(ParallelPlan{}, DType::kBf16) == 2);
}

TEST_CASE(
    "indivisible heads: padded with zero heads or replicated over TP, the model's FLOPs kept") {
  // kVlm's ViT with 5 heads of 32 (hidden 160): TP 2 does not divide them.
  std::string model = kVlm;
  const auto replace = [&](const std::string& from, const std::string& to) {
    model.replace(model.find(from), from.size(), to);
  };
  replace(R"("layers": 4, "hidden": 128, "heads": 4)", R"("layers": 4, "hidden": 160, "heads": 5)");
  replace(R"("in": 128)", R"("in": 160)");
  const char* workload =
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})";
  const auto plan = [](const char* heads) {
    return std::string(R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 2})") +
           (heads[0] != 0 ? std::string(R"(, "indivisible_heads": ")") + heads + R"(")" : "") + "}";
  };
  {
    Diagnostics diag;
    Case c;
    c.model = read_model(Json::parse(model), "m", "", diag);
    c.workload = read_workload(Json::parse(workload), "w", "", ".", diag);
    c.plan = read_plan(Json::parse(plan("")), "p", "", diag);
    validate_plan(c.plan, c.model, c.workload, cluster(4), "p", "", diag);
    CHECK(diag.format().find("layout.tp: 2 does not divide vision heads=5") != std::string::npos);
  }
  const Case one = make(model.c_str(), workload,
                        R"({"placement": "homogeneous", "layout": {"tp": 1, "dp": 2}})");
  const Case pad = make(model.c_str(), workload, plan("pad").c_str());
  const Case replicate = make(model.c_str(), workload, plan("replicate").c_str());
  const Program p1 = lowered(one), pp = lowered(pad), pr = lowered(replicate);
  // The model's FLOPs do not depend on how TP runs the ViT.
  CHECK(pp.model_flops == doctest::Approx(p1.model_flops).epsilon(1e-12));
  CHECK(pr.model_flops == doctest::Approx(p1.model_flops).epsilon(1e-12));
  // Per rank, the ViT's forward: padded to 6 heads, each of the 2 TP ranks runs 3; replicated,
  // each runs all 5 as the TP-1 plan's rank does, with no TP collective.
  const auto vit_forward = [](const Program& p, std::size_t rank) {
    Op sum;
    for (const Op& op : p.ranks[rank])
      if (op.kind == OpKind::kCompute && op.module == 0 && op.phase == Phase::kF) {
        sum.flops += op.flops;
        sum.padded_flops += op.padded_flops;
        sum.memory_bytes += op.memory_bytes;
        sum.nested.insert(sum.nested.end(), op.nested.begin(), op.nested.end());
        sum.tp = op.tp;
      }
    return sum;
  };
  const Op a = vit_forward(p1, 0), b = vit_forward(pp, 0), r = vit_forward(pr, 0);
  REQUIRE(a.flops > 0);
  // Per layer and token: q, k, v, o gain one head of 32 (4·32·160 weights, 2 FLOPs each), and
  // its attention scores and mixing 4·32 FLOPs a pair; 64 patches attending 64 each.
  const double tokens = 2 * 64, pairs = 2 * 64.0 * 64;
  const double extra = 4 * (2 * 4 * 32 * 160 * tokens + 4 * 32 * pairs);
  CHECK(b.padded_flops == doctest::Approx(extra / 2).epsilon(1e-12));
  CHECK(b.flops - b.padded_flops == doctest::Approx(a.flops / 2).epsilon(1e-12));
  CHECK(b.tp == 2);
  CHECK_FALSE(b.nested.empty());
  CHECK(r.flops == doctest::Approx(a.flops).epsilon(1e-12));
  CHECK(r.padded_flops == 0);
  CHECK(r.tp == 1);
  CHECK(r.nested.empty());
  CHECK(r.memory_bytes ==
        doctest::Approx(a.memory_bytes).epsilon(1e-12));  // the whole ViT's weights read
  // Weights held: the padded ViT's half on each rank; the replicated one whole on each.
  CHECK(pp.memory[0].weight_bytes > p1.memory[0].weight_bytes / 2);
  CHECK(pr.memory[0].weight_bytes > pp.memory[0].weight_bytes);
  // Replication is a homogeneous plan's; a colocated module chooses its own TP.
  Diagnostics diag;
  Case co = one;
  co.plan = read_plan(Json::parse(R"({"placement": "colocated", "modules": {"vision": {"dp": 2},
      "llm": {"dp": 2}}, "indivisible_heads": "replicate"})"),
                      "p", "", diag);
  validate_plan(co.plan, co.model, co.workload, co.cluster, "p", "", diag);
  CHECK(diag.format().find("indivisible_heads: replicate runs a homogeneous plan") !=
        std::string::npos);
  // The key survives a round trip.
  Diagnostics fresh;
  CHECK(read_plan(to_json(pad.plan), "p", "", fresh) == pad.plan);
}

TEST_CASE("media-parallel encoders: more encoder replicas than samples, each image encoded once") {
  // Two samples of six 64-pixel images; the LLM on two replicas, the ViT on eight.
  const char* workload =
      R"({"global_batch": 2, "max_seq_len": 4096, "samples": {"text_tokens": 64, "image": {"count": 6, "width": 64, "height": 64}}})";
  const std::string pipelined =
      R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "llm": {"tp": 2, "pp": 2, "dp": 2}})";
  {
    // Whole samples: eight replicas for two samples are refused.
    Diagnostics diag;
    Case c;
    c.model = read_model(Json::parse(kVlm), "m", "", diag);
    c.workload = read_workload(Json::parse(workload), "w", "", ".", diag);
    c.plan = read_plan(Json::parse(pipelined + "}"), "p", "", diag);
    validate_plan(c.plan, c.model, c.workload, cluster(8), "p", "", diag);
    CHECK(diag.format().find("8 does not divide global_batch=2") != std::string::npos);
    // Media items are a colocated plan's.
    Diagnostics other;
    c.plan =
        read_plan(Json::parse(R"({"placement": "non_colocated", "modules": {"vision": {"dp": 2},
        "llm": {"dp": 2}}, "encoder_data_parallel": "media"})"),
                  "p", "", other);
    validate_plan(c.plan, c.model, c.workload, cluster(4), "p", "", other);
    CHECK(other.format().find("encoder_data_parallel: media deals items") != std::string::npos);
  }
  const Case by_sample = make(
      kVlm, workload,
      R"({"placement": "colocated", "modules": {"vision": {"tp": 4, "dp": 2}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})");
  const std::string media = R"(, "encoder_data_parallel": "media"})";
  const Case linked = make(kVlm, workload, (pipelined + media).c_str());
  const Case regrouped = make(
      kVlm, workload,
      (R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "llm": {"tp": 4, "dp": 2}})" +
       media)
          .c_str());
  Diagnostics fresh;
  CHECK(read_plan(to_json(linked.plan), "p", "", fresh) == linked.plan);
  const auto vit_forward = [](const Program& p) {
    std::vector<double> flops;
    for (const auto& ops : p.ranks) {
      double f = 0;
      for (const Op& op : ops)
        if (op.kind == OpKind::kCompute && op.module == 0 && op.phase == Phase::kF) f += op.flops;
      flops.push_back(f);
    }
    return flops;
  };
  const Program ps = lowered(by_sample), pl = lowered(linked), pr = lowered(regrouped);
  const std::vector<double> whole = vit_forward(ps), dealt = vit_forward(pl);
  const double total = std::accumulate(whole.begin(), whole.end(), 0.0);
  REQUIRE(total > 0);
  // The same images encoded once each: the same FLOPs in all; each replica's share is two or
  // one of a sample's six images (6 over 4 replicas, largest first to the least loaded).
  CHECK(std::accumulate(dealt.begin(), dealt.end(), 0.0) == doctest::Approx(total));
  CHECK(*std::max_element(dealt.begin(), dealt.end()) == doctest::Approx(total * 2 / 12));
  CHECK(*std::min_element(dealt.begin(), dealt.end()) == doctest::Approx(total / 12));
  CHECK(pl.model_flops == doctest::Approx(ps.model_flops).epsilon(1e-12));
  // Into the LLM pipeline: each LLM replica's links carry each image of its sample once.
  for (int64_t d = 0; d < 2; ++d) {
    std::multiset<std::pair<int32_t, int32_t>> carried;
    for (const BoundaryLink& link : pl.links)
      if (link.consumer_replica == d) {
        REQUIRE(link.items.size() == link.samples.size());
        for (std::size_t i = 0; i < link.items.size(); ++i)
          carried.insert({link.samples[i], link.items[i]});
      }
    const int32_t sample = pl.llm_microbatches[static_cast<std::size_t>(d)][0][0];
    std::multiset<std::pair<int32_t, int32_t>> expected;
    for (int32_t item = 0; item < 6; ++item) expected.insert({sample, item});
    CHECK(carried == expected);
  }
  // Without an LLM pipeline the four replicas of a sample all-gather its 6 x 64 image rows.
  const double rows = 6 * 64.0 * 256 * static_cast<double>(dtype_bytes(regrouped.model.dtype));
  int gathers = 0;
  for (const Op& op : pr.ranks[0])
    if (op.kind == OpKind::kCollective && op.purpose == Purpose::kBoundary &&
        op.collective == CollectiveKind::kAllGather && op.phase == Phase::kF) {
      ++gathers;
      CHECK(op.message_bytes == doctest::Approx(rows));
      CHECK(pr.groups[static_cast<std::size_t>(op.group)].size() == 4);
    }
  CHECK(gathers == 1);
  CHECK(pr.memory[0].boundary_bytes == doctest::Approx(rows));
}

TEST_CASE("full recomputation runs the layers again, not the embedding, head or loss") {
  const Case c = make(
      kTextModel, kUniformText,
      R"({"placement": "homogeneous", "schedule": "1f1b", "layout": {"pp": 4}, "recompute": "full"})");
  const Program p = lowered(c);
  const TransformerArch& a = *c.model.modules[0].transformer;
  const double head =
      2.0 * static_cast<double>(a.hidden * a.vocab) * 256;  // one sample a micro-batch
  int recomputes = 0;
  for (const auto& ops : p.ranks) {
    std::map<std::pair<int32_t, int>, const Op*> forward;
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute && op.phase == Phase::kF)
        forward[{op.microbatch, op.stage}] = &op;
    for (const Op& op : ops) {
      if (op.kind != OpKind::kCompute || op.phase != Phase::kR) continue;
      ++recomputes;
      const Op& f = *forward.at({op.microbatch, op.stage});
      CHECK((op.flags & (kOpHead | kOpFrontEnd)) == 0);
      CHECK(op.logits == 0);
      CHECK(op.layers == f.layers);
      if ((f.flags & kOpHead) != 0)
        CHECK(op.flops == doctest::Approx(f.flops - head));  // the head's forward, not again
      else
        CHECK(op.flops == doctest::Approx(f.flops));
    }
  }
  CHECK(recomputes == 4 * 16);
}

TEST_CASE("recompute_layers: each chunk's first layers recomputed, the rest keep everything") {
  // 8 layers over 2 stages of 2 chunks: 2 layers a chunk, the first of each recomputed; and as
  // one-layer fully sharded units, only the first unit of each chunk recomputed.
  const std::string base = R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
      "schedule": "interleaved_1f1b", "num_micro_batches": 4, "distributed_optimizer": true,
      "grad_bucket_mb": 1, "recompute": )";
  const char* workload =
      R"({"global_batch": 8, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  for (const bool sharded : {false, true}) {
    INFO("fully sharded: " << sharded);
    const std::string tail = sharded ? R"(, "fully_sharded": true})" : "}";
    const Program none = lowered(make(kTextModel, workload, (base + R"("none")" + tail).c_str()));
    const Program full = lowered(make(kTextModel, workload, (base + R"("full")" + tail).c_str()));
    const Case c =
        make(kTextModel, workload, (base + R"("full", "recompute_layers": 1)" + tail).c_str());
    REQUIRE(c.plan.recompute_layers == 1);
    const Program p = lowered(c);
    auto totals = [](const Program& program, Phase phase) {
      double flops = 0, stash = 0;
      int ops = 0;
      for (const Op& op : program.ranks[0])
        if (op.kind == OpKind::kCompute) {
          stash += op.stash_bytes;
          if (op.phase != phase) continue;
          flops += op.flops;
          ++ops;
        }
      return std::tuple{flops, stash, ops};
    };
    const auto [r_flops, stash, r_ops] = totals(p, Phase::kR);
    const auto [full_r_flops, full_stash, full_r_ops] = totals(full, Phase::kR);
    const auto none_stash = std::get<1>(totals(none, Phase::kR));
    // Half the layers recomputed: half the recomputed FLOPs, in one-layer ops.
    CHECK(r_flops == doctest::Approx(full_r_flops / 2));
    CHECK(r_ops == (sharded ? full_r_ops / 2 : full_r_ops));
    for (const Op& op : p.ranks[0])
      if (op.kind == OpKind::kCompute && op.phase == Phase::kR) CHECK(op.layers == 1);
    // Memory between full recomputation's and none's, halfway.
    CHECK(stash == doctest::Approx((full_stash + none_stash) / 2));
  }
  // Only with full recomputation.
  Diagnostics v;
  ParallelPlan bad = make(kTextModel, workload, (base + R"("full"})").c_str()).plan;
  bad.recompute = Recompute::kSelective;
  bad.recompute_layers = 2;
  const Case ok = make(kTextModel, workload, (base + R"("full"})").c_str());
  validate_plan(bad, ok.model, ok.workload, ok.cluster, "p.json", "plan", v);
  CHECK(v.format().find("recompute_layers: needs recompute full") != std::string::npos);
}

TEST_CASE("per-op recomputation runs every second matmul again, keeps attention and less memory") {
  const std::string plan =
      R"({"placement": "homogeneous", "schedule": "1f1b", "layout": {"pp": 4}, )";
  const Program none =
      lowered(make(kTextModel, kUniformText, (plan + R"("recompute": "none"})").c_str()));
  const Program full =
      lowered(make(kTextModel, kUniformText, (plan + R"("recompute": "full"})").c_str()));
  const Case c = make(kTextModel, kUniformText, (plan + R"("recompute": "per_op"})").c_str());
  const Program p = lowered(c);
  const TransformerArch& a = *c.model.modules[0].transformer;
  // In forward order Q, K, V, output, then the MLP's: K, the output projection and one matrix
  // of the MLP (a plain MLP's second, a gated one's up projection) run again.
  const int64_t q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
  REQUIRE(kv > 0);
  CHECK(per_op_recomputed_matmul_parameters(a) == a.hidden * kv + q * a.hidden + a.hidden * a.ffn);
  int recomputes = 0;
  for (const auto& ops : p.ranks)
    for (const Op& op : ops) {
      if (op.kind != OpKind::kCompute || op.phase != Phase::kR) continue;
      ++recomputes;
      CHECK((op.flags & kOpPerOpRecompute) != 0);
      CHECK(op.flops ==
            doctest::Approx(2.0 * static_cast<double>(op.layers) *
                            static_cast<double>(per_op_recomputed_matmul_parameters(a)) *
                            static_cast<double>(op.tokens)));
    }
  CHECK(recomputes == 4 * 16);
  for (const auto& ops : full.ranks)
    for (const Op& op : ops) CHECK((op.flags & kOpPerOpRecompute) == 0);
  // The model's FLOPs leave recomputation out.
  CHECK(p.model_flops == doctest::Approx(none.model_flops));
  // Kept per layer: more than full recomputation's input, less than everything.
  auto stash = [](const Program& program) {
    double bytes = 0;
    for (const Op& op : program.ranks[0]) bytes += op.stash_bytes;
    return bytes;
  };
  CHECK(stash(p) > stash(full));
  CHECK(stash(p) < stash(none));
}

TEST_CASE("a non-colocated LLM replica fed by 128 encoder replicas: every link's messages match") {
  // 128 producer replicas per consumer: the tags of their messages must stay distinct (they once
  // held only 64).
  const Case c = make(
      kVlm,
      R"({"global_batch": 128, "max_seq_len": 512, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 64, "height": 64}}})",
      R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 128}, "llm": {"dp": 1}}, "micro_batch_size": 128})");
  const Program p = lowered(c);  // check_program: every send has exactly its receive
  CHECK(p.world == 129);
  CHECK(p.links.size() == 128);
}

TEST_CASE("homogeneous encoders run whole on every CP rank, as the executor runs them") {
  // Each CP rank encodes its micro-batch's images and keeps its own tokens' rows: the encoder's
  // and projector's ops hold every image token, with no CP exchange; the LLM's hold half.
  const char* workload =
      R"({"global_batch": 4, "max_seq_len": 1024, "samples": {"text_tokens": 64, "image": {"count": 2, "width": 64, "height": 64}}})";
  const Case one = make(kVlm, workload, R"({"placement": "homogeneous", "layout": {"dp": 1}})");
  const Case two = make(kVlm, workload, R"({"placement": "homogeneous", "layout": {"cp": 2}})");
  const Program p1 = lowered(one), p2 = lowered(two);
  const auto forward_tokens = [](const Program& p, int32_t rank, const std::string& module) {
    for (const Op& op : p.ranks[static_cast<std::size_t>(rank)])
      if (op.kind == OpKind::kCompute && op.phase == Phase::kF && op.microbatch == 0 &&
          p.modules[static_cast<std::size_t>(op.module)] == module) {
        for (const NestedCollective& n : op.nested)
          if (module != "llm") CHECK(n.purpose != Purpose::kCp);
        return op.tokens;
      }
    return int64_t{-1};
  };
  for (int32_t rank : {0, 1}) {
    CHECK(forward_tokens(p2, rank, "vision") == forward_tokens(p1, 0, "vision"));
    CHECK(forward_tokens(p2, rank, "proj") == forward_tokens(p1, 0, "proj"));
    CHECK(forward_tokens(p2, rank, "llm") < forward_tokens(p1, 0, "llm"));
  }
  CHECK(forward_tokens(p1, 0, "vision") > 0);
  // The repeated encoding is work, not model FLOPs: the iteration's model FLOPs are the same
  // with and without CP (the LLM's split over its CP ranks, the encoder counted once).
  CHECK(p2.model_flops == doctest::Approx(p1.model_flops).epsilon(1e-12));
}

TEST_CASE("media-parallel encoders: an encoder and its projector on different replica counts") {
  // Two samples of six images; the ViT on eight replicas (four per sample), its projector on
  // four (two per sample): each module deals the images over its own replicas, and every image
  // passes through both exactly once.
  const char* workload =
      R"({"global_batch": 2, "max_seq_len": 4096, "samples": {"text_tokens": 64, "image": {"count": 6, "width": 64, "height": 64}}})";
  const Case by_sample = make(
      kVlm, workload,
      R"({"placement": "colocated", "modules": {"vision": {"tp": 4, "dp": 2}, "proj": {"tp": 4, "dp": 2}, "llm": {"tp": 4, "dp": 2}}})");
  const Case dealt = make(
      kVlm, workload,
      R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "proj": {"tp": 2, "dp": 4}, "llm": {"tp": 4, "dp": 2}}, "encoder_data_parallel": "media"})");
  const auto forward = [](const Program& p, int32_t module) {
    std::vector<double> flops;
    for (const auto& ops : p.ranks) {
      double f = 0;
      for (const Op& op : ops)
        if (op.kind == OpKind::kCompute && op.module == module && op.phase == Phase::kF)
          f += op.flops;
      flops.push_back(f);
    }
    return flops;
  };
  const Program ps = lowered(by_sample), pd = lowered(dealt);
  const auto sum = [](const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0);
  };
  for (int32_t module : {0, 1}) {
    const std::vector<double> whole = forward(ps, module), shared = forward(pd, module);
    REQUIRE(sum(whole) > 0);
    CAPTURE(module);
    CHECK(sum(shared) == doctest::Approx(sum(whole)));
    const double per_image = sum(whole) / 12;
    if (module == 0) {  // 6 images over 4 replicas: two or one each, one rank a replica
      CHECK(*std::max_element(shared.begin(), shared.end()) == doctest::Approx(2 * per_image));
      CHECK(*std::min_element(shared.begin(), shared.end()) == doctest::Approx(per_image));
    } else {  // 6 images over 2 replicas of TP 2: three each, halved over the TP pair
      CHECK(*std::max_element(shared.begin(), shared.end()) == doctest::Approx(1.5 * per_image));
      CHECK(*std::min_element(shared.begin(), shared.end()) == doctest::Approx(1.5 * per_image));
    }
  }
  CHECK(pd.model_flops == doctest::Approx(ps.model_flops).epsilon(1e-12));
}

TEST_CASE("sequence parallelism: the LLM's embedding, head and partial gradients as Megatron-LM") {
  const auto collectives = [](const Program& p, uint32_t flag, Phase phase) {
    std::map<std::pair<CollectiveKind, int32_t>, int> out;  // (kind, count) -> ops
    for (const Op& op : p.ranks[0])
      if (op.kind == OpKind::kCompute && op.phase == phase && (op.flags & flag) != 0)
        for (const NestedCollective& n : op.nested)
          if (n.purpose == Purpose::kTp && n.count == 1) ++out[{n.kind, n.count}];
    return out;
  };
  const char* plan = R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2},
      "sequence_parallel": true})";
  // Text alone: the embedding's partial rows reduce-scattered, their gradient gathered.
  const Program text = lowered(make(kTextModel, kUniformText, plan));
  auto front = collectives(text, kOpFrontEnd, Phase::kF);
  CHECK(front[{CollectiveKind::kReduceScatter, 1}] > 0);
  CHECK(front.count({CollectiveKind::kAllReduce, 1}) == 0);
  CHECK(collectives(text, kOpFrontEnd, Phase::kB)[{CollectiveKind::kAllGather, 1}] > 0);
  // With an encoder's rows in the sequence: the text's rows all-reduced, then each rank's share.
  const Case vlm = make(kVlm, kUniformText, plan);
  const Program merged = lowered(vlm);
  front = collectives(merged, kOpFrontEnd, Phase::kF);
  CHECK(front[{CollectiveKind::kAllReduce, 1}] > 0);
  CHECK(front.count({CollectiveKind::kReduceScatter, 1}) == 0);
  // The head (on the last stage's first rank, rank 2 of TP 2 x PP 2): its input gathered, its
  // gradient reduce-scattered and the input gathered again for the weights.
  Program last = text;
  std::swap(last.ranks[0], last.ranks[2]);
  CHECK(collectives(last, kOpHead, Phase::kF)[{CollectiveKind::kAllGather, 1}] > 0);
  const auto head_back = collectives(last, kOpHead, Phase::kB);
  CHECK(head_back.at({CollectiveKind::kReduceScatter, 1}) > 0);
  CHECK(head_back.at({CollectiveKind::kAllGather, 1}) > 0);
  CHECK(head_back.count({CollectiveKind::kAllReduce, 1}) == 0);
  // The norms' gradients, partial on each TP rank, summed over it before the data-parallel
  // reduction: per stage its 4 layers' two RMSNorms (256 values each), the last its final norm.
  const auto partial = [](const Program& p, std::size_t rank) {
    double bytes = 0;
    for (const Op& op : p.ranks[rank])
      if (op.kind == OpKind::kCollective && (op.flags & kOpSequencePartial) != 0) {
        CHECK(op.purpose == Purpose::kTp);
        CHECK(p.groups[static_cast<std::size_t>(op.group)].size() == 2);
        bytes += op.message_bytes;
      }
    return bytes;
  };
  const double per_value = static_cast<double>(
      reduced_gradient_bytes(make(kTextModel, kUniformText, plan).plan, DType::kBf16));
  CHECK(partial(text, 0) == doctest::Approx(4 * 2 * 256 * per_value));
  CHECK(partial(text, 2) == doctest::Approx((4 * 2 + 1) * 256 * per_value));
  // Megatron-LM's multimodal models keep their ViT out of it, unless the plan says so.
  const auto vit_split = [](const Program& p, int16_t vision) {
    for (const auto& ops : p.ranks)
      for (const Op& op : ops)
        if (op.kind == OpKind::kCompute && op.module == vision && op.layers > 0)
          return (op.flags & kOpSequenceParallel) != 0;
    return false;
  };
  CHECK_FALSE(vit_split(merged, 0));
  Case both = vlm;
  both.plan.encoder_sequence_parallel = true;
  CHECK(vit_split(lowered(both), 0));
}

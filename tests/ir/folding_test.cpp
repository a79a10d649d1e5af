// Folded lowering (RankFolding::kIdentical): the evaluator gives every rank of a folded Program
// exactly the times, and the metrics exactly the values, of the Program with every rank's ops.
#include <doctest/doctest.h>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/cost/metrics.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/stage_split.hpp"
#include "tests/ir/small_models.hpp"

using namespace tessera;

namespace {

using test::kTextModel;
using test::kVlm;
const char* kMoe = R"({"name": "moe", "modules": [
  {"name": "llm", "role": "llm", "transformer": {"layers": 4, "hidden": 256, "heads": 8, "ffn": 512, "vocab": 1000, "experts": 4, "top_k": 2}}]})";

const char* kFixedText =
    R"({"global_batch": 16, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
const char* kFixedImages = R"({"global_batch": 16, "max_seq_len": 1024, "samples": {
    "text_tokens": 100, "image": {"count": 1, "width": 64, "height": 64}}})";
const char* kVariableImages = R"({"global_batch": 16, "max_seq_len": 1024, "seed": 3, "samples": {
    "text_tokens": {"dist": "uniform", "min": 32, "max": 300},
    "image": {"count": {"dist": "choice", "values": [0, 1, 2]}, "width": 64, "height": 64}}})";

// `nodes` nodes of `per_node` devices, linked slowly enough between nodes that placement shows.
ClusterSpec cluster(int64_t nodes, int64_t per_node) {
  Diagnostics diag;
  const std::string text = R"({"name": "c", "nodes": )" + std::to_string(nodes) +
                           R"(, "devices_per_node": )" + std::to_string(per_node) + R"(,
    "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 2e12},
    "intra_node": {"bandwidth_bytes_per_s": 1e11, "latency_s": 1e-6},
    "inter_node": {"bandwidth_bytes_per_s": 1e10, "latency_s": 5e-6}})";
  ClusterSpec c = read_cluster(Json::parse(text), "c", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  return c;
}

struct Folded {
  Lowered full, folded;
};

Folded lower_both(const char* model_text, const char* workload_text, const char* plan_text,
                  const ClusterSpec& c) {
  Diagnostics diag;
  const ModelSpec model = read_model(Json::parse(model_text), "m", "", diag);
  const WorkloadSpec workload = read_workload(Json::parse(workload_text), "w", "", ".", diag);
  ParallelPlan plan = read_plan(Json::parse(plan_text), "p", "", diag);
  REQUIRE(diag.ok());
  validate_plan(plan, model, workload, c, "p", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  plan = resolve_stage_split(plan, model, workload, c);
  const Batch batch = draw_batch(workload, 0);
  Folded f{lower(model, c, plan, workload, batch),
           lower(model, c, plan, workload, batch, nullptr, RankFolding::kIdentical)};
  REQUIRE(f.full.error.empty());
  REQUIRE(f.folded.error.empty());
  for (const Program* p : {&f.full.program, &f.folded.program}) {
    const auto problems = check_program(*p);
    INFO((problems.empty() ? std::string() : problems.front()));
    CHECK(problems.empty());
  }
  return f;
}

// Every rank's ops in the folded Program (its representative's) are the full Program's with the
// peers' representatives, and evaluate to the same times; the metrics agree to the bit.
void check_exact(const Folded& f, const ModelSpec& model, const ClusterSpec& c) {
  const Program& a = f.full.program;
  const Program& b = f.folded.program;
  CHECK(a.represented_by.empty());
  CHECK(f.full.notes == f.folded.notes);
  CHECK(a.model_flops == b.model_flops);
  const CostModel cost(c, model.dtype, CostParams{}, model);
  const Timeline ta = evaluate(a, cost);
  const Timeline tb = evaluate(b, cost);
  REQUIRE(ta.error.empty());
  REQUIRE(tb.error.empty());
  CHECK(ta.step_s == tb.step_s);
  int64_t mismatched = 0;
  for (int64_t r = 0; r < a.world; ++r) {
    const auto by = static_cast<std::size_t>(representative(b, r));
    const auto& mine = a.ranks[static_cast<std::size_t>(r)];
    const auto& theirs = b.ranks[by];
    REQUIRE(mine.size() == theirs.size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      const Op& x = mine[i];
      const Op& y = theirs[i];
      const bool same = x.kind == y.kind && x.phase == y.phase && x.module == y.module &&
                        x.stage == y.stage && x.chunk == y.chunk && x.microbatch == y.microbatch &&
                        x.flops == y.flops && x.memory_bytes == y.memory_bytes &&
                        x.message_bytes == y.message_bytes && x.tokens == y.tokens &&
                        x.deps == y.deps && x.tag == y.tag &&
                        (x.peer < 0 ? y.peer < 0 : representative(b, x.peer) == y.peer) &&
                        ta.ops[static_cast<std::size_t>(r)][i].start_s == tb.ops[by][i].start_s &&
                        ta.ops[static_cast<std::size_t>(r)][i].finish_s == tb.ops[by][i].finish_s;
      mismatched += !same;
    }
    CHECK(ta.compute_busy_s[static_cast<std::size_t>(r)] ==
          tb.compute_busy_s[static_cast<std::size_t>(r)]);
  }
  CHECK(mismatched == 0);
  const Batch batch;  // the token rates are not compared
  const IterationMetrics ma = compute_metrics(a, ta, model, c, batch);
  const IterationMetrics mb = compute_metrics(b, tb, model, c, batch);
  CHECK(ma.bubble == mb.bubble);
  CHECK(ma.bubble_mean == mb.bubble_mean);
  CHECK(ma.exposed_comm_s == mb.exposed_comm_s);
  CHECK(ma.exposed_boundary_mean_s == mb.exposed_boundary_mean_s);
  CHECK(ma.module_busy_s == mb.module_busy_s);
  CHECK(ma.mfu == mb.mfu);
  CHECK(ma.hfu == mb.hfu);
  CHECK(ma.peak_rank == mb.peak_rank);
  for (std::size_t r = 0; r < ma.memory.size(); ++r)
    CHECK(ma.memory[r].total() == mb.memory[r].total());
  REQUIRE(ma.critical_path.size() == mb.critical_path.size());
  for (std::size_t k = 0; k < ma.critical_path.size(); ++k) {
    CHECK(ma.critical_path[k].what == mb.critical_path[k].what);
    CHECK(ma.critical_path[k].seconds == mb.critical_path[k].seconds);
  }
  REQUIRE(ma.microbatch_variability.size() == mb.microbatch_variability.size());
  for (std::size_t k = 0; k < ma.microbatch_variability.size(); ++k)
    CHECK(ma.microbatch_variability[k].cv == mb.microbatch_variability[k].cv);
}

}  // namespace

TEST_CASE(
    "folding: fixed-length data folds TP shards and DP replicas, and every op keeps its times") {
  struct Plan {
    const char* plan;
    int64_t classes;  // one per pipeline stage (and CP rank)
  };
  const ClusterSpec c = cluster(2, 4);
  const std::vector<Plan> plans = {
      {R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}, "sequence_parallel": true})",
       2},
      {R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"tp": 2, "pp": 2, "vpp": 2, "dp": 2}, "num_micro_batches": 8, "recompute": "full"})",
       2},
      {R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 4}, "distributed_optimizer": true, "overlap_grad_reduce": true, "overlap_param_gather": true, "grad_bucket_mb": 0.5})",
       1},
      {R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}, "distributed_optimizer": true, "fully_sharded": true, "grad_bucket_mb": 0.5})",
       2},
      {R"({"placement": "homogeneous", "layout": {"cp": 2, "pp": 2, "dp": 2}, "cp_split": "makespan"})",
       4},
      {R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 4}, "pipeline_scatter_gather": true})",
       4},
      {R"({"placement": "homogeneous", "schedule": "gpipe", "layout": {"pp": 2, "dp": 4}})", 2},
  };
  for (const Plan& p : plans) {
    INFO(std::string(p.plan));
    const Folded f = lower_both(kTextModel, kFixedText, p.plan, c);
    CHECK(lowered_ranks(f.folded.program) == p.classes);
    Diagnostics diag;
    check_exact(f, read_model(Json::parse(kTextModel), "m", "", diag), c);
  }
  INFO("MoE with expert parallelism over the replicas");
  const char* moe = R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 4, "ep": 2}})";
  const Folded f = lower_both(kMoe, kFixedText, moe, c);
  CHECK(lowered_ranks(f.folded.program) == 1);
  Diagnostics diag;
  check_exact(f, read_model(Json::parse(kMoe), "m", "", diag), c);
}

TEST_CASE("folding: replicas with different data stay apart; encoders in stage 0 fold with it") {
  const ClusterSpec c = cluster(2, 4);
  const char* plan = R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}})";
  Diagnostics diag;
  const ModelSpec vlm = read_model(Json::parse(kVlm), "m", "", diag);
  const Folded same = lower_both(kVlm, kFixedImages, plan, c);
  CHECK(lowered_ranks(same.folded.program) == 2);
  check_exact(same, vlm, c);
  const Folded different = lower_both(kVlm, kVariableImages, plan, c);
  CHECK(lowered_ranks(different.folded.program) == 4);  // TP shards only
  check_exact(different, vlm, c);
  // Placements other than homogeneous do not fold.
  const Folded colocated = lower_both(
      kVlm, kFixedImages,
      R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})",
      c);
  CHECK(colocated.folded.program.represented_by.empty());
}

TEST_CASE("folding: a member whose groups sit on the nodes otherwise than its representative's") {
  // Three nodes of two devices, TP 2 × DP 3: each replica's TP pair is on one node; with four
  // devices per node the middle replica's pair straddles two nodes, so replicas cannot stand for
  // each other — only TP shards fold, and the times stay exact.
  Diagnostics diag;
  const ModelSpec gpt = read_model(Json::parse(kTextModel), "m", "", diag);
  const char* plan = R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 3}})";
  const char* fixed =
      R"({"global_batch": 12, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  const Folded aligned = lower_both(kTextModel, fixed, plan, cluster(3, 2));
  CHECK(lowered_ranks(aligned.folded.program) == 1);
  check_exact(aligned, gpt, cluster(3, 2));
  const ClusterSpec straddling = cluster(2, 3);
  const Folded f = lower_both(kTextModel, fixed, plan, straddling);
  CHECK(lowered_ranks(f.folded.program) == 3);
  check_exact(f, gpt, straddling);
}

TEST_CASE("folding: every homogeneous layout of a small GPT on three node shapes stays exact") {
  // Every TP x CP x PP x DP of 16 devices, with and without interleaving, on nodes of 8, 4 and
  // 2: whatever folds (TP shards, replicas, both, or nothing where members sit otherwise on the
  // nodes) gives every op the full Program's times.
  Diagnostics diag;
  const ModelSpec gpt = read_model(Json::parse(kTextModel), "m", "", diag);
  const char* fixed =
      R"({"global_batch": 32, "max_seq_len": 512, "samples": {"text_tokens": 256}})";
  int64_t lowered = 0, folded = 0;
  for (const auto& [nodes, per_node] : {std::pair{2, 8}, {4, 4}, {8, 2}}) {
    const ClusterSpec c = cluster(nodes, per_node);
    for (int tp : {1, 2, 4, 8})
      for (int cp : {1, 2})
        for (int pp : {1, 2, 4})
          for (int vpp : {1, 2})
            for (int dp : {1, 2, 4}) {
              if (tp * cp * pp * dp != 16 || (vpp > 1 && pp == 1)) continue;
              Json plan = {
                  {"placement", "homogeneous"},
                  {"layout", {{"tp", tp}, {"cp", cp}, {"pp", pp}, {"vpp", vpp}, {"dp", dp}}},
                  {"sequence_parallel", tp > 1},
                  {"distributed_optimizer", dp > 1}};
              if (vpp > 1) plan["schedule"] = "interleaved_1f1b";
              const std::string text = plan.dump();
              INFO(text << " on " << nodes << " nodes of " << per_node);
              const Folded f = lower_both(kTextModel, fixed, text.c_str(), c);
              check_exact(f, gpt, c);
              ++lowered;
              folded += !f.folded.program.represented_by.empty();
            }
  }
  CHECK(lowered > 30);
  CHECK(folded > lowered / 2);
}

#include <doctest/doctest.h>

#include "shared/layout/rank_groups.hpp"
#include "shared/layout/scenario.hpp"

using namespace tessera;

namespace {

const char* kModel = R"({"name": "vlm", "modules": [
  {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
   "transformer": {"layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "linear_bias": true, "norm": "layernorm"},
   "patching": {"patch_size": 8, "resize": "fixed", "image_size": 32}},
  {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 64, "out": 128}},
  {"name": "llm", "role": "llm", "inputs": ["proj"],
   "transformer": {"layers": 8, "hidden": 128, "heads": 8, "kv_heads": 2, "ffn": 344, "gated_ffn": true, "vocab": 100}}]})";
const char* kCluster = R"({"name": "c16", "nodes": 2, "devices_per_node": 8,
  "device": {"name": "gpu", "peak_flops": {"bf16": 1e15}, "memory_bytes": 80e9, "memory_bandwidth_bytes_per_s": 3e12},
  "intra_node": {"bandwidth_bytes_per_s": 4.5e11, "latency_s": 3e-6},
  "inter_node": {"bandwidth_bytes_per_s": 5e10, "latency_s": 5e-6}})";
const char* kWorkload =
    R"({"global_batch": 32, "max_seq_len": 1024, "samples": {"text_tokens": 100}})";

// Validates `plan` against the fixtures; returns all messages, one per line.
std::string check(const char* plan, ParallelPlan* out = nullptr) {
  Diagnostics diag;
  const ModelSpec model = read_model(Json::parse(kModel), "model.json", "", diag);
  const ClusterSpec cluster = read_cluster(Json::parse(kCluster), "cluster.json", "", diag);
  const WorkloadSpec workload = read_workload(Json::parse(kWorkload), "w.json", "", ".", diag);
  REQUIRE(diag.ok());
  const ParallelPlan p = read_plan(Json::parse(plan), "s.json", "plan", diag);
  if (diag.ok()) validate_plan(p, model, workload, cluster, "s.json", "plan", diag);
  if (out != nullptr) *out = p;
  return diag.format();
}

}  // namespace

TEST_CASE("valid plans of each placement") {
  CHECK(check(R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 4}})") == "");
  CHECK(check(R"({"placement": "colocated", "schedule": "three_phase",
                  "modules": {"vision": {"dp": 16}, "llm": {"tp": 2, "pp": 2, "dp": 4}}})") == "");
  ParallelPlan p;
  CHECK(check(R"({"placement": "non_colocated", "schedule": "graph_1f1b", "micro_batch_size": 2,
                  "modules": {"vision": {"dp": 4}, "llm": {"tp": 2, "pp": 3, "dp": 2, "stage_layers": [2, 3, 3]}}})",
              &p) == "");
  Diagnostics diag;
  const ModelSpec model = read_model(Json::parse(kModel), "", "", diag);
  CHECK(world_size(p, model) == 16);
  // The projector has no entry: it runs on the vision ranks.
  const std::vector<ModuleGroups> groups = rank_groups(p, model);
  REQUIRE(groups.size() == 3);
  CHECK(groups[1].module == "llm");
  CHECK(groups[1].first_rank == 4);
  CHECK(groups[2].module == "proj");
  CHECK(groups[2].dp == std::vector<Group>{{0, 1, 2, 3}});
}

TEST_CASE("Megatron argument names are accepted as aliases") {
  ParallelPlan p;
  CHECK(
      check(
          R"({"placement": "homogeneous", "recompute_granularity": "selective", "use_distributed_optimizer": true,
                  "layout": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "data_parallel_size": 4}})",
          &p) == "");
  CHECK(p.layout.tp == 2);
  CHECK(p.recompute == Recompute::kSelective);
  CHECK(p.distributed_optimizer);
  Diagnostics diag;
  CHECK(read_plan(to_json(p), "", "", diag) == p);
}

TEST_CASE("recomputation: none, selective, full and torchtitan's per_op; others refused") {
  ParallelPlan p;
  CHECK(check(R"({"placement": "homogeneous", "recompute": "per_op", "layout": {"dp": 16}})", &p) ==
        "");
  CHECK(p.recompute == Recompute::kPerOp);
  CHECK(to_json(p)["recompute"] == "per_op");
  Diagnostics diag;
  CHECK(read_plan(to_json(p), "", "", diag) == p);
  const std::string bad =
      check(R"({"placement": "homogeneous", "recompute": "op", "layout": {"dp": 16}})");
  CHECK(bad.find("recompute") != std::string::npos);
  CHECK(bad.find("per_op") != std::string::npos);
  // Megatron-LM's block method by its argument's name: the first N layers of each chunk.
  CHECK(check(R"({"placement": "homogeneous", "recompute_granularity": "full",
                  "recompute_num_layers": 2, "layout": {"dp": 16}})",
              &p) == "");
  CHECK(p.recompute_layers == 2);
  CHECK(to_json(p)["recompute_layers"] == 2);
  CHECK(read_plan(to_json(p), "", "", diag) == p);
  CHECK(check(R"({"placement": "homogeneous", "recompute": "full", "recompute_layers": 0,
                  "layout": {"dp": 16}})")
            .find("recompute_layers") != std::string::npos);
}

TEST_CASE("selective recomputation's submodules, Megatron-LM's recompute_modules") {
  ParallelPlan p;
  // The default: the attention core alone, not written back.
  CHECK(check(R"({"placement": "homogeneous", "recompute": "selective", "layout": {"dp": 16}})",
              &p) == "");
  CHECK(p.recompute_modules == kRecomputeCoreAttn);
  CHECK(!to_json(p).contains("recompute_modules"));
  CHECK(check(R"({"placement": "homogeneous", "recompute_granularity": "selective",
                  "recompute_modules": ["mlp", "core_attn", "layernorm"], "layout": {"dp": 16}})",
              &p) == "");
  CHECK(p.recompute_modules == (kRecomputeCoreAttn | kRecomputeLayernorm | kRecomputeMlp));
  CHECK(to_json(p)["recompute_modules"] == Json::array({"core_attn", "layernorm", "mlp"}));
  Diagnostics diag;
  CHECK(read_plan(to_json(p), "", "", diag) == p);
  // The submodules must exist: this model is dense, with plain attention.
  const std::string absent = check(R"({"placement": "homogeneous", "recompute": "selective",
                  "recompute_modules": ["mla_up_proj", "moe_act"], "layout": {"dp": 16}})");
  CHECK(absent.find("plan.recompute_modules: mla_up_proj: the model has no multi-head latent "
                    "attention") != std::string::npos);
  CHECK(absent.find("plan.recompute_modules: moe_act: the model has no MoE layer") !=
        std::string::npos);
  // Only with selective recomputation; names from Megatron-LM's list; at least one.
  CHECK(check(R"({"placement": "homogeneous", "recompute": "full",
                  "recompute_modules": ["mlp"], "layout": {"dp": 16}})")
            .find("recompute_modules: needs recompute selective") != std::string::npos);
  const std::string unknown = check(R"({"placement": "homogeneous", "recompute": "selective",
                  "recompute_modules": ["mlp", "attention"], "layout": {"dp": 16}})");
  CHECK(unknown.find("recompute_modules[1]") != std::string::npos);
  CHECK(unknown.find("core_attn") != std::string::npos);
  CHECK(check(R"({"placement": "homogeneous", "recompute": "selective",
                  "recompute_modules": [], "layout": {"dp": 16}})")
            .find("non-empty array") != std::string::npos);
}

TEST_CASE("the training framework: megatron by default, pytorch by name, anything else refused") {
  ParallelPlan p;
  CHECK(check(R"({"placement": "homogeneous", "layout": {"dp": 16}})", &p) == "");
  CHECK(p.framework == Framework::kMegatron);
  CHECK(!to_json(p).contains("framework"));
  CHECK(check(R"({"placement": "homogeneous", "framework": "pytorch", "layout": {"dp": 16}})",
              &p) == "");
  CHECK(p.framework == Framework::kPytorch);
  Diagnostics diag;
  CHECK(read_plan(to_json(p), "", "", diag) == p);
  CHECK(check(R"({"placement": "homogeneous", "framework": "jax", "layout": {"dp": 16}})")
            .find("s.json: plan.framework") != std::string::npos);
}

TEST_CASE("homogeneous encoders live in the first pipeline stage") {
  ParallelPlan p;
  REQUIRE(check(R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 4}})", &p) ==
          "");
  Diagnostics diag;
  const ModelSpec model = read_model(Json::parse(kModel), "", "", diag);
  const auto groups = rank_groups(p, model);
  CHECK(groups[0].module == "vision");
  CHECK(groups[0].size == 8);
  CHECK(groups[0].tp == std::vector<Group>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(groups[2].pp.size() == 8);
}

TEST_CASE("invalid plans: every rule names its path") {
  auto has = [](const std::string& all, const char* part) {
    INFO(all);
    CHECK(all.find(part) != std::string::npos);
  };
  has(check(R"({"placement": "homogeneous", "layout": {"tp": 3, "dp": 16}})"),
      "s.json: plan.layout.tp: 3 does not divide vision heads=4");
  has(check(R"({"placement": "homogeneous", "layout": {"tp": 1, "pp": 16}})"),
      "plan.layout.pp: llm has 8 layers, fewer than pp*vpp=16");
  has(check(R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 4}})"),
      "plan.layout: plan uses 8 ranks, cluster c16 has 16 devices");
  has(check(R"({"placement": "homogeneous", "layout": {"dp": 16, "ep": 2}})"),
      "ep=2 but llm has no experts");
  has(check(
          R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 4, "stage_layers": [3, 4]}})"),
      "plan.layout.stage_layers: sums to 7, llm has 8 layers");
  has(check(
          R"({"placement": "homogeneous", "micro_batch_size": 3, "layout": {"tp": 2, "pp": 2, "dp": 4}})"),
      "plan.micro_batch_size: micro_batch_size*dp = 12 does not divide global_batch=32");
  has(check(
          R"({"placement": "homogeneous", "schedule": "three_phase", "layout": {"tp": 2, "pp": 2, "dp": 4}})"),
      "three_phase is the colocated schedule");
  has(check(R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 4, "vpp": 2}})"),
      "vpp > 1 needs schedule interleaved_1f1b");
  has(check(
          R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "llm": {"tp": 2, "dp": 8}}})"),
      "colocated modules span all ranks");
  has(check(
          R"({"placement": "non_colocated", "modules": {"vision": {"dp": 4}, "llm": {"tp": 2, "dp": 3, "pp": 2}}})"),
      "boundary vision -> llm: dp 4 and 3 must divide one another");
  has(check(
          R"({"placement": "non_colocated", "modules": {"vision": {"dp": 4, "ranks": [0, 4]}, "llm": {"tp": 2, "dp": 4, "pp": 2, "ranks": [2, 18]}}})"),
      "overlaps another module");
  has(check(
          R"({"placement": "non_colocated", "modules": {"visoin": {"dp": 4}, "llm": {"tp": 2, "dp": 6}}})"),
      "plan.modules.visoin: no module 'visoin' in model vlm (did you mean 'vision'?)");
  has(check(R"({"placement": "non_colocated", "modules": {"llm": {"tp": 2, "dp": 8}}})"),
      "module 'vision' has no layout");
  has(check(R"({"placement": "homogeneous", "modules": {}})"),
      "plan.modules: a homogeneous plan has one 'layout'");
  has(check(R"({"placement": "homogeneous", "layout": {"tp": 0, "dp": 16}})"),
      "plan.layout.tp: must be > 0, got 0");
}

// tessera-train end to end on the tiny LLaVA-like scenario (fp32, CPU, Gloo): parallel plans give
// the single-rank losses, the executed ops are the lowered Program's, the shapes data set is
// learnable, resume continues exactly, and a killed worker ends the job quickly.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <torch/version.h>
#include <unistd.h>

#include "exec/data.hpp"
#include "exec/launcher.hpp"
#include "shared/base/json_reader.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/layout/plan_source.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/stage_split.hpp"
#include "tests/exec/run_train.hpp"
#include "tests/exec/scratch.hpp"

using namespace tessera;

namespace {

const std::string kScenario = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json";

std::vector<double> train(const std::string& layout, const std::string& name, int steps = 3,
                          const std::string& extra = "") {
  const fs::path out = fresh_dir(name);
  const Run r = run(kScenario + " --plan " + plan_file(layout) + " --steps " +
                    std::to_string(steps) + " --out " + out.string() + " " + extra);
  INFO(r.output);
  REQUIRE(r.code == 0);
  return losses(out);
}

// A run's losses and gradient norms per step, as recorded in out_dir(name).
struct Trained {
  std::string name;
  std::vector<double> loss, norm;
};

Trained recorded(const std::string& name) {
  return {name, losses(out_dir(name)), losses(out_dir(name), "grad_norm")};
}

Trained train_with(const std::string& scenario, const std::string& plan, const std::string& name,
                   int steps = 3) {
  const fs::path out = fresh_dir(name);
  const Run r = run(scenario + " --plan " + plan + " --steps " + std::to_string(steps) + " --out " +
                    out.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  return recorded(name);
}

// `got` against `reference`, step by step: losses within 1e-6; gradient norms within 1e-6 at the
// first step (the same parameters: only the order of float sums differs) and `norm_tolerance`
// after (Adam's normalized update turns roundoff-sized gradients into full steps: up to 1.03e-5
// apart at the third step, measured on colocated CP 2 on an AMD EPYC, hence 3e-5). The norm
// catches what AdamW hides from the losses, such as a gradient summed twice over a boundary.
constexpr double kNormAfterSteps = 3e-5;
void check_parity(const Trained& got, const Trained& reference,
                  double norm_tolerance = kNormAfterSteps) {
  REQUIRE(!reference.loss.empty());
  REQUIRE(got.loss.size() == reference.loss.size());
  REQUIRE(got.norm.size() == got.loss.size());
  REQUIRE(reference.norm.size() == reference.loss.size());
  for (std::size_t i = 0; i < got.loss.size(); ++i) {
    INFO(got.name << " vs " << reference.name << ", step " << i << ": loss " << got.loss[i]
                  << " vs " << reference.loss[i] << ", norm " << got.norm[i] << " vs "
                  << reference.norm[i]);
    CHECK(std::abs(got.loss[i] - reference.loss[i]) <= 1e-6 * std::abs(reference.loss[i]));
    CHECK(std::abs(got.norm[i] - reference.norm[i]) <=
          (i == 0 ? 1e-6 : norm_tolerance) * std::abs(reference.norm[i]));
  }
}

// Each plan (a layout for plan_file, and a run name) against the single-rank run named
// `reference`, as check_parity compares them.
void check_against_one_rank(const std::string& reference,
                            const std::vector<std::pair<std::string, std::string>>& plans) {
  const Trained one = recorded(reference);
  for (const auto& [layout, name] : plans) {
    train(layout, name);
    check_parity(recorded(name), one);
  }
}

// `scenario` trained with the one-rank plan (as `reference`) and with each of `plans` (plan file,
// run name), each compared with it by check_parity.
void check_plans_agree(const std::string& scenario, const std::string& reference,
                       const std::vector<std::pair<std::string, std::string>>& plans, int steps = 3,
                       double norm_tolerance = kNormAfterSteps) {
  const Trained one = train_with(scenario, plan_file(R"({"tp": 1})"), reference, steps);
  REQUIRE(one.loss.size() == static_cast<std::size_t>(steps));
  for (const auto& [plan, name] : plans)
    check_parity(train_with(scenario, plan, name, steps), one, norm_tolerance);
}

// cpu-tiny-moe's LLM (`transformer`, 4 heads of 128 wide) given DeepSeek-V3's attention and
// router: multi-head latent attention with a query latent, rotary keys shared by the heads and
// values narrower than the query/key heads, and a router score bias.
void deepseek_v3_shape(Json& transformer) {
  transformer["kv_heads"] = 4;
  transformer["head_dim"] = 40;
  transformer["kv_lora_rank"] = 32;
  transformer["q_lora_rank"] = 48;
  transformer["rope_head_dim"] = 8;
  transformer["v_head_dim"] = 24;
  transformer["router_bias"] = true;
}

// cpu-tiny with a trainable ViT of 3 heads of 16 (hidden 64), which TP 2 does not divide.
std::string three_head_vit() {
  return edited_scenario(
      kScenario,
      [](Json& s) {
        Json& vit = s["model"]["modules"][0];
        vit["transformer"]["heads"] = 3;
        vit["transformer"]["head_dim"] = 16;
        vit["frozen"] = false;
      },
      "three-head-vit");
}

// How many events of rank 0's trace in run `name` have a name `match` accepts.
int rank0_events(const std::string& name, const std::function<bool(const std::string&)>& match) {
  std::ifstream in(out_dir(name) / "trace" / "rank0.json");
  const Json trace = Json::parse(in);
  int count = 0;
  for (const Json& e : trace.at("traceEvents")) count += match(e.value("name", "")) ? 1 : 0;
  return count;
}

// A matcher of names ending in `suffix`.
std::function<bool(const std::string&)> ending(const std::string& suffix) {
  return [suffix](const std::string& n) { return n.ends_with(suffix); };
}

// A plan file with `json` as is.
std::string raw_plan(const std::string& json, const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-train-test-" + std::to_string(::getpid())) / "raw";
  fs::create_directories(dir);
  const fs::path file = dir / (name + ".json");
  std::ofstream(file) << json;
  return file.string();
}

void check_trace_is_program(const fs::path& out, const std::string& scenario,
                            const std::string& plan);

}  // namespace

TEST_CASE("parallel plans reproduce the single-rank losses (3 steps, fp32, clipping active)") {
  REQUIRE(train(R"({"tp": 1})", "single").size() == 3);
  check_against_one_rank(
      "single",
      {{R"({"tp": 2})", "tp2"},
       {R"({"pp": 2})", "pp2"},
       {R"({"dp": 2})", "dp2"},
       {R"({"cp": 2})", "cp2"},
       {R"({"cp": 2}, "cp_split": "zigzag")", "cp2-zigzag"},
       {R"({"tp": 2, "pp": 2})", "tp2pp2"},
       {R"({"tp": 2, "pp": 2}, "pipeline_scatter_gather": false)", "tp2pp2-whole"},
       {R"({"pp": 2, "vpp": 2}, "schedule": "interleaved_1f1b", "num_micro_batches": 8)", "vpp2"},
       {R"({"dp": 2, "tp": 2}, "distributed_optimizer": true)", "zero1"},
       // Sequence parallelism: the LLM's layers on each TP rank's rows of the tokens, the
       // norms' gradients summed over TP.
       {R"({"tp": 2}, "sequence_parallel": true)", "tp2-sp"},
       {R"({"tp": 2, "pp": 2}, "sequence_parallel": true)", "tp2pp2-sp"},
       {R"({"tp": 2, "cp": 2}, "sequence_parallel": true)", "tp2cp2-sp"},
       {R"({"tp": 2, "dp": 2}, "sequence_parallel": true, "recompute": "full")",
        "tp2dp2-sp-full"}});
  // Context parallelism's key/value gathers and their reduce-scatters are the Program's, and so
  // are sequence parallelism's gathers and scatters, stage messages and gradient sums.
  check_trace_is_program(out_dir("cp2"), kScenario, plan_file(R"({"cp": 2})"));
  check_trace_is_program(out_dir("tp2-sp"), kScenario,
                         plan_file(R"({"tp": 2}, "sequence_parallel": true)"));
  check_trace_is_program(out_dir("tp2pp2-sp"), kScenario,
                         plan_file(R"({"tp": 2, "pp": 2}, "sequence_parallel": true)"));
}

TEST_CASE(
    "sequence parallelism of a text-only LLM: its embedding reduce-scattered; one rank's "
    "losses") {
  // No encoder: the embedding's partial rows go straight to each TP rank's share.
  const std::string text = edited_scenario(
      kScenario,
      [](Json& s) {
        Json llm = s["model"]["modules"][2];
        llm.erase("inputs");
        s["model"]["modules"] = Json::array({llm});
        s["workload"]["samples"].erase("image");
      },
      "text-only");
  const Trained one = train_with(text, plan_file(R"({"tp": 1})"), "text-single");
  const std::string sp = plan_file(R"({"tp": 2, "pp": 2}, "sequence_parallel": true)");
  check_parity(train_with(text, sp, "text-tp2pp2-sp"), one);
  check_trace_is_program(out_dir("text-tp2pp2-sp"), text, sp);
}

TEST_CASE("a bf16 model trains in mixed precision: near fp32, never NaN; plans agree in bf16") {
  // The lines a GPU runs for a bf16 model (casts of fp32 master weights, fp32 norms, softmax and
  // loss, bf16 activations across ranks), exercised on the CPU.
  const std::string bf16_scenario = edited_scenario(
      kScenario, [](Json& s) { s["model"]["dtype"] = "bf16"; }, "bf16-scenario");
  auto bf16_run = [&](const std::string& layout, const std::string& name,
                      const std::string& extra = "") {
    const fs::path out = fresh_dir(name);
    const Run r = run(bf16_scenario + " --plan " + plan_file(layout) + " --steps 3 --out " +
                      out.string() + extra);
    INFO(r.output);
    REQUIRE(r.code == 0);
    return losses(out);
  };
  const std::vector<double> fp32 = train(R"({"tp": 1})", "fp32-reference");
  const std::vector<double> bf16 = bf16_run(R"({"tp": 1})", "bf16");
  REQUIRE(bf16.size() == fp32.size());
  for (std::size_t i = 0; i < bf16.size(); ++i) {
    INFO("step " << i << ": bf16 " << bf16[i] << ", fp32 " << fp32[i]);
    CHECK(std::isfinite(bf16[i]));
    CHECK(std::abs(bf16[i] - fp32[i]) <= 1e-2 * std::abs(fp32[i]));
    CHECK(bf16[i] != fp32[i]);  // it did compute in bf16
  }
  const Json run_json = Json::parse(std::ifstream(out_dir("bf16") / "run.json"));
  CHECK(run_json.at("precision") == "bf16");
  CHECK(run_json.at("device") == "cpu");
  for (const auto& [layout, name] :
       std::vector<std::pair<std::string, std::string>>{{R"({"tp": 2})", "bf16-tp2"},
                                                        {R"({"pp": 2, "dp": 2})", "bf16-pp2dp2"},
                                                        {R"({"cp": 2})", "bf16-cp2"}}) {
    const std::vector<double> got = bf16_run(layout, name);
    REQUIRE(got.size() == bf16.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO(name << " step " << i << ": " << got[i] << " vs one rank's " << bf16[i]);
      CHECK(std::abs(got[i] - bf16[i]) <= 1e-2 * std::abs(bf16[i]));
    }
    // Collectives are recorded at the Program's sizes, in the model's dtype whatever Gloo
    // carries on the wire.
    check_trace_is_program(out_dir(name), bf16_scenario, plan_file(layout));
  }
  // Weights cast at every use instead of through working copies: the same arithmetic, so the same
  // losses and gradient norms to the last bit, on one rank, across pipeline and data ranks, and
  // fully sharded (whose gathers write the new weights without an autograd version: a stale copy
  // would show from the second step on).
  const std::string fsdp =
      R"({"dp": 2}, "distributed_optimizer": true, "fully_sharded": true, "grad_bucket_mb": 0.01)";
  bf16_run(fsdp, "bf16-fsdp-dp2");
  for (const auto& [layout, name] :
       std::vector<std::pair<std::string, std::string>>{{R"({"tp": 1})", "bf16"},
                                                        {R"({"pp": 2, "dp": 2})", "bf16-pp2dp2"},
                                                        {fsdp, "bf16-fsdp-dp2"}}) {
    const std::vector<double> cast = bf16_run(layout, name + "-cast", " --no-working-copies");
    INFO(name);
    CHECK(cast == losses(out_dir(name)));
    CHECK(losses(out_dir(name + "-cast"), "grad_norm") == losses(out_dir(name), "grad_norm"));
    CHECK(Json::parse(std::ifstream(out_dir(name + "-cast") / "run.json"))
              .at("options")
              .at("working_copies") == false);
  }
  // Gradients reduced in fp32 (grad_reduce_in_fp32) lose nothing to the reduction: DP2 agrees
  // with one rank as fp32 runs do. Reduced in bf16 (the default), the gradient norm moves by the
  // rounding of the summed gradients (measured ~3e-4): the option changes what goes on the wire.
  const std::vector<double>& loss = bf16;
  const std::vector<double> norm = losses(out_dir("bf16"), "grad_norm");
  const Trained fp32_reduce =
      train_with(bf16_scenario, plan_file(R"({"dp": 2}, "grad_reduce_in_fp32": true)"),
                 "bf16-dp2-fp32-reduce");
  const Trained bf16_reduce = train_with(bf16_scenario, plan_file(R"({"dp": 2})"), "bf16-dp2");
  const std::vector<double>&fp32_loss = fp32_reduce.loss, &fp32_norm = fp32_reduce.norm;
  const std::vector<double>&bf16_loss = bf16_reduce.loss, &bf16_norm = bf16_reduce.norm;
  for (std::size_t i = 0; i < loss.size(); ++i) {
    INFO("step " << i << ": one rank " << loss[i] << " / " << norm[i] << ", fp32 reduction "
                 << fp32_loss[i] << " / " << fp32_norm[i] << ", bf16 reduction " << bf16_loss[i]
                 << " / " << bf16_norm[i]);
    CHECK(std::abs(fp32_loss[i] - loss[i]) <= 1e-6 * std::abs(loss[i]));
    CHECK(std::abs(fp32_norm[i] - norm[i]) <= 1e-5 * std::abs(norm[i]));
  }
  CHECK(std::abs(bf16_norm[0] - norm[0]) > 1e-5 * std::abs(norm[0]));
  // fp16 and fp8 are refused by name.
  const std::string fp8 = edited_scenario(
      kScenario, [](Json& s) { s["model"]["dtype"] = "fp8"; }, "fp8-scenario");
  const Run refused = run(fp8);
  CHECK(refused.code == 2);
  CHECK(refused.output.find("dtype fp8: the executor trains fp32, or bf16") != std::string::npos);
}

TEST_CASE("two encoders (frozen ViT, trainable Whisper-style audio) feed one LLM: plans agree") {
  const std::string valm = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-valm.json";
  const Trained reference = train_with(valm, plan_file(R"({"tp": 1})"), "valm1");
  check_parity(train_with(valm, plan_file(R"({"tp": 2})"), "valm-tp2"), reference);
  check_parity(train_with(valm, plan_file(R"({"pp": 2, "dp": 2})"), "valm-pp2dp2"), reference);
  // Colocated, each encoder on its own grid: vision on 4 replicas, audio TP2 x DP2.
  const std::string plan = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
      "modules": {"vision": {"dp": 4}, "audio": {"tp": 2, "dp": 2}, "llm": {"tp": 2, "dp": 2}}})",
      "valm-colocated");
  check_parity(train_with(valm, plan, "valm-colocated"), reference);
}

namespace {

// The highest DIP sub-micro-batch index among the ops (of `module`, or all) of the Programs the
// plan lowers to for the scenario's first `iterations` batches: 0 when DIP cuts no micro-batch
// in two or more pieces.
int32_t most_sub_microbatch(const std::string& scenario, const std::string& plan,
                            const std::string& module = "", int64_t iterations = 2) {
  Diagnostics diag;
  const auto with = load_scenario_with_plan(scenario, plan, diag);
  INFO(diag.format());
  REQUIRE(with.has_value());
  int32_t most = 0;
  for (int64_t it = 0; it < iterations; ++it) {
    const Lowered l =
        lower(with->model, with->cluster,
              resolve_stage_split(*with->plan, with->model, with->workload, with->cluster),
              with->workload, draw_batch(with->workload, it));
    REQUIRE(l.error.empty());
    for (const auto& ops : l.program.ranks)
      for (const Op& op : ops)
        if (module.empty() ||
            (op.module >= 0 && l.program.modules[static_cast<std::size_t>(op.module)] == module))
          most = std::max(most, op.sub_microbatch);
  }
  return most;
}

// Two plans (JSON texts) trained two steps each reach the same gradient norms, and the second's
// trace is its Program. Returns the second's plan file.
std::string check_same_norms(const std::string& without, const std::string& with,
                             const std::string& name) {
  const std::string first = raw_plan(without, name + "-without");
  const std::string second = raw_plan(with, name + "-with");
  const fs::path a = fresh_dir(name + "-without"), b = fresh_dir(name + "-with");
  for (const auto& [plan, out] : {std::pair{first, a}, std::pair{second, b}}) {
    const Run r = run(kScenario + " --plan " + plan + " --steps 2 --out " + out.string());
    INFO(r.output);
    REQUIRE(r.code == 0);
  }
  check_trace_is_program(b, kScenario, second);
  const std::vector<double> x = losses(a, "grad_norm"), y = losses(b, "grad_norm");
  REQUIRE(x.size() == 2);
  REQUIRE(y.size() == 2);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(std::abs(x[i] - y[i]) <= 1e-5 * x[i]);
  return second;
}

}  // namespace

TEST_CASE("colocated placements: each module its own grid, the boundary regroups, losses agree") {
  train(R"({"tp": 1})", "colo-reference");
  const Trained reference = recorded("colo-reference");
  // Fan-in: the vision encoder (and its projector) on 4 replicas, the LLM TP2 x DP2.
  const std::string fan_in = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"tp": 1, "dp": 4}, "llm": {"tp": 2, "dp": 2}}})",
      "fan-in");
  check_parity(train_with(kScenario, fan_in, "colo-fan-in"), reference);
  // Fan-out: one encoder replica (TP2) for two LLM replicas; the gradients are all-gathered.
  const std::string fan_out = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"tp": 2, "dp": 1}, "llm": {"dp": 2}}})",
      "fan-out");
  check_parity(train_with(kScenario, fan_out, "colo-fan-out"), reference);
  // Three-phase with an LLM pipeline: encoder leaders send each micro-batch's rows to the LLM
  // replica's first-stage leader (not always the rank beside them), which broadcasts them.
  const std::string piped_llm = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"tp": 2, "dp": 2}, "llm": {"tp": 2, "pp": 2}}})",
      "colo-pp2");
  check_parity(train_with(kScenario, piped_llm, "colo-pp2"), reference);
  // Same data-parallel degree: no regroup, each LLM micro-batch picks its rows.
  const std::string same_dp = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"tp": 2, "dp": 1}, "llm": {"tp": 2, "dp": 1}}})",
      "same-dp");
  check_parity(train_with(kScenario, same_dp, "colo-same-dp"), reference);
  // The executed ops of the fan-in run are its Program's (the boundary all-gathers included).
  const fs::path out = fresh_dir("colo-trace");
  REQUIRE(run(kScenario + " --plan " + fan_in + " --steps 1 --out " + out.string()).code == 0);
  check_trace_is_program(out, kScenario, fan_in);
  std::ifstream in(out / "trace" / "rank1.json");
  const Json trace = Json::parse(in);
  int boundary = 0;
  for (const Json& e : trace.at("traceEvents"))
    if (e.value("name", "").find("gloo:boundary:allgather") == 0) ++boundary;
  CHECK(boundary == 2);  // forward regroup and gradient regroup
  // The LLM with context parallelism: each CP rank holds the gradient of its own tokens'
  // encoder rows, summed over CP before the regroup (fan-in, same DP) or before the leader's send
  // (an LLM pipeline); losses and gradient norms as on one rank.
  for (const auto& [modules, name] :
       {std::pair<std::string, std::string>{
            R"({"vision": {"tp": 1, "dp": 4}, "llm": {"cp": 2, "dp": 2}})", "colo-cp2-fan-in"},
        {R"({"vision": {"tp": 2, "dp": 2}, "llm": {"cp": 2, "dp": 2}})", "colo-cp2-same-dp"},
        {R"({"vision": {"tp": 2, "dp": 2}, "llm": {"cp": 2, "pp": 2}})", "colo-cp2-pp2"}}) {
    INFO(name);
    const std::string plan = raw_plan(
        R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1, "modules": )" +
            modules + "}",
        name);
    check_parity(train_with(kScenario, plan, name), reference);
  }
  // What the executor cannot run yet is refused up front, naming the plan file and field.
  const std::string with_cp = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"cp": 2, "dp": 2}, "llm": {"dp": 4}}})",
      "colo-encoder-cp");
  const Run refused = run(kScenario + " --plan " + with_cp);
  CHECK(refused.code == 2);
  CHECK(refused.output.find("colo-encoder-cp.json: plan.modules.vision.cp") != std::string::npos);
}

TEST_CASE("encoders dealt media items, more replicas than samples: plans agree with one rank") {
  // Two samples of three images, the ViT trainable: four ViT replicas share the images, beside
  // an LLM on TP 2 x DP 2 (a sample's three images over two replicas) or TP 4 (six over four).
  const auto scenario = [](int images, const std::string& name) {
    return edited_scenario(
        kScenario,
        [images](Json& s) {
          s["workload"]["global_batch"] = 2;
          s["workload"]["samples"]["image"]["count"] = images;
          s["model"]["modules"][0]["frozen"] = false;
        },
        name);
  };
  const auto colocated = [](const std::string& modules, const std::string& name) {
    return raw_plan(
        R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
            "encoder_data_parallel": "media", "modules": )" +
            modules + "}",
        name);
  };
  const std::string three = scenario(3, "media-items");
  check_plans_agree(
      three, "media-items-1",
      {{colocated(R"({"vision": {"dp": 4}, "llm": {"tp": 2, "dp": 2}})", "media-tp2dp2"),
        "media-tp2dp2"},
       {colocated(R"({"vision": {"dp": 4}, "llm": {"tp": 4}})", "media-tp4"), "media-tp4"},
       // Into an LLM pipeline: each encoder replica's items of a micro-batch go to its first
       // stage by link, a sample's items from two replicas (or four) put back in order there.
       {colocated(R"({"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}})", "media-pp2dp2"),
        "media-pp2dp2"},
       {colocated(R"({"vision": {"dp": 4}, "llm": {"tp": 2, "pp": 2}})", "media-tp2pp2"),
        "media-tp2pp2"}});
  // One image a sample: two of the four replicas encode none. Torch 2's CPU attention kernels
  // round the image's and the text's attention calls differently per head count, and Adam turns
  // that into a gradient norm 1.1e-5 apart at the third step (measured; check_parity allows 3e-5).
  check_plans_agree(scenario(1, "media-sparse"), "media-sparse-1",
                    {{colocated(R"({"vision": {"dp": 4}, "llm": {"tp": 4}})", "media-sparse-tp4"),
                      "media-sparse-tp4"}});
  // An audio encoder deals recordings the same way: two samples of two recordings and one
  // image, the trainable Whisper-style encoder and the ViT on four replicas each beside an LLM
  // on TP 2 x DP 2 (a sample's two recordings over two replicas, its image on one of two).
  const std::string valm = edited_scenario(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-valm.json",
      [](Json& s) {
        s["workload"]["global_batch"] = 2;
        s["workload"]["samples"]["image"]["count"] = 1;
        s["workload"]["samples"]["audio"]["count"] = 2;
      },
      "media-valm");
  check_plans_agree(
      valm, "media-valm-1",
      {{colocated(R"({"vision": {"dp": 4}, "audio": {"dp": 4}, "llm": {"tp": 2, "dp": 2}})",
                  "media-valm-tp2dp2"),
        "media-valm-tp2dp2"},
       {colocated(R"({"vision": {"dp": 4}, "audio": {"dp": 4}, "llm": {"pp": 2, "dp": 2}})",
                  "media-valm-pp2dp2"),
        "media-valm-pp2dp2"}});
  // Whole samples cannot feed four replicas from two samples: refused, naming the field.
  const Run whole = run(three + " --plan " +
                        raw_plan(R"({"placement": "colocated", "schedule": "three_phase",
                                     "modules": {"vision": {"dp": 4}, "llm": {"tp": 4}}})",
                                 "media-whole"));
  CHECK(whole.code == 2);
  CHECK(whole.output.find("4 does not divide global_batch=2") != std::string::npos);
}

TEST_CASE(
    "fully sharded data parallelism: units gathered and reduced per micro-batch; plans agree") {
  // One-layer units (buckets of 10 kB of fp32 weights): each unit's weights gathered from the
  // shards before its forward and its backward of every micro-batch, its gradients
  // reduce-scattered after each backward into the shard, the frozen ViT's weights sharded too.
  const std::string fsdp = R"(, "distributed_optimizer": true, "fully_sharded": true,
                              "grad_bucket_mb": 0.01)";
  const auto homogeneous = [&](const std::string& layout, const std::string& extra,
                               const std::string& name) {
    return raw_plan(R"({"placement": "homogeneous", "schedule": "1f1b", "micro_batch_size": 1,
                        "layout": )" +
                        layout + fsdp + extra + "}",
                    name);
  };
  check_plans_agree(
      kScenario, "fsdp-1",
      {{homogeneous(R"({"dp": 4})", "", "fsdp-dp4"), "fsdp-dp4"},
       {homogeneous(R"({"pp": 2, "dp": 2})", "", "fsdp-pp2dp2"), "fsdp-pp2dp2"},
       {homogeneous(R"({"tp": 2, "dp": 2})", R"(, "recompute": "full")", "fsdp-tp2dp2-full"),
        "fsdp-tp2dp2-full"},
       {raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b",
                    "micro_batch_size": 1, "modules": {"vision": {"dp": 2}, "llm": {"dp": 2}})" +
                     fsdp + "}",
                 "fsdp-nc"),
        "fsdp-nc"}});
  // A trainable ViT: its units' gradients reduce-scattered too.
  const std::string trainable = edited_scenario(
      kScenario, [](Json& s) { s["model"]["modules"][0]["frozen"] = false; }, "fsdp-vit");
  check_plans_agree(
      trainable, "fsdp-vit-1",
      {{homogeneous(R"({"pp": 2, "dp": 2})", "", "fsdp-vit-pp2dp2"), "fsdp-vit-pp2dp2"}});
  // FP8 GEMMs are priced by the simulator but not run here: refused, naming the key.
  const Run fp8 =
      run(kScenario + " --plan " +
          raw_plan(R"({"placement": "homogeneous", "layout": {"dp": 2}, "fp8": "delayed"})",
                   "fp8-refused"));
  CHECK(fp8.code == 2);
  CHECK(fp8.output.find("fp8") != std::string::npos);
  // So are DeepEP's dispatch, the overlapped expert all-to-alls and per-op checkpointing.
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"moe_dispatcher", R"("deepep")"},
                                                        {"moe_a2a_overlap", "true"},
                                                        {"recompute", R"("per_op")"}}) {
    const Run moe = run(kScenario + " --plan " +
                        raw_plan(R"({"placement": "homogeneous", "layout": {"dp": 2}, ")" + key +
                                     "\": " + value + "}",
                                 "moe-refused"));
    CHECK(moe.code == 2);
    CHECK(moe.output.find("plan." + key) != std::string::npos);
  }
  // Sequence parallelism with MoE layers (each TP rank would route its own rows).
  const Run sp = run(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json --plan " +
      raw_plan(R"({"placement": "homogeneous", "layout": {"tp": 2}, "sequence_parallel": true})",
               "sp-refused"));
  CHECK(sp.code == 2);
  CHECK(sp.output.find("plan.sequence_parallel: sequence parallelism") != std::string::npos);
  CHECK(sp.output.find("MoE layers") != std::string::npos);
  // The same plan with it set off (--set after --plan) runs, and records the plan it ran.
  const fs::path off = fresh_dir("sp-off");
  const Run sp_off = run(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json --plan " +
      raw_plan(R"({"placement": "homogeneous", "layout": {"tp": 2}, "sequence_parallel": true})",
               "sp-on") +
      " --set plan.sequence_parallel=false --steps 1 --out " + off.string());
  INFO(sp_off.output);
  CHECK(sp_off.code == 0);
  const Json ran = Json::parse(std::ifstream(off / "run.json"));
  CHECK(ran["plan"]["sequence_parallel"] == false);
  CHECK(ran["plan"]["layout"]["tp"] == 2);
  // A malformed --set is refused, naming the option.
  const Run bad_set = run(kScenario + " --set plan.sequence_parallel --steps 1");
  CHECK(bad_set.code == 2);
  CHECK(bad_set.output.find("--set") != std::string::npos);
  const Run partial = run(
      kScenario + " --plan " +
      raw_plan(
          R"({"placement": "homogeneous", "layout": {"dp": 2}, "recompute": "full", "recompute_layers": 1})",
          "partial-refused"));
  CHECK(partial.code == 2);
  CHECK(partial.output.find("plan.recompute_layers") != std::string::npos);
  // Selective recomputation runs the attention core again; other submodules are refused.
  const Run modules = run(
      kScenario + " --plan " +
      raw_plan(
          R"({"placement": "homogeneous", "layout": {"dp": 2}, "recompute": "selective", "recompute_modules": ["core_attn", "layernorm"]})",
          "modules-refused"));
  CHECK(modules.code == 2);
  CHECK(modules.output.find("plan.recompute_modules") != std::string::npos);
  // Whole experts on each TP rank (expert TP 1) are priced, not run.
  const Run etp = run(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json --plan " +
      raw_plan(
          R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 2, "ep": 2, "etp": 1}, "sequence_parallel": true})",
          "etp-refused"));
  CHECK(etp.code == 2);
  CHECK(etp.output.find("plan.layout.etp: routed experts whole") != std::string::npos);
}

TEST_CASE(
    "Gemma 3 and InternViT-6B layers (query/key norms, four norms per layer, a normalized "
    "linear projector, biased attention outputs): plans agree with one rank") {
  const std::string scenario = edited_scenario(
      kScenario,
      [](Json& s) {
        Json& modules = s["model"]["modules"];
        modules[0]["frozen"] = false;
        Json& vit = modules[0]["transformer"];
        vit["linear_bias"] = false;
        vit["mlp_bias"] = true;
        vit["out_bias"] = true;
        modules[1]["projector"] = Json{{"in", 64},      {"out", 128},         {"layers", 1},
                                       {"bias", false}, {"input_norm", true}, {"norm", "rmsnorm"}};
        modules[2]["transformer"]["qk_norm"] = true;
        modules[2]["transformer"]["post_norms"] = true;
      },
      "gemma-like");
  check_plans_agree(scenario, "gemma-like-1",
                    {{plan_file(R"({"pp": 2})"), "gemma-like-pp2"},
                     {plan_file(R"({"dp": 2})"), "gemma-like-dp2"},
                     {plan_file(R"({"cp": 2})"), "gemma-like-cp2"}},
                    3,
                    // Under torch 2.11's CPU kernels the CP run's first gradient norm agrees to
                    // 3e-9, its third drifts 1.2e-5 (query/key and post norms: small gradients).
                    3e-5);
  // Under TP each rank's heads would give the shared norm weights a partial gradient: refused.
  const Run tp2 = run(scenario + " --plan " + plan_file(R"({"tp": 2})") + " --steps 1 --out " +
                      fresh_dir("gemma-like-tp2").string());
  CHECK(tp2.code == 2);
  CHECK(tp2.output.find("plan.layout.tp: llm's query/key norms under tensor parallelism") !=
        std::string::npos);
}

TEST_CASE(
    "InternViT's layer scales and its stack without a final norm: plans agree with one rank") {
  const std::string scenario = edited_scenario(
      kScenario,
      [](Json& s) {
        Json& vit = s["model"]["modules"][0];
        vit["frozen"] = false;
        vit["transformer"]["layer_scale"] = true;
        vit["transformer"]["final_norm"] = false;
      },
      "internvit-like");
  check_plans_agree(scenario, "internvit-like-1",
                    {{plan_file(R"({"tp": 2})"), "internvit-like-tp2"},
                     {plan_file(R"({"pp": 2})"), "internvit-like-pp2"}});
}

TEST_CASE(
    "a mixture-of-experts LLM with expert parallelism (EP 2, EP 2 x TP 2, EP 2 of DP 4, EP 2 "
    "beside PP 2 with bucketed reductions, the distributed optimizer): plans agree with one "
    "rank") {
  // 8 experts, top 2, a shared expert; the router trains too.
  const std::string moe = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json";
  const std::string ep4 = plan_file(R"({"dp": 4, "ep": 2})");
  check_plans_agree(
      moe, "moe-1",
      {{plan_file(R"({"dp": 2, "ep": 2})"), "moe-ep2"},
       {plan_file(R"({"tp": 2, "dp": 2, "ep": 2})"), "moe-ep2-tp2"},
       {ep4, "moe-ep2-dp4"},
       {plan_file(R"({"pp": 2, "dp": 2, "ep": 2}, "overlap_grad_reduce": true)"), "moe-ep2-pp2"},
       // The distributed optimizer: routed experts' state shared by their own replicas.
       {plan_file(R"({"dp": 4, "ep": 2}, "distributed_optimizer": true)"), "moe-ep2-dp4-sharded"},
       {plan_file(R"({"pp": 2, "dp": 2, "ep": 2}, "distributed_optimizer": true,
                     "overlap_grad_reduce": true, "overlap_param_gather": true)"),
        "moe-ep2-pp2-sharded-overlap"}});
  // The executed ops are the Program's, its routed experts' own reduction included; the
  // dispatch and combine all-to-alls show inside the compute ops that ran them.
  check_trace_is_program(out_dir("moe-ep2-dp4"), moe, ep4);
  CHECK(rank0_events("moe-ep2-dp4", [](const std::string& n) { return n == "gloo:alltoall"; }) > 0);
  CHECK(rank0_events("moe-ep2-dp4", ending(".experts")) > 0);
  // Regression: with few tokens and many experts, some rank's experts receive no rows; its
  // backward still takes part in both all-to-alls (16 experts, top 1, EP 4 of DP 4).
  const std::string sparse = edited_scenario(
      moe,
      [](Json& s) {
        s["model"]["modules"][2]["transformer"]["experts"] = 16;
        s["model"]["modules"][2]["transformer"]["top_k"] = 1;
        s["workload"]["samples"] =
            Json{{"text_tokens", Json{{"dist", "uniform"}, {"min", 1}, {"max", 3}}}};
      },
      "moe-sparse");
  check_plans_agree(sparse, "moe-sparse-1",
                    {{plan_file(R"({"dp": 4, "ep": 4})"), "moe-sparse-ep4"}}, 2);
  // Dense layers among the MoE ones (dense, dense, MoE, dense): a pipeline stage of dense layers
  // only has no experts to route to and no routed-expert reduction.
  const std::string pattern = edited_scenario(
      moe,
      [](Json& s) {
        s["model"]["modules"][2]["transformer"]["dense_layers"] = 1;
        s["model"]["modules"][2]["transformer"]["moe_every"] = 2;
      },
      "moe-pattern");
  check_plans_agree(
      pattern, "moe-pattern-1",
      {{plan_file(R"({"dp": 2, "ep": 2})"), "moe-pattern-ep2"},
       {plan_file(R"({"pp": 2, "dp": 2, "ep": 2, "stage_layers": [2, 2]})"), "moe-pattern-pp2"}},
      2);
  // Multi-head latent attention (a query latent, rotary keys shared by the heads, values
  // narrower than the query/key heads) and a router score bias, DeepSeek-V3's shape: the
  // whole-on-every-rank down-projections get the same full gradient on every TP rank.
  const std::string latent = edited_scenario(
      moe,
      [](Json& s) {
        Json& t = s["model"]["modules"][2]["transformer"];
        deepseek_v3_shape(t);
        t["dense_layers"] = 1;
      },
      "moe-latent");
  check_plans_agree(latent, "moe-latent-1",
                    {{plan_file(R"({"tp": 2, "pp": 2})"), "moe-latent-tp2-pp2"},
                     {plan_file(R"({"tp": 2, "dp": 2, "ep": 2})"), "moe-latent-ep2-tp2"},
                     {plan_file(R"({"cp": 2})"), "moe-latent-cp2"}},
                    2);
  // Refused with its reason: token dropping.
  const std::string capped = edited_scenario(
      moe, [](Json& s) { s["model"]["modules"][2]["transformer"]["capacity_factor"] = 1.25; },
      "moe-capacity");
  const Run dropping = run(capped + " --steps 1 --out " + fresh_dir("moe-capacity-run").string());
  CHECK(dropping.code == 2);
  CHECK(dropping.output.find("token dropping (capacity_factor) is not in the executor") !=
        std::string::npos);
  // And multi-token prediction.
  const std::string mtp = edited_scenario(
      moe, [](Json& s) { s["model"]["modules"][2]["transformer"]["mtp_layers"] = 1; }, "moe-mtp");
  const Run predicting = run(mtp + " --steps 1 --out " + fresh_dir("moe-mtp-run").string());
  CHECK(predicting.code == 2);
  CHECK(predicting.output.find("llm: multi-token-prediction layers (mtp_layers) are not in the "
                               "executor yet") != std::string::npos);
}

TEST_CASE(
    "activation recomputation (full: the layers run again before their backward; selective: "
    "the attention cores in it): every placement reaches the single-rank losses") {
  // Reference: one rank, no recomputation. Each plan recomputes its modules' layers (R ops);
  // the losses and gradient norms stay the single rank's.
  const std::string plans = std::string(TESSERA_SOURCE_DIR) + "/scenarios/plans/";
  // A plan file's JSON with recomputation (and `extra` fields) on.
  auto recomputing = [&](const std::string& file, const std::string& extra = "") {
    Json p = Json::parse(std::ifstream(plans + file));
    p["recompute"] = "full";
    if (!extra.empty()) p.update(Json::parse(extra));
    const std::string text = p.dump();
    return raw_plan(text, "recompute-" + std::to_string(std::hash<std::string>{}(text)));
  };
  check_plans_agree(kScenario, "recompute-ref",
                    {{recomputing("cpu-tiny-tp2-pp2.json"), "recompute-tp2-pp2"},
                     {recomputing("cpu-tiny-tp2-pp2.json", R"({"recompute": "selective"})"),
                      "recompute-selective-tp2-pp2"},
                     {recomputing("cpu-tiny-dp2-pp2.json", R"({"overlap_grad_reduce": true,
          "distributed_optimizer": true, "overlap_param_gather": true})"),
                      "recompute-dp2-pp2-overlap"},
                     {recomputing("cpu-tiny-dp2-pp2.json", R"({"microbatching": "entrain"})"),
                      "recompute-entrain"},
                     {recomputing("cpu-tiny-colocated.json"), "recompute-colocated"},
                     {recomputing("cpu-tiny-non-colocated.json"), "recompute-non-colocated"}});
  check_plans_agree(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-valm.json", "recompute-valm-ref",
      {{recomputing("cpu-tiny-valm-tp2-dp2.json"), "recompute-valm-tp2-dp2"},
       {recomputing("cpu-tiny-valm-non-colocated.json"), "recompute-valm-non-colocated"}});
  check_plans_agree(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json",
                    "recompute-moe-ref", {{recomputing("cpu-tiny-moe-ep2.json"), "recompute-moe"}});
  // The R ops run where the Program puts them, with the layers' TP collectives inside them.
  const std::string tp2 = recomputing("cpu-tiny-tp2-pp2.json");
  check_trace_is_program(out_dir("recompute-tp2-pp2"), kScenario, tp2);
  CHECK(rank0_events("recompute-tp2-pp2", ending(".R")) > 0);
}

TEST_CASE("key/value heads replicated over TP ranks: their gradients summed, plans agree") {
  // One key/value head in the LLM: TP 2 and TP 4 replicate it 2 and 4 ways.
  const std::string scenario = edited_scenario(
      kScenario, [](Json& s) { s["model"]["modules"][2]["transformer"]["kv_heads"] = 1; }, "kv1");
  const std::string overlap = plan_file(R"({"tp": 2, "dp": 2}, "overlap_grad_reduce": true,
      "distributed_optimizer": true, "overlap_param_gather": true)");
  check_plans_agree(scenario, "kv1-1",
                    {{plan_file(R"({"tp": 2, "pp": 2})"), "kv1-tp2-pp2"},
                     {plan_file(R"({"tp": 4})"), "kv1-tp4"},
                     {overlap, "kv1-tp2-dp2-overlap"}});
  // The sums run where the Program puts them (one per bucket, before its data-parallel
  // reduction).
  check_trace_is_program(out_dir("kv1-tp2-dp2-overlap"), scenario, overlap);
  CHECK(rank0_events("kv1-tp2-dp2-overlap", ending(".kv")) > 0);
}

TEST_CASE("a non-colocated projector on ranks of its own: plans agree with one rank") {
  // The encoder's rows travel to the projector's ranks by links, and its gradient back; the
  // audio encoder trains, so a lost gradient would show in the norm.
  const std::string valm = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-valm.json";
  const auto own = [](const std::string& modules, const std::string& name) {
    return raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b",
                        "micro_batch_size": 1, "modules": )" +
                        modules + "}",
                    name);
  };
  check_plans_agree(
      kScenario, "projector-ref",
      {{own(R"({"vision": {"dp": 2}, "vision_projector": {"dp": 1}, "llm": {"dp": 1}})",
            "projector-fan-in"),
        "projector-fan-in"},
       {own(R"({"vision": {"dp": 1}, "vision_projector": {"tp": 2}, "llm": {"tp": 2}})",
            "projector-tp2"),
        "projector-tp2"}});
  const std::string both = own(R"({"vision": {"dp": 1}, "vision_projector": {"dp": 1},
      "audio": {"dp": 1}, "audio_projector": {"dp": 1}, "llm": {"pp": 2}})",
                               "projector-valm-both");
  check_plans_agree(valm, "projector-valm-ref",
                    {{both, "projector-valm-both"},
                     {own(R"({"vision": {"dp": 1}, "audio": {"dp": 2}, "audio_projector": {"dp": 1},
                              "llm": {"dp": 1}})",
                          "projector-valm-fan-in"),
                      "projector-valm-fan-in"}});
  check_trace_is_program(out_dir("projector-valm-both"), valm, both);
}

TEST_CASE("video clips through a ViT of 2-frame patches, tokens merged 2x2: plans agree") {
  // One trainable ViT for images and 1-5 frame clips (Qwen2-VL's shape at a fixed size): a clip
  // runs as ceil(frames / 2) pieces of two frames, an image as one piece of itself twice; each
  // piece's 4 x 4 patches become 2 x 2 tokens of 4 x 64 values for the projector.
  const std::string video = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-video.json";
  const std::string non_colocated =
      raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b", "micro_batch_size": 1,
               "modules": {"vision": {"pp": 2}, "vision_projector": {"dp": 1},
                           "llm": {"dp": 1}}})",
               "video-non-colocated");
  const std::string dip = raw_plan(R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2},
      "micro_batch_size": 2, "schedule": "dip"})",
                                   "video-dip");
  check_plans_agree(video, "video-1",
                    {{plan_file(R"({"tp": 2, "pp": 2})"), "video-tp2-pp2"},
                     {plan_file(R"({"dp": 2}, "overlap_grad_reduce": true)"), "video-dp2"},
                     {non_colocated, "video-non-colocated"}});
  // DIP cuts micro-batches of two samples into pieces of whole images and clips: with a deeper
  // ViT and one or two clips a sample, some micro-batch is cut in two.
  const std::string deeper = edited_scenario(
      video,
      [](Json& s) {
        s["model"]["modules"][0]["transformer"]["layers"] = 8;
        s["workload"]["samples"]["video"]["count"] = Json{{"dist", "choice"}, {"values", {1, 2}}};
      },
      "video-deeper");
  CHECK(most_sub_microbatch(deeper, dip) >= 1);
  // The same under the LLM's TP 2 with sequence parallelism.
  const std::string dip_sp =
      raw_plan(R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "vpp": 2},
      "micro_batch_size": 2, "schedule": "dip", "sequence_parallel": true})",
               "video-dip-tp2-sp");
  check_plans_agree(deeper, "video-dip-1", {{dip, "video-dip"}, {dip_sp, "video-dip-tp2-sp"}}, 2);
  check_trace_is_program(out_dir("video-non-colocated"), video, non_colocated);
  // A clip of its own encoder: the same ViT as a video encoder, the samples' images dropped.
  const std::string own = edited_scenario(
      video,
      [](Json& s) {
        s["model"]["modules"][0]["modality"] = "video";
        s["workload"]["samples"].erase("image");
      },
      "video-own");
  check_plans_agree(own, "video-own-1", {{plan_file(R"({"pp": 2})"), "video-own-pp2"}});
}

TEST_CASE("schedule dip with an audio encoder: its windows cut into sub-micro-batches agree") {
  // The audio-visual model with a deeper trainable audio encoder and two or three clips of two
  // windows a sample: each micro-batch's clips (their windows) go through the encoder's segments
  // in pieces.
  const std::string valm = edited_scenario(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-valm.json",
      [](Json& s) {
        s["model"]["modules"][2]["transformer"]["layers"] = 16;
        Json& audio = s["workload"]["samples"]["audio"];
        audio["count"] = Json{{"dist", "choice"}, {"values", {2, 3}}};
        audio["seconds"] = Json{{"dist", "uniform"}, {"min", 2.5}, {"max", 3.5}};
      },
      "dip-audio");
  const std::string dip = raw_plan(R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2},
      "micro_batch_size": 2, "schedule": "dip"})",
                                   "dip-audio-plan");
  CHECK(most_sub_microbatch(valm, dip, "audio") >= 1);
  // The 16-layer encoder runs its windows in smaller batches than one rank does, and fp32
  // products of other row counts round differently: the gradient norms agree to 7.5e-6 with
  // Debian's LibTorch 1.13 and 1.4e-5 with torch 2.11's kernels (measured), the losses to 1e-6.
  check_plans_agree(valm, "dip-audio-1", {{dip, "dip-audio-run"}}, 2, 5e-5);
  check_trace_is_program(out_dir("dip-audio-run"), valm, dip);
}

TEST_CASE("heads TP does not divide, padded or replicated over TP: TP 2 agrees with one rank") {
  // Padded: the ViT's 3 heads become 4 at TP 2; rank 1 holds the third head and a zero one,
  // whose weights, output and gradients stay zero, so the run is the unpadded one rank's.
  // Replicated: each TP rank runs the whole ViT on the same images, and its gradients, equal
  // on every TP rank, count once in the norm.
  const std::string three = three_head_vit();
  check_plans_agree(
      three, "indivisible-heads-1",
      {{plan_file(R"({"tp": 2}, "indivisible_heads": "pad")"), "padded-heads-tp2"},
       {plan_file(R"({"tp": 2, "pp": 2}, "indivisible_heads": "pad")"), "padded-heads-tp2pp2"},
       {plan_file(R"({"tp": 2}, "indivisible_heads": "replicate")"), "replicated-heads-tp2"},
       {plan_file(R"({"tp": 2, "dp": 2}, "indivisible_heads": "replicate")"),
        "replicated-heads-tp2dp2"}});
  // Without the option the plan is refused, naming the field.
  const Run refused = run(three + " --plan " + plan_file(R"({"tp": 2})"));
  CHECK(refused.code == 2);
  CHECK(refused.output.find("2 does not divide vision heads=3") != std::string::npos);
}

TEST_CASE("a three-layer projector runs whole on every TP rank: TP 2 agrees with one rank") {
  const std::string scenario = edited_scenario(
      kScenario, [](Json& s) { s["model"]["modules"][1]["projector"]["layers"] = 3; },
      "projector3");
  check_plans_agree(scenario, "projector3-1", {{plan_file(R"({"tp": 2})"), "projector3-tp2"}});
}

TEST_CASE("frozen LLM behind a trainable projector (LLaVA stage 1) still passes gradients back") {
  Diagnostics diag;
  auto s = load_scenario(kScenario, diag);
  REQUIRE(s.has_value());
  for (ModuleSpec& m : s->model.modules)
    if (m.role == ModuleRole::kLlm) m.frozen = true;
  const fs::path dir = fresh_dir("stage1");
  fs::create_directories(dir);
  const std::string file = (dir / "stage1.json").string();
  std::ofstream(file) << inline_scenario_json(*s).dump();
  const Trained reference = train_with(file, plan_file(R"({"tp": 1})"), "stage1-single");
  check_parity(train_with(file, plan_file(R"({"tp": 2, "pp": 2})"), "stage1-tp2pp2"), reference);
  // Only the projector trains, and its gradient comes back through the frozen LLM: a nonzero
  // norm (an LLM that stopped the gradient leaves none), the same under TP 2 x PP 2 (above).
  REQUIRE(reference.norm.size() == 3);
  for (const double n : reference.norm) CHECK(n > 1e-3);
  // The frozen LLM holds no gradients and no optimizer state: visible in run.json.
  const std::vector<double> trainable = train(R"({"tp": 1})", "stage1-trainable-llm");
  REQUIRE(trainable.size() == 3);
  auto state_bytes = [](const std::string& name) {
    std::ifstream in(fs::temp_directory_path() /
                     ("tessera-train-test-" + std::to_string(::getpid())) / name / "run.json");
    return Json::parse(in).at("memory_per_rank").at(0).at("parameter_state_bytes").get<double>();
  };
  CHECK(state_bytes("stage1-single") < 0.5 * state_bytes("stage1-trainable-llm"));
}

TEST_CASE("everything trainable (the vision encoder too): plans agree") {
  Diagnostics diag;
  auto s = load_scenario(kScenario, diag);
  REQUIRE(s.has_value());
  for (ModuleSpec& m : s->model.modules) m.frozen = false;
  const fs::path dir = fresh_dir("all-trainable");
  fs::create_directories(dir);
  const std::string file = (dir / "all-trainable.json").string();
  std::ofstream(file) << inline_scenario_json(*s).dump();
  const Trained reference = train_with(file, plan_file(R"({"tp": 1})"), "all-single");
  check_parity(train_with(file, plan_file(R"({"tp": 2, "dp": 2})"), "all-tp2dp2"), reference);
  check_parity(train_with(file,
                          raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b",
      "micro_batch_size": 1, "modules": {"vision": {"dp": 2}, "llm": {"pp": 2}}})",
                                   "all-nc"),
                          "all-nc"),
               reference);
  // The trainable ViT pipelined over two stages of its own (Cornstarch's per-module stage
  // counts): activations and their gradients cross between its stages.
  check_parity(train_with(file,
                          raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b",
      "micro_batch_size": 1, "modules": {"vision": {"pp": 2}, "llm": {"pp": 2}}})",
                                   "all-nc-vision-pp2"),
                          "all-nc-vision-pp2"),
               reference);
}

TEST_CASE("entrain micro-batching: the same losses as arrival order (PP2, everything trainable)") {
  // Two levels of micro-batches: the encoders balanced by their work, the LLM's deferring its
  // excess to the next micro-batch; every sample still trains once in the iteration, so the
  // losses are arrival order's up to summation order.
  Diagnostics diag;
  auto s = load_scenario(kScenario, diag);
  REQUIRE(s.has_value());
  for (ModuleSpec& m : s->model.modules) m.frozen = false;
  s->workload.global_batch = 32;  // 16 micro-batches of 2
  const fs::path dir = fresh_dir("entrain");
  fs::create_directories(dir);
  const std::string file = (dir / "entrain.json").string();
  std::ofstream(file) << inline_scenario_json(*s).dump();
  // In these three iterations a sample with an image is deferred (iteration 2): its ViT rows
  // come from one micro-batch's output, its LLM tokens train in the next; without that this
  // would test nothing new.
  bool deferred_image = false;
  for (int64_t it = 0; it < 3; ++it) {
    const Batch b = draw_batch(s->workload, it);
    const EntrainAssignment a = entrain_assignment(b, s->model, 1, 16, s->workload.max_seq_len);
    for (std::size_t i = 0; i < a.encoder[0].size(); ++i)
      for (int32_t x : a.encoder[0][i])
        if (std::find(a.llm[0][i].begin(), a.llm[0][i].end(), x) == a.llm[0][i].end())
          deferred_image |= !b.samples[static_cast<std::size_t>(x)].images.empty();
  }
  REQUIRE(deferred_image);
  const Trained reference = train_with(
      file,
      raw_plan(R"({"placement": "homogeneous", "layout": {"tp": 1}, "micro_batch_size": 2,
                         "schedule": "1f1b"})",
               "entrain-reference"),
      "entrain-reference");
  check_parity(train_with(file,
                          raw_plan(R"({"placement": "homogeneous", "layout": {"pp": 2},
      "micro_batch_size": 2, "schedule": "1f1b", "microbatching": "entrain"})",
                                   "entrain-pp2"),
                          "entrain-pp2"),
               reference);
  // Colocated: the encoders run the whole batch at once, the LLM's micro-batches are Entrain's
  // (level 2) and take their rows from the regrouped boundary (fan-in, LLM pipeline).
  check_parity(train_with(file,
                          raw_plan(R"({"placement": "colocated", "schedule": "three_phase",
      "micro_batch_size": 2, "microbatching": "entrain",
      "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}}})",
                                   "entrain-colocated"),
                          "entrain-colocated"),
               reference);
  // Non-colocated: each encoder replica runs level-1 micro-batches and sends their rows; the
  // LLM's micro-batch takes its samples' rows from the one or two encoder micro-batches that
  // hold them, whose gradients go back once both LLM micro-batches are done. Fan-in into an LLM
  // pipeline; equal replicas into TP 2 (a broadcast behind the leader); a pipelined ViT.
  for (const auto& [modules, name] : std::vector<std::pair<std::string, std::string>>{
           {R"({"vision": {"dp": 2}, "llm": {"pp": 2}})", "entrain-nc-fan-in"},
           {R"({"vision": {"dp": 2}, "llm": {"tp": 1, "dp": 2}})", "entrain-nc-same-dp"},
           {R"({"vision": {"dp": 2}, "llm": {"tp": 2}})", "entrain-nc-tp2"},
           {R"({"vision": {"pp": 2}, "llm": {"pp": 2}})", "entrain-nc-vit-pp2"}}) {
    INFO(name);
    check_parity(train_with(file,
                            raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b",
        "micro_batch_size": 2, "microbatching": "entrain", "modules": )" +
                                         modules + "}",
                                     name),
                            name),
                 reference);
  }
  // The LLM's TP 2 under sequence parallelism, its micro-batches Entrain's.
  check_parity(train_with(file,
                          raw_plan(R"({"placement": "non_colocated", "schedule": "graph_1f1b",
      "micro_batch_size": 2, "microbatching": "entrain", "sequence_parallel": true,
      "modules": {"vision": {"dp": 2}, "llm": {"tp": 2}}})",
                                   "entrain-nc-tp2-sp"),
                          "entrain-nc-tp2-sp"),
               reference);
}

TEST_CASE("single rank: the Program interpreter gives the plain LibTorch loop's losses") {
  const std::vector<double> program = train(R"({"tp": 1})", "interpreted");
  const Run plain =
      run("plain-loop " + kScenario + " --plan " + plan_file(R"({"tp": 1})") + " --steps 3");
  INFO(plain.output);
  REQUIRE(plain.code == 0);
  std::vector<double> loop;
  std::istringstream lines(plain.output);
  std::string word;
  while (lines >> word)
    if (word == "loss" && lines >> word) loop.push_back(std::stod(word));
  REQUIRE(loop.size() == program.size());
  for (std::size_t i = 0; i < loop.size(); ++i)
    CHECK(std::abs(loop[i] - program[i]) <= 1e-6 * std::abs(program[i]));
}

namespace {

// Every rank's executed ops (trace slices with a phase, in time order) are its lowered ops, and
// each compute op ran as many collectives inside it as the Program's nested collectives say,
// each of a kind and size one of them has (what replay and calibration match them by; an
// all-to-all's size follows the routing, its kind alone is checked).
void check_trace_is_program(const fs::path& out, const std::string& scenario,
                            const std::string& plan) {
  Diagnostics diag;
  const auto s = load_scenario_with_plan(scenario, plan, diag);
  REQUIRE(s.has_value());
  const exec::TrainBatch batch = exec::make_batch(*s, exec::DatasetKind::kSynthetic, 0);
  const Lowered lowered =
      lower(s->model, s->cluster, resolve_stage_split(*s->plan, s->model, s->workload, s->cluster),
            s->workload, batch.batch);
  REQUIRE(lowered.error.empty());
  for (int rank = 0; rank < lowered.program.world; ++rank) {
    std::ifstream in(out / "trace" / ("rank" + std::to_string(rank) + ".json"));
    const Json trace = Json::parse(in);
    std::vector<std::pair<double, std::string>> executed;
    std::map<std::string, int> nested;  // op id -> collectives run inside it
    std::map<std::string, std::vector<std::pair<std::string, double>>> slices;  // kind, bytes
    for (const Json& e : trace.at("traceEvents"))
      if (e.value("ph", "") == "X" && e.contains("args") &&
          e["args"]["op_id"].get<std::string>().rfind("it0.", 0) == 0) {  // the first step
        if (e["args"].contains("phase")) {
          executed.emplace_back(e.at("ts").get<double>(), e["args"]["op_id"].get<std::string>());
        } else {
          ++nested[e["args"]["op_id"].get<std::string>()];
          const std::string name = e.at("name").get<std::string>();
          slices[e["args"]["op_id"].get<std::string>()].emplace_back(
              name.substr(name.rfind(':') + 1), e["args"].value("bytes", 0.0));
        }
      }
    std::stable_sort(executed.begin(), executed.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    const auto& ops = lowered.program.ranks[static_cast<std::size_t>(rank)];
    REQUIRE(executed.size() == ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const std::string id = op_id(lowered.program, rank, static_cast<int32_t>(i));
      CHECK(executed[i].second == id);
      int expected = 0;
      for (const NestedCollective& n : ops[i].nested) expected += n.count;
      INFO(id << " " << op_name(lowered.program, ops[i]));
      CHECK(nested[id] == expected);
      for (const auto& [kind, bytes] : slices[id]) {
        bool found = false;
        for (const NestedCollective& n : ops[i].nested)
          found |= collective_name(n.kind) == kind &&
                   (n.kind == CollectiveKind::kAllToAll ||
                    std::abs(n.bytes - bytes) <= 1e-6 * std::max(1.0, n.bytes));
        INFO(kind << " of " << bytes << " bytes");
        CHECK(found);
      }
    }
  }
}

}  // namespace

TEST_CASE("the ops executed are the Program's, in order (trace op ids against lower())") {
  const fs::path out = fresh_dir("trace");
  const std::string plan = plan_file(R"({"tp": 2, "pp": 2})");
  const Run r = run(kScenario + " --plan " + plan + " --steps 1 --out " + out.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  check_trace_is_program(out, kScenario, plan);
  // TP all-reduces show inside the compute ops that ran them.
  for (int rank = 0; rank < 4; ++rank) {
    std::ifstream in(out / "trace" / ("rank" + std::to_string(rank) + ".json"));
    const Json trace = Json::parse(in);
    int nested = 0;
    for (const Json& e : trace.at("traceEvents"))
      if (e.value("name", "") == "gloo:allreduce") ++nested;
    CHECK(nested > 0);
  }
}

TEST_CASE(
    "non-colocated placements: disjoint spans, leader links, broadcast, CP sum; losses agree") {
  train(R"({"tp": 1})", "nc-reference");
  const Trained reference = recorded("nc-reference");
  auto nc = [](const std::string& modules, const std::string& name) {
    return raw_plan(
        R"({"placement": "non_colocated", "schedule": "graph_1f1b", "micro_batch_size": 1, "modules": )" +
            modules + "}",
        name);
  };
  for (const auto& [modules, name] : std::vector<std::pair<std::string, std::string>>{
           {R"({"vision": {"dp": 2}, "llm": {"pp": 2}})", "nc-dp2-pp2"},  // fan-in
           {R"({"vision": {"dp": 1}, "llm": {"tp": 2}})", "nc-tp2"},      // broadcast
           {R"({"vision": {"dp": 1}, "llm": {"dp": 2}})", "nc-fan-out"},
           {R"({"vision": {"dp": 2}, "llm": {"cp": 2}})", "nc-cp2"},  // CP gradient sum
           {R"({"vision": {"pp": 2}, "llm": {"pp": 2}})",
            "nc-vision-pp2"}}) {  // frozen ViT, 2 stages
    const std::string plan = nc(modules, name);
    const fs::path out = fresh_dir(name);
    const Run r = run(kScenario + " --plan " + plan + " --steps 3 --out " + out.string());
    INFO(name << ": " << r.output);
    REQUIRE(r.code == 0);
    check_parity(recorded(name), reference);
    if (name == "nc-dp2-pp2" || name == "nc-vision-pp2")
      check_trace_is_program(out, kScenario, plan);
  }
  // Image and audio encoders each on their own rank, the LLM pipelined over two more.
  const std::string valm = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-valm.json";
  const Trained valm_reference = train_with(valm, plan_file(R"({"tp": 1})"), "nc-valm-single");
  check_parity(
      train_with(valm,
                 nc(R"({"vision": {"dp": 1}, "audio": {"dp": 1}, "llm": {"pp": 2}})", "nc-valm"),
                 "nc-valm"),
      valm_reference);
  // The Whisper-style encoder on two stages of its own (its windows' tokens back to back
  // between them; the trainable conv front end's gradient checks the GELU workaround), and
  // every module pipelined.
  const std::string audio_pp2 =
      nc(R"({"vision": {"dp": 1}, "audio": {"pp": 2}, "llm": {"dp": 1}})", "nc-audio-pp2");
  check_plans_agree(
      valm, "nc-valm-single-norm",
      {{audio_pp2, "nc-audio-pp2"},
       {nc(R"({"vision": {"pp": 2}, "audio": {"pp": 2}, "llm": {"pp": 2}})", "nc-all-pp2"),
        "nc-all-pp2"}});
  check_trace_is_program(out_dir("nc-audio-pp2"), valm, audio_pp2);
}

TEST_CASE("the shapes data set is learnable: the loss falls by half within 50 steps") {
  const std::vector<double> v = train(R"({"tp": 1})", "shapes", 50, "--dataset shapes");
  REQUIRE(v.size() == 50);
  INFO("first " << v.front() << ", last " << v.back());
  CHECK(v.back() < v.front() / 2);
}

TEST_CASE(
    "resuming from a checkpoint continues the losses exactly, also after a kill mid-checkpoint") {
  const std::vector<double> straight = train(R"({"pp": 2})", "straight", 4);
  const fs::path out = fresh_dir("resumed");
  const std::string common =
      kScenario + " --plan " + plan_file(R"({"pp": 2})") + " --out " + out.string();
  REQUIRE(run(common + " --steps 2").code == 0);
  REQUIRE(fs::exists(out / "checkpoint" / "manifest.json"));
  const Run resumed = run(common + " --steps 4 --resume");
  INFO(resumed.output);
  REQUIRE(resumed.code == 0);
  const std::vector<double> v = losses(out);
  REQUIRE(v.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(v[i] == straight[i]);  // bit for bit

  // Killed (SIGKILL, by a failpoint) at the two moments a checkpoint is incomplete on disk:
  // rank 1's shard of step 3 written but not in place; every shard of step 3 in place but the
  // manifest not yet moved to it. The launcher fails naming the rank; the manifest still names
  // step 2, and resuming from it continues bit for bit.
  for (const std::string failpoint : {"checkpoint-shard-rank1:3", "checkpoint-manifest:3"}) {
    CAPTURE(failpoint);
    const fs::path cut = fresh_dir("killed-" + failpoint.substr(0, failpoint.find(':')));
    const std::string at_cut =
        kScenario + " --plan " + plan_file(R"({"pp": 2})") + " --out " + cut.string();
    ::setenv("TESSERA_FAILPOINT", failpoint.c_str(), 1);
    const Run killed = run(at_cut + " --steps 4 --checkpoint-every 1 --timeout 20");
    ::unsetenv("TESSERA_FAILPOINT");
    INFO(killed.output);
    CHECK(killed.code != 0);
    const std::string victim = failpoint.starts_with("checkpoint-manifest") ? "rank 0" : "rank 1";
    CHECK(killed.output.find(victim) != std::string::npos);
    CHECK(Json::parse(std::ifstream(cut / "checkpoint" / "manifest.json")).at("step") == 2);
    CHECK(fs::exists(cut / "checkpoint" / "step-000003"));  // the incomplete one
    const Run after_cut = run(at_cut + " --steps 4 --resume");
    INFO(after_cut.output);
    REQUIRE(after_cut.code == 0);
    const std::vector<double> w = losses(cut);
    REQUIRE(w.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(w[i] == straight[i]);
  }
}

namespace {

// A pp2 training job of many steps started in the background (stderr to `err_file`); returns the
// launcher's pid.
pid_t start_long_job(const std::string& extra, const std::string& err_file) {
  const std::string cmd = std::string(TESSERA_TRAIN) + " " + kScenario + " --plan " +
                          plan_file(R"({"pp": 2})") + " --steps 100000 " + extra;
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd + " >/dev/null 2>" + err_file).c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return launcher;
}

// The launcher's workers once both run (empty after 10 s without them).
std::vector<pid_t> workers_of(pid_t launcher) {
  std::vector<pid_t> found;
  for (int tries = 0; tries < 200 && found.size() < 2; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    found.clear();
    for (const auto& entry : fs::directory_iterator("/proc")) {
      std::ifstream stat(entry.path() / "stat");
      std::string pid, name, state;
      long ppid = 0;
      if (stat >> pid >> name >> state >> ppid && ppid == launcher)
        found.push_back(static_cast<pid_t>(std::stol(pid)));
    }
  }
  return found.size() == 2 ? found : std::vector<pid_t>{};
}

// Waits for the launcher; its exit status and the seconds since `start`.
std::pair<int, double> wait_job(pid_t launcher, std::chrono::steady_clock::time_point start) {
  int status = 0;
  ::waitpid(launcher, &status, 0);
  return {status, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

std::string text_of(const std::string& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("a worker killed mid-run ends the job within 30 s, non-zero, naming the rank") {
  const std::string err_file = fresh_dir("killed").string() + ".err";
  const pid_t launcher = start_long_job("", err_file);
  REQUIRE(launcher > 0);
  const std::vector<pid_t> workers = workers_of(launcher);
  REQUIRE(workers.size() == 2);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto start = std::chrono::steady_clock::now();
  ::kill(workers.front(), SIGKILL);
  const auto [status, seconds] = wait_job(launcher, start);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(seconds < 30);
  const std::string message = text_of(err_file);
  INFO(message);
  CHECK(message.find("killed by signal 9") != std::string::npos);
}

TEST_CASE("a worker hung in a collective (stopped) ends the job by timeout, no process left") {
  // SIGSTOP: the worker neither dies nor answers; its peers wait in a collective until
  // --timeout, then the launcher stops the job (the stopped worker included).
  const std::string err_file = fresh_dir("hung").string() + ".err";
  const pid_t launcher = start_long_job("--timeout 3", err_file);
  REQUIRE(launcher > 0);
  const std::vector<pid_t> workers = workers_of(launcher);
  REQUIRE(workers.size() == 2);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto start = std::chrono::steady_clock::now();
  ::kill(workers.back(), SIGSTOP);
  const auto [status, seconds] = wait_job(launcher, start);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(seconds < 30);
  for (pid_t pid : workers) CHECK(::kill(pid, 0) != 0);  // reaped: nothing left behind
  const std::string message = text_of(err_file);
  INFO(message);
  CHECK(message.find("rank ") != std::string::npos);
}

TEST_CASE("two nodes on loopback (--nnodes 2 --node-rank i --master) train as one job") {
  const std::vector<double> one_node = train(R"({"pp": 2})", "one-node", 2);
  const int port = exec::free_port();
  const std::string common =
      kScenario + " --plan " + plan_file(R"({"pp": 2})") +
      " --steps 2 --nproc 1 --nnodes 2 --master 127.0.0.1:" + std::to_string(port);
  FILE* node1 = start(common + " --node-rank 1");
  const fs::path out = fresh_dir("two-nodes");
  const Run node0 = run(common + " --node-rank 0 --out " + out.string());
  const Run second = finish(node1);
  INFO(node0.output << second.output);
  CHECK(node0.code == 0);
  CHECK(second.code == 0);
  CHECK(second.output.find("step") == std::string::npos);  // only rank 0 prints progress
  CHECK(losses(out) == one_node);
}

TEST_CASE("bad input: exit 2 with the file named, nothing written") {
  const fs::path out = fresh_dir("bad");
  const Run missing = run("/nonexistent.json --out " + out.string());
  CHECK(missing.code == 2);
  CHECK(missing.output.find("/nonexistent.json") != std::string::npos);
  const Run ranks = run(kScenario + " --plan " + plan_file(R"({"tp": 2})") + " --nproc 3");
  CHECK(ranks.code == 2);
  const Run device = run(kScenario + " --device tpu");
  CHECK(device.code == 2);
  CHECK(device.output.find("--device tpu: expected cpu, cuda or cuda:N") != std::string::npos);
  const Run nccl = run(kScenario + " --transport nccl");
  CHECK(nccl.code == 2);
  CHECK(nccl.output.find("--transport nccl needs --device cuda") != std::string::npos);
#ifndef TESSERA_CUDA
  const Run cuda = run(kScenario + " --device cuda");
  CHECK(cuda.code == 2);
  CHECK(cuda.output.find("has no CUDA") != std::string::npos);
#endif
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("makespan CP split: the executor shards tokens as lower() charges them; losses agree") {
  // The lowering's token tags (from which it charges each CP rank) are the executor's layout.
  Diagnostics diag;
  const auto s = load_scenario(kScenario, diag);
  REQUIRE(s.has_value());
  const exec::TrainBatch batch = exec::make_batch(*s, exec::DatasetKind::kSynthetic, 0);
  std::vector<int32_t> all(batch.batch.samples.size());
  std::vector<const Sample*> pointers;
  for (std::size_t i = 0; i < all.size(); ++i) {
    all[i] = static_cast<int32_t>(i);
    pointers.push_back(&batch.batch.samples[i]);
  }
  const exec::LlmLayout layout = exec::llm_layout(s->model, batch, all, s->workload.max_seq_len);
  const std::vector<TokenTag> tags = llm_token_tags(s->model, pointers, s->workload.max_seq_len);
  REQUIRE(tags.size() == layout.sample.size());
  for (std::size_t t = 0; t < tags.size(); ++t) {
    CHECK(tags[t].sample == layout.sample[t]);
    CHECK(tags[t].item == layout.item[t]);
  }
  // One micro-batch of the whole batch packs ~500 tokens: enough 128-token blocks for the
  // makespan policy to weigh LPT against zigzag and uniform on two CP ranks.
  REQUIRE(tags.size() >= 256);
  train(R"({"tp": 1})", "makespan-reference");
  const std::string plan = raw_plan(R"({"placement": "homogeneous", "layout": {"cp": 2},
      "micro_batch_size": 8, "schedule": "1f1b", "cp_split": "makespan"})",
                                    "cp2-makespan");
  check_parity(train_with(kScenario, plan, "cp2-makespan"), recorded("makespan-reference"));
}

TEST_CASE("gradient reduction overlapped with the backward, bucket by bucket: the same losses") {
  // The last micro-batch's backward of each chunk runs in pieces (the forward cut between them),
  // each bucket all-reduced in the background as soon as its piece is done.
  train(R"({"tp": 1})", "overlap-reference");
  check_against_one_rank(
      "overlap-reference",
      {// a bucket per layer
       {R"({"dp": 2}, "overlap_grad_reduce": true, "grad_bucket_mb": 0.0001)", "overlap-dp2"},
       // two layers a bucket, the head with the top one
       {R"({"pp": 2, "dp": 2}, "overlap_grad_reduce": true, "grad_bucket_mb": 1)",
        "overlap-pp2dp2"},
       {R"({"pp": 2, "vpp": 2, "dp": 2}, "schedule": "interleaved_1f1b",
               "num_micro_batches": 4, "overlap_grad_reduce": true, "grad_bucket_mb": 0.0001)",
        "overlap-vpp2dp2"},
       {R"({"tp": 2, "dp": 2}, "overlap_grad_reduce": true, "grad_bucket_mb": 0.0001)",
        "overlap-tp2dp2"}});
  // The gradient norm against the plan without overlap, and the trace is the Program.
  check_same_norms(
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "schedule": "1f1b"})",
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "schedule": "1f1b",
          "overlap_grad_reduce": true, "grad_bucket_mb": 0.0001})",
      "overlap-norm");
}

TEST_CASE(
    "distributed optimizer over gradient buckets, parameters gathered during the next forward: "
    "the same losses, grad_norm and resumption") {
  // Each rank steps its slice of every bucket; the buckets are reduce-scattered during the last
  // backward and (overlap_param_gather) all-gathered while the next step's first forward runs.
  train(R"({"tp": 1})", "dopt-reference");
  const std::string both = R"(, "distributed_optimizer": true, "overlap_grad_reduce": true, )";
  check_against_one_rank(
      "dopt-reference",
      {{R"({"dp": 2})" + both + R"("grad_bucket_mb": 0.0001)", "dopt-buckets-dp2"},
       {R"({"dp": 2})" + both + R"("grad_bucket_mb": 0.0001, "overlap_param_gather": true)",
        "dopt-gather-dp2"},
       {R"({"pp": 2, "dp": 2})" + both + R"("grad_bucket_mb": 1, "overlap_param_gather": true)",
        "dopt-gather-pp2dp2"},
       {R"({"pp": 2, "vpp": 2, "dp": 2}, "schedule": "interleaved_1f1b",
               "num_micro_batches": 4)" +
            both + R"("grad_bucket_mb": 0.0001, "overlap_param_gather": true)",
        "dopt-gather-vpp2dp2"},
       {R"({"tp": 2, "dp": 2})" + both +
            R"("grad_bucket_mb": 0.0001, "overlap_param_gather": true)",
        "dopt-gather-tp2dp2"}});
  // grad_norm against the distributed optimizer without buckets, and the trace is the Program.
  const std::string with = check_same_norms(
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "schedule": "1f1b",
          "distributed_optimizer": true})",
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "schedule": "1f1b",
          "distributed_optimizer": true, "overlap_grad_reduce": true, "grad_bucket_mb": 0.0001,
          "overlap_param_gather": true})",
      "dopt-norm");
  // The checkpoint holds the slices: resuming gathers the parameters the last step updated.
  const fs::path straight = fresh_dir("dopt-straight"), resumed = fresh_dir("dopt-resumed");
  REQUIRE(run(kScenario + " --plan " + with + " --steps 4 --out " + straight.string()).code == 0);
  const std::string common = kScenario + " --plan " + with + " --out " + resumed.string();
  REQUIRE(run(common + " --steps 2").code == 0);
  const Run again = run(common + " --steps 4 --resume");
  INFO(again.output);
  REQUIRE(again.code == 0);
  const std::vector<double> x = losses(straight), y = losses(resumed);
  REQUIRE(x.size() == 4);
  REQUIRE(y.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(x[i] == y[i]);  // bit for bit
}

TEST_CASE("each rank holds the parameter state the Program's memory accounting says") {
  // The executor keeps fp32 weights, fp32 gradients of the trainable ones and AdamW's two fp32
  // moments of what its optimizer steps; the Program counts weights in the model's dtype,
  // gradients in fp32 and 12 bytes of optimizer state per stepped parameter, each rank's share
  // as Megatron splits a module over TP (norms, row-parallel biases and patch embeddings whole
  // on every rank). The two agree to the byte.
  const std::string plans = std::string(TESSERA_SOURCE_DIR) + "/scenarios/plans/";
  // An MoE LLM whose layers are dense, dense, MoE, dense (the experts on stage 1 only), with
  // multi-head latent attention (its down-projections whole on every TP rank) and a router bias.
  const std::string pattern = edited_scenario(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json",
      [](Json& s) {
        Json& t = s["model"]["modules"][2]["transformer"];
        t["dense_layers"] = 1;
        t["moe_every"] = 2;
        deepseek_v3_shape(t);
      },
      "state-moe-pattern-scenario");
  for (const auto& [scenario, layout, name] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {kScenario, R"({"tp": 1})", "state-single"},
           {three_head_vit(), R"({"tp": 2}, "indivisible_heads": "pad")", "state-padded-heads"},
           {three_head_vit(), R"({"tp": 2}, "indivisible_heads": "replicate")",
            "state-replicated-heads"},
           {kScenario, R"({"pp": 2})", "state-pp2"},
           {kScenario, R"({"dp": 2}, "distributed_optimizer": true)", "state-dopt"},
           {kScenario, R"({"tp": 2})", "state-tp2"},
           {kScenario, "cpu-tiny-tp2-pp2.json", "state-tp2-pp2"},
           {kScenario, "cpu-tiny-colocated.json", "state-colocated"},
           {kScenario, "cpu-tiny-non-colocated.json", "state-non-colocated"},
           {pattern, R"({"pp": 2, "dp": 2, "ep": 2, "stage_layers": [2, 2]})", "state-moe-pattern"},
           {pattern, R"({"tp": 2, "pp": 2})", "state-moe-latent-tp2"}}) {
    const std::string plan =
        layout.starts_with("{") ? plan_file(layout) : plans + layout;  // a layout, or a file
    INFO(name);
    const fs::path out = fresh_dir(name);
    const Run r = run(scenario + " --plan " + plan + " --steps 1 --out " + out.string());
    INFO(r.output);
    REQUIRE(r.code == 0);
    Diagnostics diag;
    const auto s = load_scenario_with_plan(scenario, plan, diag);
    REQUIRE(s.has_value());
    const exec::TrainBatch batch = exec::make_batch(*s, exec::DatasetKind::kSynthetic, 0);
    const Lowered lowered = lower(s->model, s->cluster,
                                  resolve_stage_split(*s->plan, s->model, s->workload, s->cluster),
                                  s->workload, batch.batch);
    REQUIRE(lowered.error.empty());
    const Json ran = Json::parse(std::ifstream(out / "run.json"));
    const double dtype = static_cast<double>(dtype_bytes(s->model.dtype));
    for (const Json& m : ran.at("memory_per_rank")) {
      const auto rank = m.at("rank").get<std::size_t>();
      INFO("rank " << rank);
      const RankMemory& p = lowered.program.memory.at(rank);
      const double weights = p.weight_bytes / dtype, trained = p.gradient_bytes / 4,
                   stepped = p.optimizer_bytes / 12;
      const double held = m.at("parameter_state_bytes").get<double>();
      CHECK(held == 4 * weights + 4 * trained + 8 * stepped);
    }
  }
}

TEST_CASE("padding to the longest sample: the executor's sequence holds the pads lower() counts") {
  Diagnostics diag;
  const auto s = load_scenario(kScenario, diag);
  REQUIRE(s.has_value());
  const exec::TrainBatch batch = exec::make_batch(*s, exec::DatasetKind::kSynthetic, 0);
  const ModuleSpec& llm = *find_llm(s->model);
  const std::vector<int32_t> four{0, 1, 2, 3};
  std::vector<const Sample*> pointers;
  int64_t longest = 0;
  for (int32_t i : four) {
    const Sample& sample = batch.batch.samples[static_cast<std::size_t>(i)];
    pointers.push_back(&sample);
    const Sample* one[] = {&sample};
    longest = std::max(longest, module_work(s->model, llm, one, s->workload.max_seq_len).tokens);
  }
  const exec::LlmLayout packed = exec::llm_layout(s->model, batch, four, s->workload.max_seq_len);
  const exec::LlmLayout padded =
      exec::llm_layout(s->model, batch, four, s->workload.max_seq_len, true);
  REQUIRE(padded.tokens > packed.tokens);  // the samples differ in length
  CHECK(padded.tokens == 4 * longest);
  CHECK(padded.tokens ==
        module_work(s->model, llm, pointers, s->workload.max_seq_len, true).tokens);
  CHECK((padded.targets >= 0).sum().item<int64_t>() == (packed.targets >= 0).sum().item<int64_t>());
  // The pads change no loss: micro-batches of four, padded, on two pipeline stages and on two
  // data-parallel replicas.
  train(R"({"tp": 1})", "padding-reference");
  const Trained reference = recorded("padding-reference");
  for (const auto& [layout, name] : std::vector<std::pair<std::string, std::string>>{
           {R"({"pp": 2})", "pad-pp2"}, {R"({"dp": 2})", "pad-dp2"}}) {
    const std::string plan = raw_plan(R"({"placement": "homogeneous", "layout": )" + layout +
                                          R"(, "micro_batch_size": 4, "num_micro_batches": )" +
                                          (name == "pad-pp2" ? "2" : "1") +
                                          R"(, "schedule": "1f1b", "pad_to_longest": true})",
                                      name);
    check_parity(train_with(kScenario, plan, name), reference);
  }
}

TEST_CASE(
    "schedule dip: encoder segments on every stage, media in sub-micro-batches; losses agree") {
  // The variable tiny VLM (0-4 images per sample): the ViT cut over the LLM's stages, each
  // micro-batch's images in pieces that travel from the ViT's last stage to the LLM's first and
  // (for the trainable projector, and for a trainable ViT) their gradients back.
  Diagnostics diag;
  auto s =
      load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json", diag);
  REQUIRE(s.has_value());
  const std::string frozen_vit =
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json";
  for (ModuleSpec& m : s->model.modules) m.frozen = false;
  const fs::path dir = fresh_dir("dip");
  fs::create_directories(dir);
  const std::string trainable = (dir / "dip-trainable.json").string();
  std::ofstream(trainable) << inline_scenario_json(*s).dump();
  const std::string pp4 = raw_plan(R"({"placement": "homogeneous", "layout": {"pp": 4, "vpp": 2},
      "micro_batch_size": 2, "schedule": "dip"})",
                                   "dip-pp4");
  const std::string pp2v2 = raw_plan(R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2},
      "micro_batch_size": 2, "schedule": "dip", "microbatching": "entrain"})",
                                     "dip-pp2v2");
  // Without pieces beyond the first, this would test nothing new: some micro-batch of these
  // iterations has its images in two or more sub-micro-batches (with Entrain's micro-batches;
  // PP4 cuts each micro-batch's images in one piece here).
  CHECK(std::max(most_sub_microbatch(trainable, pp4, "", 3),
                 most_sub_microbatch(trainable, pp2v2, "", 3)) >= 1);
  const std::string single = raw_plan(R"({"placement": "homogeneous", "layout": {"tp": 1},
      "micro_batch_size": 2, "schedule": "1f1b"})",
                                      "dip-reference");
  check_parity(train_with(frozen_vit, pp4, "dip-frozen-pp4"),
               train_with(frozen_vit, single, "dip-frozen-ref"));
  check_parity(train_with(trainable, pp2v2, "dip-trainable-pp2v2"),
               train_with(trainable, single, "dip-trainable-ref"));
  // run.json says how each step's schedule came about.
  std::ifstream in(fs::temp_directory_path() /
                   ("tessera-train-test-" + std::to_string(::getpid())) / "dip-frozen-pp4" /
                   "run.json");
  const Json run = Json::parse(in);
  CHECK(run.at("dip_search").at("steps") == 3);
  CHECK(run.at("iterations").at(0).at("dip").at("searched") == false);  // the start schedule
  CHECK(run.at("iterations").at(2).contains("dip"));
}

TEST_CASE(
    "overlapped and fully sharded data parallelism in colocated and DIP plans: losses agree") {
  // The variable tiny VLM with its ViT trained: the ViT's gradients are reduced bucket by bucket
  // during its own backward, the LLM's during each chunk's last backward; a bucket reduced twice
  // or not at all would show in the gradient norm. 0.1 MB buckets: one or two layers each.
  const std::string trainable = edited_scenario(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json",
      [](Json& s) {
        for (Json& m : s["model"]["modules"]) m["frozen"] = false;
      },
      "overlap-trainable");
  const std::string colocated = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}},
          "overlap_grad_reduce": true, "distributed_optimizer": true, "grad_bucket_mb": 0.1,
          "overlap_param_gather": true})",
      "overlap-colocated");
  const std::string dip = raw_plan(
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "micro_batch_size": 2,
          "schedule": "dip", "overlap_grad_reduce": true, "grad_bucket_mb": 0.1})",
      "overlap-dip");
  const std::string dip_gather = raw_plan(
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "micro_batch_size": 2,
          "schedule": "dip", "overlap_grad_reduce": true, "grad_bucket_mb": 0.1,
          "distributed_optimizer": true, "overlap_param_gather": true})",
      "overlap-dip-gather");
  // Fully sharded, colocated: each unit gathered for every use, the ViT's for its one forward
  // and one backward of the whole batch.
  const std::string colocated_fsdp = raw_plan(
      R"({"placement": "colocated", "schedule": "three_phase", "micro_batch_size": 1,
          "modules": {"vision": {"dp": 4}, "llm": {"pp": 2, "dp": 2}},
          "distributed_optimizer": true, "fully_sharded": true, "grad_bucket_mb": 0.1})",
      "fsdp-colocated");
  // Three steps: a parameter gathered at the wrong time would train on stale weights.
  check_plans_agree(trainable, "overlap-trainable-1",
                    {{colocated, "overlap-colocated-run"},
                     {dip, "overlap-dip-run"},
                     {dip_gather, "overlap-dip-gather-run"},
                     {colocated_fsdp, "fsdp-colocated-run"}});
  // A frozen ViT is sharded too: gathered for its forward, with nothing to reduce.
  check_plans_agree(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json",
                    "fsdp-frozen-1", {{colocated_fsdp, "fsdp-colocated-frozen-run"}});
  // Images rare: the replicas order their steps apart (seed 8: one stage's replicas end their
  // backward with different modules; seed 1: one replica has no image at all), yet every replica
  // of a stage takes its buckets' collectives in one order, or Gloo would mismatch them; and a
  // replica without images still holds the ViT and takes part in its reduction (without the
  // overlap too: it used to skip it, and the other replica waited for ever).
  const std::string dip_plain = raw_plan(
      R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 2}, "micro_batch_size": 2,
          "schedule": "dip"})",
      "overlap-dip-plain");
  // cpu-tiny-variable with images rare (one sample in 13 has one), drawn from `seed`.
  const auto rare_images = [](int seed, bool trained, const std::string& name) {
    return edited_scenario(
        std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json",
        [&](Json& s) {
          if (trained)
            for (Json& m : s["model"]["modules"]) m["frozen"] = false;
          s["workload"]["seed"] = seed;
          Json values = Json::array();
          for (int i = 0; i < 12; ++i) values.push_back(0);
          values.push_back(1);
          s["workload"]["samples"]["image"]["count"] = Json{{"dist", "choice"}, {"values", values}};
        },
        name);
  };
  for (const int seed : {1, 8})
    check_plans_agree(rare_images(seed, true, "overlap-sparse-" + std::to_string(seed)),
                      "overlap-sparse-1-" + std::to_string(seed),
                      {{dip_gather, "overlap-sparse-dip-" + std::to_string(seed)},
                       {dip_plain, "overlap-sparse-plain-" + std::to_string(seed)}});
  // The ViT frozen, seed 1: the replica without images in the first batch has some later, and
  // builds the ViT then (its weights the initial ones, as everywhere).
  check_plans_agree(rare_images(1, false, "frozen-sparse"), "frozen-sparse-1",
                    {{dip_plain, "frozen-sparse-plain"}}, 4);
  // The collectives run where the Program puts them: bucket by bucket for both modules, the
  // reductions inside the backward and (overlap_param_gather) the gathers before the forwards.
  for (const auto& [plan, name, gathers] :
       {std::tuple{colocated, std::string("overlap-colocated-run"), true},
        std::tuple{dip, std::string("overlap-dip-run"), false},
        std::tuple{dip_gather, std::string("overlap-dip-gather-run"), true}}) {
    CAPTURE(name);
    check_trace_is_program(out_dir(name), trainable, plan);
    for (const std::string module : {"vision", "llm"}) {
      CAPTURE(module);
      const auto buckets = [&](const std::string& kind) {
        return rank0_events(name, [&](const std::string& n) {
          return n.starts_with("gloo:dp:") && n.find(kind) != std::string::npos &&
                 n.find(":" + module + ".s0.L") != std::string::npos;
        });
      };
      CHECK(buckets("reduce") > 0);
      CHECK((buckets("allgather") > 0) == gathers);
    }
  }
}

TEST_CASE("messages in the order their receivers take them: plans agree with tags ignored") {
  // TESSERA_P2P_IN_ORDER=1 sends every message with one tag, so that Gloo matches a pair's
  // messages in order, as NCCL does. The placements whose Programs send some pair's messages in
  // another order than the receiver takes them (DIP's pieces, the non-colocated and colocated
  // boundaries) must still reach one rank's losses: SendOrder holds a message back until the
  // ones taken before it have gone.
  const std::string variable =
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json";
  const std::string dip = raw_plan(R"({"placement": "homogeneous", "layout": {"pp": 4, "vpp": 2},
      "micro_batch_size": 2, "schedule": "dip"})",
                                   "in-order-dip");
  const std::string single = raw_plan(R"({"placement": "homogeneous", "layout": {"tp": 1},
      "micro_batch_size": 2, "schedule": "1f1b"})",
                                      "in-order-dip-reference");
  const std::string plans = std::string(TESSERA_SOURCE_DIR) + "/scenarios/plans/";
  const Trained variable_reference = train_with(variable, single, "in-order-ref-var");
  train(R"({"tp": 1})", "in-order-ref-tiny");
  const Trained tiny_reference = recorded("in-order-ref-tiny");
  ::setenv("TESSERA_P2P_IN_ORDER", "1", 1);
  check_parity(train_with(variable, dip, "in-order-dip"), variable_reference);
  double reordered = 0;
  for (const std::string name : {"cpu-tiny-non-colocated", "cpu-tiny-colocated"}) {
    check_parity(train_with(kScenario, plans + name + ".json", "in-order-" + name), tiny_reference);
    reordered += Json::parse(std::ifstream(out_dir("in-order-" + name) / "run.json"))
                     .at("p2p_messages_reordered")
                     .get<double>();
  }
  reordered += Json::parse(std::ifstream(out_dir("in-order-dip") / "run.json"))
                   .at("p2p_messages_reordered")
                   .get<double>();
  ::unsetenv("TESSERA_P2P_IN_ORDER");
  MESSAGE(reordered << " messages held back for their receivers' order");
  CHECK(reordered > 0);  // otherwise this tested nothing
}

TEST_CASE("--profile-step records one step's operators with torch's profiler (torch 2 builds)") {
  const fs::path out = fresh_dir("profile-step");
  const Run r = run(kScenario + " --plan " + plan_file(R"({"dp": 2})") +
                    " --steps 2 --profile-step 1 --no-checkpoint --out " + out.string());
  INFO(r.output);
#if TORCH_VERSION_MAJOR >= 2
  REQUIRE(r.code == 0);
  for (const std::string rank : {"rank0.json", "rank1.json"}) {
    std::ifstream in(out / "profile" / rank);
    REQUIRE(in.good());
    const Json trace = Json::parse(in);
    // Operators of the step: its matrix products among them.
    const std::string text = trace.dump();
    CHECK(trace.contains("traceEvents"));
    CHECK(text.find("aten::mm") != std::string::npos);
  }
#else
  CHECK(r.code == 2);
  CHECK(r.output.find("--profile-step needs --out and a torch 2 build") != std::string::npos);
#endif
}

// The SimGrid simulator against the in-order evaluator, contention, infeasible plans, traces.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <unistd.h>

#include "shared/cost/evaluator.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/stage_split.hpp"
#include "sim/child_process.hpp"
#include "sim/periodic.hpp"
#include "sim/simulation_report.hpp"
#include "sim/simulator.hpp"
#include "sim/timeline_codec.hpp"
#include "sim/twins.hpp"

using namespace tessera;
using namespace tessera::sim;
namespace fs = std::filesystem;

namespace {

const std::string kSource = TESSERA_SOURCE_DIR;

// A scenario of the library (scenarios/NAME.json), read and validated.
std::optional<Scenario> library_scenario(const std::string& name) {
  Diagnostics diag;
  std::optional<Scenario> s = load_scenario(kSource + "/scenarios/" + name + ".json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return s;
}

const char* kVlm = R"({"name": "vlm", "modules": [
  {"name": "vision", "role": "encoder", "modality": "image",
   "transformer": {"layers": 4, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm"},
   "patching": {"patch_size": 8, "resize": "fixed", "image_size": 64}},
  {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 128, "out": 256}},
  {"name": "llm", "role": "llm", "inputs": ["proj"],
   "transformer": {"layers": 8, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 688, "gated_ffn": true, "vocab": 1000}}]})";
const char* kValm = R"({"name": "valm", "modules": [
  {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
   "transformer": {"layers": 4, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm"},
   "patching": {"patch_size": 8, "resize": "fixed", "image_size": 64}},
  {"name": "vproj", "role": "projector", "inputs": ["vision"], "projector": {"in": 128, "out": 256}},
  {"name": "audio", "role": "encoder", "modality": "audio",
   "transformer": {"layers": 2, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm", "positions": 100},
   "audio": {"mel_bins": 16, "max_seconds": 2}},
  {"name": "aproj", "role": "projector", "inputs": ["audio"], "projector": {"in": 128, "out": 256}},
  {"name": "llm", "role": "llm", "inputs": ["vproj", "aproj"],
   "transformer": {"layers": 8, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1000}}]})";
const char* kWorkload = R"({"global_batch": 16, "max_seq_len": 1024, "seed": 5, "samples": {
  "text_tokens": {"dist": "uniform", "min": 32, "max": 300},
  "image": {"count": {"dist": "choice", "values": [0, 1, 2]}, "width": 64, "height": 64},
  "audio": {"count": {"dist": "choice", "values": [0, 1]}, "seconds": 1.5}}})";

ClusterSpec cluster(int64_t nodes, int64_t per_node, double nic = 5e10,
                    double oversubscription = 1) {
  Diagnostics diag;
  const std::string text = R"({"name": "c", "nodes": )" + std::to_string(nodes) +
                           R"(, "devices_per_node": )" + std::to_string(per_node) + R"(,
    "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 2e12},
    "intra_node": {"bandwidth_bytes_per_s": 2e11, "latency_s": 2e-6},
    "inter_node": {"bandwidth_bytes_per_s": )" +
                           std::to_string(nic) + R"(, "latency_s": 5e-6, "oversubscription": )" +
                           std::to_string(oversubscription) + "}}";
  ClusterSpec c = read_cluster(Json::parse(text), "", "", diag);
  REQUIRE(diag.ok());
  return c;
}

CostModel cost_for(const ClusterSpec& c, const ModelSpec* model = nullptr) {
  return CostModel(c, DType::kBf16, default_cost_params(c),
                   model != nullptr ? *model : ModelSpec{});
}

Timeline simulated(const Program& p, const CostModel& cost, bool contention) {
  const ChildResult child = run_in_child(
      [&] { return serialize_timeline(run_program(p, cost, RunOptions{contention})); }, 120);
  INFO(child.error);
  REQUIRE(child.ok);
  Timeline t = deserialize_timeline(child.output, p);
  INFO(t.error);
  REQUIRE(t.error.empty());
  return t;
}

// A program where the ranks of each listed group all-reduce `bytes` once, at time 0.
Program allreduces(int32_t world, const std::vector<RankList>& groups, double bytes) {
  Program p;
  p.world = world;
  p.modules = {"m"};
  p.ranks.resize(static_cast<std::size_t>(world));
  p.memory.resize(static_cast<std::size_t>(world));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    p.groups.push_back(groups[g]);
    for (int64_t r : groups[g]) {
      Op op;
      op.kind = OpKind::kCollective;
      op.stream = StreamKind::kCollective;
      op.collective = CollectiveKind::kAllReduce;
      op.purpose = Purpose::kDp;
      op.group = static_cast<int32_t>(g);
      op.message_bytes = bytes;
      p.ranks[static_cast<std::size_t>(r)].push_back(op);
    }
  }
  return p;
}

}  // namespace

TEST_CASE(
    "without contention the simulation equals the in-order evaluator, op by op, for every "
    "placement") {
  const std::vector<std::pair<const char*, const char*>> plans = {
      {kVlm,
       R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}, "sequence_parallel": true})"},
      {kVlm,
       R"({"placement": "homogeneous", "schedule": "gpipe", "layout": {"pp": 4, "cp": 2}, "recompute": "full"})"},
      {kVlm,
       R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"pp": 2, "vpp": 2, "dp": 2, "tp": 2}, "num_micro_batches": 8})"},
      {kVlm,
       R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"pp": 2, "vpp": 2, "dp": 2, "tp": 2}, "num_micro_batches": 8, "distributed_optimizer": true, "overlap_grad_reduce": true, "overlap_param_gather": true, "grad_bucket_mb": 1})"},
      {kVlm,
       R"({"placement": "homogeneous", "schedule": "interleaved_1f1b", "layout": {"pp": 2, "vpp": 2, "dp": 2, "tp": 2}, "num_micro_batches": 8, "distributed_optimizer": true, "fully_sharded": true, "recompute": "full", "grad_bucket_mb": 1})"},
      {kVlm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 4}, "llm": {"tp": 2, "dp": 2}}, "distributed_optimizer": true, "fully_sharded": true})"},
      {kVlm,
       R"({"placement": "colocated", "schedule": "three_phase", "modules": {"vision": {"dp": 8}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})"},
      {kVlm,
       R"({"placement": "colocated", "modules": {"vision": {"tp": 2, "dp": 4}, "llm": {"tp": 2, "dp": 4}}, "distributed_optimizer": true})"},
      {kVlm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 4}, "llm": {"tp": 2, "pp": 2, "dp": 1}}})"},
      {kVlm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2, "pp": 2}, "llm": {"tp": 2, "cp": 2, "dp": 1}}})"},
      {kValm,
       R"({"placement": "non_colocated", "schedule": "graph_1f1b", "modules": {"vision": {"dp": 2}, "audio": {"dp": 2}, "llm": {"tp": 2, "pp": 2, "dp": 1}}})"},
      {kValm,
       R"({"placement": "colocated", "modules": {"vision": {"dp": 8}, "audio": {"dp": 4, "tp": 2}, "llm": {"tp": 2, "pp": 2, "dp": 2}}})"},
  };
  for (const auto& [model_text, plan_text] : plans) {
    INFO(std::string(plan_text));
    Diagnostics diag;
    const ModelSpec model = read_model(Json::parse(model_text), "", "", diag);
    Json workload_json = Json::parse(kWorkload);
    if (model_text == kVlm) workload_json["samples"].erase("audio");
    const WorkloadSpec workload = read_workload(workload_json, "", "", ".", diag);
    const ParallelPlan plan = read_plan(Json::parse(plan_text), "", "", diag);
    const ClusterSpec c = cluster(2, 4);
    validate_plan(plan, model, workload, c, "", "", diag);
    REQUIRE(diag.ok());
    const Lowered l = lower(model, c, resolve_stage_split(plan, model, workload, c), workload,
                            draw_batch(workload, 1));
    REQUIRE(l.error.empty());
    // Compute beside collectives as it is (this device: none) and slowed (overlap_slowdown.hpp).
    for (const double factor : {1.0, 1.5}) {
      INFO("overlap_slowdown " << factor);
      CostParams params = default_cost_params(c);
      params.overlap_slowdown = factor;
      const CostModel cost(c, DType::kBf16, params, model);
      const Timeline expected = evaluate(l.program, cost);
      REQUIRE(expected.error.empty());
      const Timeline got = simulated(l.program, cost, false);
      CHECK(got.step_s == doctest::Approx(expected.step_s).epsilon(1e-6));
      int mismatches = 0;
      for (std::size_t r = 0; r < expected.ops.size(); ++r)
        for (std::size_t i = 0; i < expected.ops[r].size(); ++i) {
          const double tolerance = 1e-6 * expected.step_s;
          if (std::fabs(got.ops[r][i].start_s - expected.ops[r][i].start_s) > tolerance ||
              std::fabs(got.ops[r][i].finish_s - expected.ops[r][i].finish_s) > tolerance) {
            if (mismatches++ < 3)
              MESSAGE(op_name(l.program, l.program.ranks[r][i])
                      << " on rank " << r << ": simulated [" << got.ops[r][i].start_s << ", "
                      << got.ops[r][i].finish_s << "], evaluated [" << expected.ops[r][i].start_s
                      << ", " << expected.ops[r][i].finish_s << "]");
          }
        }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("contention: two DP groups through the same node uplink take longer than one") {
  // Two nodes of two devices; oversubscription 2 leaves each node one NIC's worth of uplink.
  const ClusterSpec c = cluster(2, 2, 5e10, 2);
  const CostModel cost = cost_for(c);
  const double bytes = 1e9;
  const Program one = allreduces(4, {{0, 2}}, bytes);
  const Program two = allreduces(4, {{0, 2}, {1, 3}}, bytes);
  const double t1 = simulated(one, cost, true).step_s;
  const double t2 = simulated(two, cost, true).step_s;
  // A lone all-reduce of 2 ranks: α-steps + 2(n-1)/n·S/B = 2·5e-6 + 1e9 / (5e10·0.85).
  CHECK(t1 == doctest::Approx(2 * 5e-6 + bytes / (5e10 * 0.85)).epsilon(1e-6));
  CHECK(t2 > 1.8 * t1);
  // Without contention the two groups do not see each other.
  CHECK(simulated(two, cost, false).step_s == doctest::Approx(simulated(one, cost, false).step_s));
}

TEST_CASE(
    "contention: doubling NIC bandwidth shortens an inter-node-bound plan, not an NVLink-bound "
    "one") {
  const double bytes = 1e9;
  const Program across = allreduces(4, {{0, 2}}, bytes);  // crosses nodes
  const Program inside = allreduces(4, {{0, 1}}, bytes);  // stays on NVLink
  const CostModel slow = cost_for(cluster(2, 2, 5e10));
  const CostModel fast = cost_for(cluster(2, 2, 10e10));
  const double across_slow = simulated(across, slow, true).step_s,
               across_fast = simulated(across, fast, true).step_s;
  const double inside_slow = simulated(inside, slow, true).step_s,
               inside_fast = simulated(inside, fast, true).step_s;
  CHECK(across_fast < 0.55 * across_slow);
  CHECK(inside_fast == doctest::Approx(inside_slow).epsilon(1e-9));
}

namespace {

// The VLM without audio, TP2 x PP2 x DP2 on 8 ranks: TP pairs are twins.
struct TwinCase {
  ModelSpec model;
  WorkloadSpec workload;
  ParallelPlan plan;
};
TwinCase twin_case() {
  Diagnostics diag;
  TwinCase c;
  c.model = read_model(Json::parse(kVlm), "", "", diag);
  Json workload_json = Json::parse(kWorkload);
  workload_json["samples"].erase("audio");
  c.workload = read_workload(workload_json, "", "", ".", diag);
  c.plan = read_plan(
      Json::parse(R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}})"), "", "",
      diag);
  REQUIRE(diag.ok());
  return c;
}

}  // namespace

TEST_CASE("twins: TP shards collapse, data-parallel replicas with different data do not") {
  const auto [model, workload, plan] = twin_case();
  const Lowered l =
      lower(model, cluster(2, 4), resolve_stage_split(plan, model, workload, cluster(2, 4)),
            workload, draw_batch(workload, 0));
  const Twins t = find_twins(l.program);
  CHECK(t.classes == 4);  // 8 ranks, TP pairs
  for (int32_t r = 0; r < 8; ++r) CHECK(t.leader[static_cast<std::size_t>(r)] == r - r % 2);
}

TEST_CASE("twins' flows left to their leader's give the same times, and only where exact") {
  // TP2 x DP2 x PP2 on two nodes of four: the pipeline's sends cross nodes, DP rings stay inside.
  const auto [model, workload, plan] = twin_case();
  auto run = [&](const ClusterSpec& c, bool nested_flows, bool fold) {
    const Program p = lower(model, c, resolve_stage_split(plan, model, workload, c), workload,
                            draw_batch(workload, 0))
                          .program;
    const CostModel cost = cost_for(c, &model);
    const ChildResult child = run_in_child(
        [&] {
          return serialize_timeline(run_program(p, cost, RunOptions{true, nested_flows, fold}));
        },
        120);
    REQUIRE(child.ok);
    Timeline t = deserialize_timeline(child.output, p);
    REQUIRE(t.error.empty());
    return t;
  };
  // A slow NIC makes the inter-node sends and their contention matter.
  const ClusterSpec slow = cluster(2, 4, 2e9);
  const Timeline folded = run(slow, false, true);
  const Timeline full = run(slow, false, false);
  CHECK(folded.folded_flows > 0);
  CHECK(full.folded_flows == 0);
  CHECK(folded.activities < full.activities);
  REQUIRE(folded.ops.size() == full.ops.size());
  for (std::size_t r = 0; r < full.ops.size(); ++r)
    for (std::size_t i = 0; i < full.ops[r].size(); ++i) {
      INFO("rank " << r << " op " << i);
      CHECK(folded.ops[r][i].start_s == doctest::Approx(full.ops[r][i].start_s).epsilon(1e-12));
      CHECK(folded.ops[r][i].finish_s == doctest::Approx(full.ops[r][i].finish_s).epsilon(1e-12));
    }
  // Not exact, so not done: TP rings among the twins themselves, or an oversubscribed uplink
  // that the twins' flows share.
  CHECK(run(slow, true, true).folded_flows == 0);
  CHECK(run(cluster(2, 4, 2e9, 2), false, true).folded_flows == 0);
}

TEST_CASE("a program that cannot finish ends the simulation with the stuck ops named") {
  // Each rank waits to receive before it sends: neither message ever leaves.
  Program p;
  p.world = 2;
  p.modules = {"m"};
  p.ranks.resize(2);
  p.memory.resize(2);
  for (int32_t r = 0; r < 2; ++r) {
    Op recv;
    recv.kind = OpKind::kRecv;
    recv.stream = StreamKind::kP2p;
    recv.peer = 1 - r;
    recv.tag = 1 - r;
    recv.message_bytes = 1e6;
    Op send = recv;
    send.kind = OpKind::kSend;
    send.tag = r;
    send.deps = {0};
    p.ranks[static_cast<std::size_t>(r)] = {recv, send};
  }
  for (bool contention : {true, false}) {
    const CostModel cost = cost_for(cluster(1, 2));
    const ChildResult child = run_in_child(
        [&] { return serialize_timeline(run_program(p, cost, RunOptions{contention})); }, 60);
    REQUIRE(child.ok);
    const Timeline t = deserialize_timeline(child.output, p);
    CHECK(t.error.find("cannot finish") != std::string::npos);
  }
}

TEST_CASE("tessera simulate: infeasible plans are reported, not simulated") {
  const auto s = library_scenario("qwen2-vl-7b-video");
  SimulateOptions options;
  options.iterations = 1;
  const SimulationResult r = simulate(*s, *s->plan, options);
  CHECK_FALSE(r.feasible);
  CHECK(r.reason.rfind("infeasible: rank", 0) == 0);
  CHECK(r.iterations.empty());
}

TEST_CASE("traces: one valid Chrome-trace JSON per rank, slices nest per thread, flows pair up") {
  const auto s = library_scenario("cpu-tiny");
  const fs::path dir = fs::temp_directory_path() / ("tessera-trace-" + std::to_string(::getpid()));
  SimulateOptions options;
  options.iterations = 2;
  options.trace_dir = dir.string();
  const SimulationResult r = simulate(*s, *s->plan, options);
  REQUIRE(r.feasible);
  CHECK(r.trace_error.empty());
  std::map<int64_t, int> flows;  // id -> starts minus finishes
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("rank" + std::to_string(rank) + ".json"));
    REQUIRE(in.good());
    std::stringstream text;
    text << in.rdbuf();
    const Json doc = Json::parse(text.str());
    CHECK(doc["distributedInfo"]["rank"] == rank);
    std::map<int, std::vector<std::pair<double, double>>> slices;  // tid -> (ts, end)
    int steps = 0;
    for (const Json& e : doc["traceEvents"]) {
      if (e["ph"] == "X") {
        slices[e["tid"].get<int>()].emplace_back(e["ts"].get<double>(),
                                                 e["ts"].get<double>() + e["dur"].get<double>());
        if (e["name"].get<std::string>().rfind("ProfilerStep#", 0) == 0) ++steps;
      }
      if (e["ph"] == "s") ++flows[e["id"].get<int64_t>()];
      if (e["ph"] == "f") --flows[e["id"].get<int64_t>()];
    }
    CHECK(steps == 2);
    for (auto& [tid, list] : slices) {
      std::sort(list.begin(), list.end(), [](auto a, auto b) {
        return a.first != b.first ? a.first < b.first : a.second > b.second;
      });
      std::vector<double> open;  // ends of enclosing slices
      for (const auto& [start, end] : list) {
        while (!open.empty() && open.back() <= start + 1e-6) open.pop_back();
        if (!open.empty()) CHECK(end <= open.back() + 1e-6);  // nested, never overlapping
        open.push_back(end);
      }
    }
  }
  for (const auto& [id, balance] : flows) CHECK(balance == 0);
  CHECK(!flows.empty());
  fs::remove_all(dir);
}

TEST_CASE("golden simulator outputs for small scenarios with fixed seeds") {
  // A change of any prediction shows here; regenerate with scripts/golden.sh when intended.
  const bool update = std::getenv("TESSERA_UPDATE_GOLDEN") != nullptr;
  for (const char* name : {"cpu-tiny", "qwen2-audio-7b", "llava-1.5-13b-captioning", "default"}) {
    INFO(name);
    const auto s = library_scenario(name);
    SimulateOptions options;
    options.iterations = 2;
    const SimulationResult r = simulate(*s, *s->plan, options);
    REQUIRE(r.feasible);
    Json got = Json::array();
    for (const SimulatedIteration& it : r.iterations)
      got.push_back({{"iteration", it.iteration},
                     {"step_s", it.metrics.step_s},
                     {"samples_per_s", it.metrics.samples_per_s},
                     {"tokens_per_s", it.metrics.tokens_per_s},
                     {"tflops_per_device", it.metrics.tflops_per_device},
                     {"mfu", it.metrics.mfu}});
    const std::string file = kSource + "/tests/data/golden/" + name + ".json";
    if (update) {
      std::ofstream(file) << Json{{"scenario", name}, {"iterations", got}}.dump(1) << "\n";
      continue;
    }
    Diagnostics read;
    const auto expected = read_json_file(file, read);
    REQUIRE(expected.has_value());
    REQUIRE((*expected)["iterations"].size() == got.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      for (const char* key :
           {"step_s", "samples_per_s", "tokens_per_s", "tflops_per_device", "mfu"}) {
        INFO("iteration " << i << " " << key);
        CHECK(got[i][key].get<double>() ==
              doctest::Approx((*expected)["iterations"][i][key].get<double>()).epsilon(1e-9));
      }
  }
}

TEST_CASE("--nested timed equals ring flows when nothing else shares the NVLink links") {
  // The default plan's TP groups sit inside a node and only their own collectives use those
  // links while they run, so timing them instead of flowing them changes nothing.
  const auto s = library_scenario("default");
  SimulateOptions options;
  options.iterations = 1;
  options.nested = NestedMode::kFlows;
  const SimulationResult flows = simulate(*s, *s->plan, options);
  options.nested = NestedMode::kTimed;
  const SimulationResult timed = simulate(*s, *s->plan, options);
  REQUIRE(flows.feasible);
  REQUIRE(timed.feasible);
  // The run itself finds them alone, so --nested auto keeps them timed.
  CHECK(timed.iterations[0].nested_check == SimulatedIteration::NestedCheck::kAlone);
  options.nested = NestedMode::kAuto;
  const SimulationResult automatic = simulate(*s, *s->plan, options);
  CHECK_FALSE(automatic.iterations[0].nested_flows);
  CHECK(automatic.iterations[0].metrics.step_s == timed.iterations[0].metrics.step_s);
  // Within 1e-3: flows carry each collective's NCCL-curve time at their ring's slowest link and
  // agree to about 1e-4 (an open difference; with α–β links they agreed to 1e-9).
  CHECK(timed.iterations[0].metrics.step_s ==
        doctest::Approx(flows.iterations[0].metrics.step_s).epsilon(1e-3));
  CHECK(timed.iterations[0].activities < flows.iterations[0].activities / 2);
}

TEST_CASE("tessera simulate says how far contention moved it from the estimate") {
  const auto s = library_scenario("default");
  SimulateOptions options;
  options.iterations = 1;
  options.contention = false;
  const SimulationResult alone = simulate(*s, *s->plan, options);
  REQUIRE(alone.feasible);
  const SimulatedIteration& a = alone.iterations.front();
  CHECK(a.estimate_step_s == doctest::Approx(a.metrics.step_s).epsilon(1e-12));
  CHECK(format_simulation(alone, *s).find("against the estimate: equal") != std::string::npos);
  // With contention the data-parallel all-reduces of the eight replicas share node uplinks.
  options.contention = true;
  const SimulationResult shared = simulate(*s, *s->plan, options);
  REQUIRE(shared.feasible);
  const SimulatedIteration& b = shared.iterations.front();
  CHECK(b.estimate_step_s == doctest::Approx(a.estimate_step_s).epsilon(1e-12));
  CHECK(b.metrics.step_s > b.estimate_step_s);
  const std::string text = format_simulation(shared, *s);
  INFO(text);
  CHECK(text.find("against the estimate: +") != std::string::npos);
  CHECK(simulation_to_json(shared)["iterations"][0]["estimate_step_s"].get<double>() ==
        b.estimate_step_s);
}

TEST_CASE("on an oversubscribed fabric the simulation ranks two plans the other way round") {
  // The estimate prices every cross-node transfer at its uplink's full-load share (a quarter of
  // the NIC here); the simulation shares an uplink only among the transfers that meet on it. The
  // 16-way data-parallel plan looks faster to the estimate, the 4-stage pipeline with 8 replicas
  // (less DP traffic per node) is faster simulated.
  const auto s = library_scenario("default-oversubscribed");
  Diagnostics diag;
  const ParallelPlan wide = read_plan(
      Json::parse(
          R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "vpp": 2, "dp": 16}, "micro_batch_size": 2, "schedule": "interleaved_1f1b", "stage_split": "uniform", "sequence_parallel": true, "distributed_optimizer": true})"),
      "", "", diag);
  const ParallelPlan deep = read_plan(
      Json::parse(
          R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 4, "vpp": 2, "dp": 8}, "micro_batch_size": 2, "schedule": "interleaved_1f1b", "stage_split": "frozen_aware", "sequence_parallel": true, "distributed_optimizer": true})"),
      "", "", diag);
  REQUIRE(diag.ok());
  SimulateOptions options;
  options.iterations = 1;
  const SimulationResult a = simulate(*s, wide, options), b = simulate(*s, deep, options);
  REQUIRE(a.feasible);
  REQUIRE(b.feasible);
  const SimulatedIteration &x = a.iterations.front(), &y = b.iterations.front();
  INFO("wide: estimate " << x.estimate_step_s << " s, simulated " << x.metrics.step_s << " s");
  INFO("deep: estimate " << y.estimate_step_s << " s, simulated " << y.metrics.step_s << " s");
  CHECK(x.estimate_step_s < y.estimate_step_s);
  CHECK(x.metrics.step_s > y.metrics.step_s);
  CHECK(format_simulation(b, *s).find("against the estimate: -") != std::string::npos);
}

namespace {

const char* kSmallGpt = R"({"name": "gpt", "modules": [
  {"name": "llm", "role": "llm", "transformer": {"layers": 8, "hidden": 256, "heads": 8, "ffn": 1024, "vocab": 1000}}]})";

// One SimGrid simulation of `p`, with contention, in a child process of its own; `fold_flows`
// off: every flow runs, none stood for by another.
Timeline simulate_in_child(const Program& p, const CostModel& cost, bool nested_flows,
                           bool fold_flows = true) {
  const ChildResult child = run_in_child(
      [&] {
        return serialize_timeline(run_program(p, cost, RunOptions{true, nested_flows, fold_flows}));
      },
      120);
  REQUIRE(child.ok);
  Timeline t = deserialize_timeline(child.output, p);
  REQUIRE(t.error.empty());
  return t;
}

// Simulates `plan_text` for a small GPT on fixed-length text, folded (flows left out where
// others stand for them) and not (every flow run), and checks that every rank's ops (its
// representative's, folded) take the same times to 1e-12. Returns the flows left out.
int64_t check_folded_simulation(const std::string& plan_text, const ClusterSpec& c,
                                bool nested_flows) {
  INFO(plan_text << (nested_flows ? ", nested flows" : ", nested timed") << ", " << c.nodes
                 << " nodes of " << c.devices_per_node << ", oversubscription "
                 << c.inter_node.oversubscription);
  Diagnostics diag;
  const ModelSpec gpt = read_model(Json::parse(kSmallGpt), "", "", diag);
  const WorkloadSpec fixed = read_workload(
      Json::parse(R"({"global_batch": 16, "max_seq_len": 512, "samples": {"text_tokens": 256}})"),
      "", "", ".", diag);
  ParallelPlan plan = read_plan(Json::parse(plan_text), "", "", diag);
  validate_plan(plan, gpt, fixed, c, "", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  plan = resolve_stage_split(plan, gpt, fixed, c);
  const Batch batch = draw_batch(fixed, 0);
  const Program full = lower(gpt, c, plan, fixed, batch).program;
  const Program folded =
      lower(gpt, c, plan, fixed, batch, nullptr, RankFolding::kIdentical).program;
  const CostModel cost = cost_for(c, &gpt);
  const Timeline a = simulate_in_child(full, cost, nested_flows, false);
  const Timeline b = simulate_in_child(folded, cost, nested_flows);
  CHECK(a.folded_flows == 0);
  CHECK(b.step_s == doctest::Approx(a.step_s).epsilon(1e-12));
  CHECK(b.actors <= a.actors);
  int64_t mismatched = 0;
  for (int64_t r = 0; r < full.world; ++r) {
    const auto by = static_cast<std::size_t>(representative(folded, r));
    const auto& mine = a.ops[static_cast<std::size_t>(r)];
    REQUIRE(mine.size() == b.ops[by].size());
    for (std::size_t i = 0; i < mine.size(); ++i)
      mismatched += !(b.ops[by][i].start_s == doctest::Approx(mine[i].start_s).epsilon(1e-12) &&
                      b.ops[by][i].finish_s == doctest::Approx(mine[i].finish_s).epsilon(1e-12));
  }
  CHECK(mismatched == 0);
  return b.folded_flows;
}

}  // namespace

TEST_CASE("a folded Program simulates to the full Program's times, op by op, contention and all") {
  // Fixed-length text: TP shards and DP replicas fold. Each member's transfers still run as
  // flows, so links shared between classes (an oversubscribed uplink, DP rings across nodes)
  // carry what they would.
  check_folded_simulation(
      R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2}, "sequence_parallel": true})",
      cluster(2, 4, 2e9), true);
  check_folded_simulation(
      R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 4}, "overlap_grad_reduce": true, "grad_bucket_mb": 0.5})",
      cluster(2, 4, 2e9, 2), false);
  // Every TP x PP x DP layout of 8 devices, interleaved where pipelined, on a non-blocking and
  // a 2:1 oversubscribed fabric of nodes of 4 and of 2; with TP, nested collectives as flows
  // (TP rings join the shards' flows) and, on the non-blocking fabric, timed (each TP shard's
  // pipeline and gradient rings form a lane of their own, the representative's stands for it).
  int64_t lanes_left_out = 0;
  for (const ClusterSpec& c : {cluster(2, 4, 2e9), cluster(2, 4, 2e9, 2), cluster(4, 2, 2e9, 2)})
    for (int tp : {1, 2, 4})
      for (int pp : {1, 2, 4})
        for (int dp : {1, 2, 4, 8}) {
          if (tp * pp * dp != 8) continue;
          Json plan = {{"placement", "homogeneous"},
                       {"layout", {{"tp", tp}, {"pp", pp}, {"dp", dp}, {"vpp", pp > 1 ? 2 : 1}}}};
          if (pp > 1) plan["schedule"] = "interleaved_1f1b";
          const int64_t left_out = check_folded_simulation(plan.dump(), c, tp > 1);
          if (tp > 1) CHECK(left_out == 0);
          if (c.inter_node.oversubscription > 1) CHECK(left_out == 0);
          if (tp > 1 && c.inter_node.oversubscription == 1)
            lanes_left_out += check_folded_simulation(plan.dump(), c, false);
        }
  CHECK(lanes_left_out > 0);
}

namespace {

// A fixed-length GPT plan simulated in full and through a short run extended by its period:
// every op's start and finish agree. Returns the extension (its failure names a mismatch).
PeriodicExtension check_periodic_simulation(const std::string& plan_text, const ClusterSpec& c,
                                            int64_t global_batch, bool perturb = false) {
  INFO(plan_text << ", " << c.nodes << " nodes of " << c.devices_per_node << ", oversubscription "
                 << c.inter_node.oversubscription);
  Diagnostics diag;
  Scenario s;
  s.model = read_model(Json::parse(kSmallGpt), "", "", diag);
  s.workload = read_workload(Json{{"global_batch", global_batch},
                                  {"max_seq_len", 512},
                                  {"samples", {{"text_tokens", 256}}}},
                             "", "", ".", diag);
  s.cluster = c;
  ParallelPlan plan = read_plan(Json::parse(plan_text), "", "", diag);
  validate_plan(plan, s.model, s.workload, c, "", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  plan = resolve_stage_split(plan, s.model, s.workload, c);
  const Batch batch = draw_batch(s.workload, 0);
  const Program full =
      lower(s.model, c, plan, s.workload, batch, nullptr, RankFolding::kIdentical).program;
  const std::optional<PeriodicShortening> how = periodic_shortening(s, plan, batch, full);
  REQUIRE(how.has_value());
  const Lowered shortened =
      lower(s.model, c, how->plan, how->workload, how->batch, nullptr, RankFolding::kIdentical);
  REQUIRE(shortened.error.empty());
  const CostModel cost = cost_for(c, &s.model);
  auto run = [&](const Program& p) { return simulate_in_child(p, cost, false); };
  Timeline short_run = run(shortened.program);
  if (perturb)  // the middle forwards of rank 0 later and later: no period repeats
    for (std::size_t i = 0; i < shortened.program.ranks[0].size(); ++i) {
      const Op& op = shortened.program.ranks[0][i];
      if (op.kind == OpKind::kCompute && op.phase == Phase::kF &&
          op.microbatch >= how->microbatches / 4 && op.microbatch < 3 * how->microbatches / 4)
        short_run.ops[0][i].finish_s += 1e-7 * op.microbatch;
    }
  PeriodicExtension extended = extend_periodic(full, shortened.program, short_run, *how);
  if (!extended.failure.empty()) return extended;
  const Timeline whole = run(full);
  CHECK(extended.timeline.step_s == doctest::Approx(whole.step_s).epsilon(1e-12));
  const double tolerance = 1e-9 * whole.step_s;
  int64_t mismatched = 0;
  for (std::size_t r = 0; r < full.ranks.size(); ++r) {
    REQUIRE(extended.timeline.ops[r].size() == whole.ops[r].size());
    for (std::size_t i = 0; i < whole.ops[r].size(); ++i)
      mismatched +=
          std::fabs(extended.timeline.ops[r][i].start_s - whole.ops[r][i].start_s) > tolerance ||
          std::fabs(extended.timeline.ops[r][i].finish_s - whole.ops[r][i].finish_s) > tolerance;
  }
  CHECK(mismatched == 0);
  CHECK(extended.timeline.compute_busy_s[0] ==
        doctest::Approx(whole.compute_busy_s[0]).epsilon(1e-9));
  return extended;
}

}  // namespace

TEST_CASE("a short run's repeating steady phase stands for the full batch, op by op") {
  const auto ok = [](const PeriodicExtension& e) {
    INFO(e.failure);
    CHECK(e.failure.empty());
    CHECK(e.period_s > 0);
  };
  // 1F1B (a period of one micro-batch) and interleaved 1F1B (one of `pp`), TP and DP folded, on
  // a non-blocking and a 2:1 oversubscribed fabric whose uplinks the pipeline's and the
  // replicas' transfers share.
  for (const ClusterSpec& c : {cluster(2, 4, 2e9), cluster(4, 2, 2e9, 2)}) {
    ok(check_periodic_simulation(
        R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 4}, "sequence_parallel": true})",
        c, 64));
    if (c.nodes == 2)
      ok(check_periodic_simulation(
          R"({"placement": "homogeneous", "layout": {"pp": 4, "dp": 2}, "recompute": "full"})", c,
          128));
    ok(check_periodic_simulation(
        R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 2, "vpp": 2}, "schedule": "interleaved_1f1b"})",
        c, 64));
    // Buckets reduced during the last backward, parameters gathered during the first forward.
    ok(check_periodic_simulation(
        R"({"placement": "homogeneous", "layout": {"pp": 2, "dp": 4}, "distributed_optimizer": true, "overlap_grad_reduce": true, "overlap_param_gather": true, "grad_bucket_mb": 0.5})",
        c, 192));
  }
  // Each stage on a node of its own behind a 2:1 uplink: the replicas' pipeline transfers meet
  // there, and the steady phase still drifts after 28 micro-batches (by 0.2% a period): refused.
  const PeriodicExtension drifting = check_periodic_simulation(
      R"({"placement": "homogeneous", "layout": {"pp": 4, "dp": 2}, "recompute": "full"})",
      cluster(4, 2, 2e9, 2), 128);
  CHECK(drifting.failure.find("does not repeat") != std::string::npos);
  // A steady phase that does not repeat is refused, naming the op.
  const PeriodicExtension late =
      check_periodic_simulation(R"({"placement": "homogeneous", "layout": {"pp": 4, "dp": 2}})",
                                cluster(2, 4, 2e9), 128, true);
  CHECK(late.failure.find("does not repeat 4 micro-batches later") != std::string::npos);
}

TEST_CASE("simulate folds the periodic steady phase of fixed-length data, and only that") {
  Diagnostics diag;
  Scenario s;
  s.name = "periodic";
  s.model = read_model(Json::parse(kSmallGpt), "", "", diag);
  s.workload = read_workload(
      Json::parse(R"({"global_batch": 64, "max_seq_len": 512, "samples": {"text_tokens": 256}})"),
      "", "", ".", diag);
  s.cluster = cluster(2, 4, 2e9, 2);
  ParallelPlan plan = read_plan(
      Json::parse(R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 4}})"), "", "", diag);
  REQUIRE(diag.ok());
  plan = resolve_stage_split(plan, s.model, s.workload, s.cluster);
  SimulateOptions options;
  options.iterations = 1;
  const SimulationResult folded = simulate(s, plan, options);
  options.periodic = false;
  const SimulationResult whole = simulate(s, plan, options);
  REQUIRE(folded.feasible);
  REQUIRE(whole.feasible);
  CHECK(folded.iterations[0].simulated_microbatches == 28);
  CHECK(folded.iterations[0].microbatches == 64);
  CHECK(whole.iterations[0].simulated_microbatches == 0);
  CHECK(folded.iterations[0].activities < whole.iterations[0].activities);
  CHECK(folded.step_mean_s == doctest::Approx(whole.step_mean_s).epsilon(1e-12));
  CHECK(folded.iterations[0].metrics.bubble_mean ==
        doctest::Approx(whole.iterations[0].metrics.bubble_mean).epsilon(1e-9));
  CHECK(format_simulation(folded, s).find("28 of 64 micro-batches per pipeline simulated") !=
        std::string::npos);
  // Samples of different lengths: every micro-batch simulated.
  s.workload = read_workload(
      Json::parse(
          R"({"global_batch": 64, "max_seq_len": 512, "samples": {"text_tokens": {"dist": "uniform", "min": 64, "max": 256}}})"),
      "", "", ".", diag);
  REQUIRE(diag.ok());
  options.periodic = true;
  const SimulationResult variable = simulate(s, plan, options);
  REQUIRE(variable.feasible);
  CHECK(variable.iterations[0].simulated_microbatches == 0);
  CHECK(variable.iterations[0].periodic_failure.empty());
}

TEST_CASE("--nested auto runs ring flows where timed nested collectives met other transfers") {
  // One node, TP 2 x DP 2, gradients reduced bucket by bucket during the backward: the DP rings
  // cross NVLink while the TP all-reduces of the next buckets' backward run on the same links.
  Diagnostics diag;
  Scenario s;
  s.name = "nvlink-shared";
  s.model = read_model(Json::parse(R"({"name": "gpt", "modules": [
    {"name": "llm", "role": "llm", "transformer": {"layers": 8, "hidden": 1024, "heads": 8, "ffn": 4096, "vocab": 1000}}]})"),
                       "", "", diag);
  s.workload = read_workload(
      Json::parse(R"({"global_batch": 8, "max_seq_len": 1024, "samples": {"text_tokens": 1024}})"),
      "", "", ".", diag);
  s.cluster = cluster(1, 4, 5e10);
  s.cluster.intra_node.bandwidth_bytes_per_s = 2e10;  // slow enough for the rings to overlap
  ParallelPlan plan = read_plan(
      Json::parse(
          R"({"placement": "homogeneous", "layout": {"tp": 2, "dp": 2}, "overlap_grad_reduce": true, "grad_bucket_mb": 4})"),
      "", "", diag);
  REQUIRE(diag.ok());
  plan = resolve_stage_split(plan, s.model, s.workload, s.cluster);
  SimulateOptions options;
  options.iterations = 1;
  options.nested = NestedMode::kTimed;
  const SimulationResult timed = simulate(s, plan, options);
  options.nested = NestedMode::kFlows;
  const SimulationResult flows = simulate(s, plan, options);
  options.nested = NestedMode::kAuto;
  const SimulationResult automatic = simulate(s, plan, options);
  REQUIRE(timed.feasible);
  REQUIRE(flows.feasible);
  REQUIRE(automatic.feasible);
  CHECK(timed.iterations[0].nested_check == SimulatedIteration::NestedCheck::kShared);
  CHECK_FALSE(timed.iterations[0].nested_flows);
  CHECK(automatic.iterations[0].nested_check == SimulatedIteration::NestedCheck::kShared);
  CHECK(automatic.iterations[0].nested_flows);
  CHECK(automatic.iterations[0].metrics.step_s == flows.iterations[0].metrics.step_s);
  // And here it matters: the timed run missed the rings' share of the links.
  CHECK(timed.iterations[0].metrics.step_s < flows.iterations[0].metrics.step_s);
  const std::string text = format_simulation(automatic, s);
  CHECK(text.find("nested collectives: ring flows in 1 of 1 iterations") != std::string::npos);
}

// The kernel-level GPU cost model: GEMM waves, NCCL curves and rails, device files, derived
// clusters and the published block of scenarios.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "shared/cost/collective_cost.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/cost/kernel_cost.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

const std::string kSource = TESSERA_SOURCE_DIR;

ClusterSpec load(const std::string& name) {
  Diagnostics diag;
  const auto c = load_cluster(kSource + "/scenarios/clusters/" + name, diag);
  INFO(diag.format());
  REQUIRE(c.has_value());
  return *c;
}

// A published row of scenarios/published/, by name.
std::optional<Scenario> published(const std::string& row) {
  Diagnostics diag;
  auto s = load_scenario(kSource + "/scenarios/published/" + row + ".json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return s;
}

// The Program of iteration 0 of `s` under `plan`, its stage split resolved.
Program lowered_program(const Scenario& s, const ParallelPlan& plan) {
  const Lowered lowered =
      lower(s.model, s.cluster, resolve_stage_split(plan, s.model, s.workload, s.cluster),
            s.workload, draw_batch(s.workload, 0));
  REQUIRE(lowered.error.empty());
  return lowered.program;
}

// The forward of one layer of module 0: `tokens` on this rank, matrices split over `tp`.
Op forward_layer(int64_t tokens, int16_t tp, double attention_pairs, double flops) {
  Op op;
  op.module = 0;
  op.phase = Phase::kF;
  op.layers = 1;
  op.tokens = tokens;
  op.tp = tp;
  op.attention_pairs = attention_pairs;
  op.flops = flops;
  return op;
}

}  // namespace

TEST_CASE("gemm: a wave with one tile more than the SMs costs a second wave") {
  const ClusterSpec c = load("dgx-h100-8.json");
  REQUIRE(c.device.kernels.has_value());
  const GemmKernels& g = c.device.kernels->gemm;
  const double peak = peak_flops(c, DType::kBf16);
  REQUIRE(g.sms == 132);
  const double k = 8192;  // compute-bound: the memory roofline stays below
  const double m = static_cast<double>(g.tile_m) * 12, n = static_cast<double>(g.tile_n) * 11;
  // 12 x 11 = 132 tiles: one full wave.
  const double full = gemm_s(c.device, peak, m, n, k, 2);
  CHECK(full == doctest::Approx(2 * m * n * k / (peak * g.efficiency)));
  // One column more: 12 x 12 tiles, a second wave.
  CHECK(gemm_s(c.device, peak, m, n + 1, k, 2) == doctest::Approx(2 * full));
  // A skinny GEMM is bound by its bytes.
  const double skinny = gemm_s(c.device, peak, 1e6, 8, 8, 2);
  CHECK(skinny == doctest::Approx(2 * (1e6 * 8 + 64 + 8e6) /
                                  (c.device.memory_bandwidth_bytes_per_s *
                                   c.device.kernels->memory_efficiency)));
}

TEST_CASE("gemm: routed experts as one grouped kernel; few rows per expert read whole weights") {
  const ClusterSpec c = load("dgx-h100-8.json");
  const GemmKernels& g = c.device.kernels->gemm;
  const double peak = peak_flops(c, DType::kBf16);
  const double n = 2048, k = 4096;
  // 16 experts of 1,024 rows each (compute-bound): the tiles of one GEMM of 16,384 rows.
  CHECK(gemm_s(c.device, peak, 1024, n, k, 2, 1.0, 16) ==
        doctest::Approx(gemm_s(c.device, peak, 16 * 1024, n, k, 2)));
  // 16 experts of 32 rows: each expert's weights are read whole for a few rows; bound by bytes.
  const double bytes = 16 * 2 * (32 * k + k * n + 32 * n);
  CHECK(gemm_s(c.device, peak, 32, n, k, 2, 1.0, 16) ==
        doctest::Approx(
            bytes / (c.device.memory_bandwidth_bytes_per_s * c.device.kernels->memory_efficiency)));
  CHECK(gemm_s(c.device, peak, 32, n, k, 2, 1.0, 16) >
        3 * 2 * 16 * 32 * n * k / (peak * g.efficiency));
}

TEST_CASE("kernel cost: a mixture of experts' MLP priced per expert; EP deals it more rows") {
  Diagnostics diag;
  const ClusterSpec c = load("dgx-h100-8.json");
  const ModelSpec model = read_model(Json::parse(R"({"name": "moe", "modules": [
      {"name": "llm", "role": "llm", "transformer": {"layers": 1, "hidden": 2048, "heads": 16,
       "ffn": 8192, "vocab": 1000, "experts": 64, "top_k": 2, "moe_ffn": 1024, "gated_ffn": true}}]})"),
                                     "m", "", diag);
  REQUIRE(diag.ok());
  const ModuleSpec& llm = model.modules[0];
  const double peak = peak_flops(c, DType::kBf16);
  const KernelTuning tuning;
  // The MLP's FLOPs only (no attention): the rate is what the expert GEMMs reach.
  const auto mlp_s = [&](int64_t tokens, int16_t ep) {
    Op op = forward_layer(tokens, 1, 0, 2.0 * 3 * 2048 * 1024 * 2 * static_cast<double>(tokens));
    op.ep = ep;
    return kernel_compute_s(llm, op, c.device, peak, 2, tuning) / static_cast<double>(tokens);
  };
  // 2,048 tokens over 64 experts: 64 rows each, every expert's weights read for a quarter of a
  // tile; with EP 8 each of the rank's 8 experts gets 512 rows from the group: cheaper per token.
  CHECK(mlp_s(2048, 1) > 1.3 * mlp_s(2048, 8));
  // Enough tokens that every expert fills its tiles: EP changes little.
  CHECK(mlp_s(262144, 1) == doctest::Approx(mlp_s(262144, 8)).epsilon(0.05));
}

TEST_CASE("nccl: the measured curve, its latency floor, rails across nodes") {
  const ClusterSpec one = load("dgx-h100-8.json");
  const BusBandwidthCurve& ar = one.intra_node_collectives.all_reduce;
  REQUIRE(ar.size() >= 2);
  CHECK(curve_bus_bandwidth(ar, ar[1].first) == doctest::Approx(ar[1].second));
  CHECK(curve_bus_bandwidth(ar, 1e12) == doctest::Approx(ar.back().second));
  // Half-way in log-size between two points, half-way in bandwidth.
  const double mid = std::sqrt(ar[1].first * ar[2].first);
  CHECK(curve_bus_bandwidth(ar, mid) == doctest::Approx((ar[1].second + ar[2].second) / 2));
  // Below the first point a collective takes the first point's time.
  const GroupSpan node{1, 8};
  CHECK(nccl_collective_s(one, CollectiveKind::kAllReduce, 8, node, ar[0].first / 16, 0.96) ==
        doctest::Approx(
            nccl_collective_s(one, CollectiveKind::kAllReduce, 8, node, ar[0].first, 0.96)));
  // Across two nodes, eight members a node use eight NICs; one a node uses one.
  const ClusterSpec two = load("dgx-h100-64.json");
  const double bytes = 4e9;
  const double wide = nccl_collective_s(two, CollectiveKind::kAllGather, 16, {2, 8}, bytes, 0.96);
  const double narrow = nccl_collective_s(two, CollectiveKind::kAllGather, 2, {2, 1}, bytes, 0.96);
  CHECK(narrow / (bytes / 2) == doctest::Approx(8 * wide / (bytes * 15 / 16)).epsilon(0.01));
  // An all-to-all is no ring: across 8 nodes of 8, each node's NICs carry 7/8 of its eight
  // members' data, 8 x 50 GB/s at NCCL's all-to-all rate, after its fixed cost a call.
  const ClusterSpec eight = load("dgx-h100-64.json");
  REQUIRE(eight.inter_node.all_to_all_efficiency == 0.81);
  REQUIRE(eight.inter_node.all_to_all_latency_s == 77e-6);
  REQUIRE(eight.inter_node.deepep_efficiency == 0.87);
  const double a2a = nccl_collective_s(eight, CollectiveKind::kAllToAll, 64, {8, 8}, bytes, 0.96);
  CHECK(a2a == doctest::Approx(8 * bytes * 56 / 64 / (8 * 50e9 * 0.81) + 77e-6));
  // Many times slower than an all-gather of the same bytes, whose ring hops mostly stay on NVLink.
  CHECK(a2a > 5 * nccl_collective_s(eight, CollectiveKind::kAllGather, 64, {8, 8}, bytes, 0.96));
  // DeepEP's kernels move it at their own rate after the link's latency.
  CHECK(nccl_collective_s(eight, CollectiveKind::kAllToAll, 64, {8, 8}, bytes, 0.96,
                          Transport::kDeepEp) ==
        doctest::Approx(8 * bytes * 56 / 64 / (8 * 50e9 * 0.87) + eight.inter_node.link.latency_s));
  // HybridEP's at theirs for the nodes the group spans: measured over 2, 4 and 8 nodes,
  // interpolated in log2(nodes) between them, held flat beyond.
  REQUIRE(eight.inter_node.hybridep_efficiency ==
          std::vector<std::pair<double, double>>{{2, 0.72}, {4, 0.83}, {8, 0.89}});
  const auto hybridep = [&](int64_t nodes) {
    return all_to_all_rate(eight.inter_node, Transport::kHybridEp, 0.96, 5e-6, nodes);
  };
  CHECK(hybridep(2).efficiency == 0.72);
  CHECK(hybridep(3).efficiency == doctest::Approx(0.72 + 0.11 * std::log2(1.5)));
  CHECK(hybridep(8).efficiency == 0.89);
  CHECK(hybridep(64).efficiency == 0.89);
  CHECK(hybridep(1).efficiency == 0.72);
  CHECK(hybridep(4).latency_s == 5e-6);
  CHECK(nccl_collective_s(eight, CollectiveKind::kAllToAll, 64, {8, 8}, bytes, 0.96,
                          Transport::kHybridEp) ==
        doctest::Approx(8 * bytes * 56 / 64 / (8 * 50e9 * 0.89) + eight.inter_node.link.latency_s));
  CHECK(nccl_collective_s(eight, CollectiveKind::kAllToAll, 16, {2, 8}, bytes, 0.96,
                          Transport::kHybridEp) ==
        doctest::Approx(8 * bytes * 8 / 16 / (8 * 50e9 * 0.72) + eight.inter_node.link.latency_s));
  // On a cluster that measures neither, both move at the rings' rate.
  ClusterSpec unmeasured = eight;
  unmeasured.inter_node.all_to_all_efficiency = 0;
  unmeasured.inter_node.all_to_all_latency_s = 0;
  unmeasured.inter_node.deepep_efficiency = 0;
  unmeasured.inter_node.hybridep_efficiency.clear();
  for (Transport t : {Transport::kDeepEp, Transport::kHybridEp})
    CHECK(
        nccl_collective_s(unmeasured, CollectiveKind::kAllToAll, 64, {8, 8}, bytes, 0.96, t) ==
        doctest::Approx(8 * bytes * 56 / 64 / (8 * 50e9 * 0.96) + eight.inter_node.link.latency_s));
  // HybridEP without rates of its own moves at DeepEP's.
  ClusterSpec deepep_only = eight;
  deepep_only.inter_node.hybridep_efficiency.clear();
  CHECK(all_to_all_rate(deepep_only.inter_node, Transport::kHybridEp, 0.96, 5e-6, 2).efficiency ==
        0.87);
  CHECK(nccl_collective_s(unmeasured, CollectiveKind::kAllToAll, 64, {8, 8}, bytes, 0.96) ==
        doctest::Approx(8 * bytes * 56 / 64 / (8 * 50e9 * 0.96) + eight.inter_node.link.latency_s));
  // A small all-to-all costs its fixed 77 us; inside one node none of it applies.
  CHECK(nccl_collective_s(eight, CollectiveKind::kAllToAll, 64, {8, 8}, 1024, 0.96) ==
        doctest::Approx(77e-6).epsilon(0.01));
  CHECK(nccl_collective_s(eight, CollectiveKind::kAllToAll, 8, {1, 8}, bytes, 0.96) ==
        doctest::Approx(
            nccl_collective_s(unmeasured, CollectiveKind::kAllToAll, 8, {1, 8}, bytes, 0.96)));
  // One member a node: its own NIC carries everything but its own share.
  CHECK(nccl_collective_s(two, CollectiveKind::kAllToAll, 2, {2, 1}, bytes, 0.96) ==
        doctest::Approx(bytes / 2 / (50e9 * 0.81) + 77e-6));
  // The group's span is read from its ranks.
  const GroupSpan span = group_span(two, {0, 1, 8, 9, 10});
  CHECK(span.nodes == 2);
  CHECK(span.per_node == 3);
}

TEST_CASE("all-to-all across nodes: the Hopper clusters' rate against published NCCL times") {
  // NCCL all-to-alls across nodes of 8 Hopper GPUs with a 400 Gb/s NIC each, as published:
  // pplx-kernels' README, its torch all_to_all_single baseline (a padded buffer of 256 experts
  // x 1 or 128 tokens x 7,392 bytes: hidden 7,168 in FP8 with a 4-byte scale per 128) at EP 16
  // to 128; NVIDIA/nccl issue 1531, nccl-tests alltoall_perf at 8 MiB on 64 H800 (out of place).
  struct Published {
    int64_t ep;
    double bytes;
    double seconds;
  };
  const double padded = 256.0 * 7392;
  const std::vector<Published> runs = {
      {128, 128 * padded, 4972.0e-6}, {64, 128 * padded, 5418.1e-6}, {32, 128 * padded, 4225.9e-6},
      {16, 128 * padded, 3213.9e-6},  {128, padded, 132.0e-6},       {64, padded, 101.6e-6},
      {32, padded, 95.7e-6},          {16, padded, 109.7e-6},        {64, 8388608, 337.8e-6}};
  const ClusterSpec c = load("dgx-h100-1024.json");
  double log_error = 0;
  for (const Published& run : runs) {
    const double predicted =
        nccl_collective_s(c, CollectiveKind::kAllToAll, run.ep, {run.ep / 8, 8}, run.bytes, 0.96);
    INFO("EP " << run.ep << ", " << run.bytes << " bytes");
    CHECK(predicted / run.seconds > 0.75);
    CHECK(predicted / run.seconds < 1.25);
    log_error += std::abs(std::log(predicted / run.seconds));
  }
  // Within 13% of each in the geometric mean; the rings' rate and the link's latency alone
  // miss the small ones by more than half.
  CHECK(std::exp(log_error / static_cast<double>(runs.size())) < 1.13);
  ClusterSpec rings = c;
  rings.inter_node.all_to_all_efficiency = 0;
  rings.inter_node.all_to_all_latency_s = 0;
  for (const Published& run : runs)
    if (run.bytes == padded)
      CHECK(nccl_collective_s(rings, CollectiveKind::kAllToAll, run.ep, {run.ep / 8, 8}, run.bytes,
                              0.96) < 0.5 * run.seconds);
}

TEST_CASE("all-to-all across nodes on links without curves: NCCL's rate and DeepEP's") {
  ClusterSpec c = load("dgx-h100-64.json");
  c.intra_node_collectives = {};  // α–β links
  Diagnostics diag;
  const auto model = load_model(kSource + "/scenarios/models/cornstarch-vlm-small.json", diag);
  INFO(diag.format());
  REQUIRE(model.has_value());
  const CostParams params = default_cost_params(c);
  const CostModel cost(c, model->dtype, params, *model);
  const RankList group = {0, 8};  // one member on each of two nodes
  const double bytes = 1e9;
  // Half the bytes cross: at 0.81 of the NIC after 77 us, or DeepEP's 0.87 after the link's
  // latency; unmeasured, DeepEP's at the cost model's bandwidth efficiency.
  CHECK(cost.collective_s(CollectiveKind::kAllToAll, group, bytes) ==
        doctest::Approx(77e-6 + bytes / 2 / (50e9 * 0.81)));
  CHECK(cost.collective_s(CollectiveKind::kAllToAll, group, bytes, Transport::kDeepEp) ==
        doctest::Approx(c.inter_node.link.latency_s + bytes / 2 / (50e9 * 0.87)));
  c.inter_node.deepep_efficiency = 0;
  const CostModel unmeasured(c, model->dtype, params, *model);
  CHECK(unmeasured.collective_s(CollectiveKind::kAllToAll, group, bytes, Transport::kDeepEp) ==
        doctest::Approx(c.inter_node.link.latency_s +
                        bytes / 2 / (50e9 * params.bandwidth_efficiency)));
}

TEST_CASE("clusters: a device file, a base merged over, bad curves named") {
  Diagnostics diag;
  const auto s = load_scenario(kSource + "/scenarios/published/bloom-176b-a100-384.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  CHECK(s->cluster.nodes == 48);
  CHECK(s->cluster.inter_node.nics_per_node == 4);
  CHECK(s->cluster.device.name == "A100-SXM4-80GB");
  REQUIRE(s->cluster.device.kernels.has_value());
  CHECK(s->cluster.device.kernels->gemm.sms == 108);
  REQUIRE(s->published.has_value());
  CHECK(s->published->step_s == doctest::Approx(104.70));
  CHECK_FALSE(s->published->holdout);
  // What the reader writes reads back the same.
  Diagnostics again;
  const ClusterSpec round = read_cluster(to_json(s->cluster), "", "", again);
  CHECK(again.ok());
  CHECK(round == s->cluster);

  // NCCL's all-to-all rate reads back too.
  const ClusterSpec dgx = load("dgx-h100-8.json");
  Diagnostics dgx_again;
  CHECK(read_cluster(to_json(dgx), "", "", dgx_again) == dgx);
  CHECK(dgx_again.ok());

  Json bad = to_json(dgx);
  bad["intra_node"]["bus_bandwidth"]["allreduce"] = Json::parse("[[2048, 1e9], [1024, 2e9]]");
  bad["inter_node"]["all_to_all_efficiency"] = 1.5;
  bad["inter_node"]["all_to_all_latency_s"] = -1;
  bad["inter_node"]["deepep_efficiency"] = 0;
  bad["inter_node"]["hybridep_efficiency"] = Json::parse("[[2, 0.7], [2, 0.8]]");
  Diagnostics d;
  read_cluster(bad, "c.json", "", d);
  CHECK(d.format().find("c.json: intra_node.bus_bandwidth.allreduce: [1]: sizes must increase") !=
        std::string::npos);
  CHECK(d.format().find("c.json: inter_node.all_to_all_efficiency: must be in (0, 1], got 1.5") !=
        std::string::npos);
  CHECK(d.format().find("c.json: inter_node.all_to_all_latency_s:") != std::string::npos);
  CHECK(d.format().find("c.json: inter_node.deepep_efficiency: must be in (0, 1], got 0") !=
        std::string::npos);
  CHECK(d.format().find("c.json: inter_node.hybridep_efficiency: [1]: node counts must increase") !=
        std::string::npos);
  Json over = to_json(dgx);
  over["inter_node"]["hybridep_efficiency"] = Json::parse("[[2, 1.2]]");
  Diagnostics o;
  read_cluster(over, "c.json", "", o);
  CHECK(o.format().find("c.json: inter_node.hybridep_efficiency: [0]: expected [nodes >= 1, "
                        "efficiency in (0, 1]]") != std::string::npos);
  Json missing = Json::parse(R"({"base": "nowhere.json", "nodes": 2})");
  Diagnostics m;
  read_cluster(missing, "dir/c.json", "cluster", m);
  CHECK(m.format().find("dir/c.json: cluster.base: file not found: 'nowhere.json'") !=
        std::string::npos);
}

TEST_CASE("kernel cost: sequence parallelism and flash attention make a layer cheaper") {
  Diagnostics diag;
  const auto s = load_scenario(kSource + "/scenarios/published/korthikanti-22b-full.json", diag);
  REQUIRE(s.has_value());
  const ModuleSpec& llm = s->model.modules[0];
  const double peak = peak_flops(s->cluster, DType::kBf16);
  const Op op = forward_layer(8192, 8, 4 * 2048.0 * 2049 / 2, 1e12);
  const KernelTuning tuning;
  const double plain = kernel_compute_s(llm, op, s->cluster.device, peak, 2, tuning);
  Op sp = op;
  sp.flags = kOpSequenceParallel;
  CHECK(kernel_compute_s(llm, sp, s->cluster.device, peak, 2, tuning) < plain);
  Op unfused = op;
  unfused.flags = kOpUnfusedAttention;
  CHECK(kernel_compute_s(llm, unfused, s->cluster.device, peak, 2, tuning) > plain);
  KernelTuning slower = tuning;
  slower.efficiency = 0.5;
  CHECK(kernel_compute_s(llm, op, s->cluster.device, peak, 2, slower) > 1.5 * plain);
}

TEST_CASE("kernel cost: eager element-wise kernels cost more; a device's training scale slows it") {
  Diagnostics diag;
  const auto s =
      load_scenario(kSource + "/scenarios/published/nvidia-llama3.1-8b-h100-8.json", diag);
  REQUIRE(s.has_value());
  const ModuleSpec& llm = s->model.modules[0];
  REQUIRE(llm.transformer.has_value());
  const double peak = peak_flops(s->cluster, DType::kBf16);
  // One Llama-3.1-8B layer's matrices.
  const Op op = forward_layer(4096, 1, 4096.0 * 4097 / 2, 2.0 * 218e6 * 4096);
  const KernelTuning tuning;
  const double fused = kernel_compute_s(llm, op, s->cluster.device, peak, 2, tuning);
  Op eager = op;
  eager.flags = kOpEagerElementwise;
  const double unfused = kernel_compute_s(llm, eager, s->cluster.device, peak, 2, tuning);
  // Norms in fp32 chains, rotary in five kernels, the gated activation apart: ~0.8 MB more per
  // token and layer at h = 4096 (2 x 36 x 4096 + 10 x 2 x 5120 + ...), a few percent of the GEMMs.
  CHECK(unfused > fused * 1.03);
  CHECK(unfused < fused * 1.5);
  // The device's training scale divides the GEMM and attention rates.
  DeviceSpec slower = s->cluster.device;
  slower.kernels->training_scale = 0.5;
  CHECK(kernel_compute_s(llm, op, slower, peak, 2, tuning) > 1.6 * fused);
  // Read from the device file, bounded.
  Json kernels = to_json(*s->cluster.device.kernels);
  kernels["training_scale"] = 3;
  Diagnostics bad;
  read_device_kernels(kernels, "d.json", "kernels", bad);
  CHECK(bad.format().find("d.json: kernels.training_scale: must be in (0, 2]") !=
        std::string::npos);
}

TEST_CASE("kernel cost: a PyTorch-native stack's attention and training scale, from the device") {
  Diagnostics diag;
  const auto s =
      load_scenario(kSource + "/scenarios/published/torchtitan-llama3.1-8b-fsdp-h100-8.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  REQUIRE(s->plan->framework == Framework::kPytorch);
  const ModuleSpec& llm = s->model.modules[0];
  const DeviceSpec& device = s->cluster.device;
  REQUIRE(device.kernels->pytorch.has_value());
  REQUIRE(device.kernels->pytorch->attention.has_value());
  const double peak = peak_flops(s->cluster, DType::kBf16);
  const KernelTuning tuning;
  // Attention alone at 8k tokens (causal): FlashAttention-2 against cuDNN's fused kernel.
  Op attention = forward_layer(8192, 1, 8192.0 * 8193 / 2, 0);
  const double megatron = kernel_compute_s(llm, attention, device, peak, 2, tuning);
  attention.flags = kOpPytorchKernels;
  const double pytorch = kernel_compute_s(llm, attention, device, peak, 2, tuning);
  const DeviceKernels& k = *device.kernels;
  const double expected = k.attention.forward_efficiency * k.training_scale /
                          (k.pytorch->attention->forward_efficiency * k.pytorch->training_scale);
  CHECK(pytorch > 1.4 * megatron);
  CHECK(pytorch == doctest::Approx(megatron * expected).epsilon(0.05));
  // GEMMs: the same kernels at the stack's own scale.
  Op gemms = forward_layer(8192, 1, 0, 2.0 * 218e6 * 8192);
  const double gemm_megatron = kernel_compute_s(llm, gemms, device, peak, 2, tuning);
  gemms.flags = kOpPytorchKernels;
  CHECK(kernel_compute_s(llm, gemms, device, peak, 2, tuning) > gemm_megatron);
  // A device without a `pytorch` block runs both stacks alike.
  DeviceSpec plain = device;
  plain.kernels->pytorch.reset();
  CHECK(kernel_compute_s(llm, attention, plain, peak, 2, tuning) == doctest::Approx(megatron));
  // The lowering marks every compute op of a pytorch plan, and only those.
  const Lowered pt = lower(s->model, s->cluster, *s->plan, s->workload, draw_batch(s->workload, 0));
  REQUIRE(pt.error.empty());
  ParallelPlan megatron_plan = *s->plan;
  megatron_plan.framework = Framework::kMegatron;
  const Lowered mg =
      lower(s->model, s->cluster, megatron_plan, s->workload, draw_batch(s->workload, 0));
  std::size_t marked = 0, compute = 0;
  for (const Op& op : pt.program.ranks[0])
    if (op.kind == OpKind::kCompute) {
      ++compute;
      marked += (op.flags & kOpPytorchKernels) != 0 ? 1 : 0;
    }
  CHECK(compute > 0);
  CHECK(marked == compute);
  for (const Op& op : mg.program.ranks[0]) CHECK((op.flags & kOpPytorchKernels) == 0);
  // Read from the device file and written back; bounded.
  Json kernels = to_json(k);
  Diagnostics round;
  CHECK(read_device_kernels(kernels, "d.json", "kernels", round) == k);
  CHECK(round.ok());
  kernels["pytorch"]["training_scale"] = 0;
  kernels["pytorch"]["attention"]["forward_efficiency"] = 2;
  Diagnostics bad;
  read_device_kernels(kernels, "d.json", "kernels", bad);
  CHECK(bad.format().find("d.json: kernels.pytorch.training_scale: must be in (0, 2]") !=
        std::string::npos);
  CHECK(bad.format().find("d.json: kernels.pytorch.attention.forward_efficiency") !=
        std::string::npos);
}

TEST_CASE("kernel cost: per-op recomputation re-runs its matmuls and element-wise kernels only") {
  Diagnostics diag;
  const auto s =
      load_scenario(kSource + "/scenarios/published/torchtitan-llama3.1-8b-fsdp-h100-8.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  const ModuleSpec& llm = s->model.modules[0];
  const DeviceSpec& device = s->cluster.device;
  const double peak = peak_flops(s->cluster, DType::kBf16);
  const KernelTuning tuning;
  const double recomputed =
      2.0 * static_cast<double>(per_op_recomputed_matmul_parameters(*llm.transformer)) * 8192;
  Op r = forward_layer(8192, 1, 8192.0 * 8193 / 2, recomputed);
  r.phase = Phase::kR;
  r.flags = kOpPerOpRecompute;
  const double seconds = kernel_compute_s(llm, r, device, peak, 2, tuning);
  // Attention is kept: the pairs do not count.
  Op longer = r;
  longer.attention_pairs *= 4;
  CHECK(kernel_compute_s(llm, longer, device, peak, 2, tuning) == doctest::Approx(seconds));
  // Cheaper than the layer's forward; dearer than its GEMMs' share of it, the element-wise
  // kernels all running again.
  const double layer =
      2.0 * static_cast<double>(active_layer_matmul_parameters(*llm.transformer)) * 8192;
  Op f = forward_layer(8192, 1, 8192.0 * 8193 / 2,
                       layer + layer_attention_flops(*llm.transformer, 8192.0 * 8193 / 2));
  const double forward = kernel_compute_s(llm, f, device, peak, 2, tuning);
  Op gemms_only = forward_layer(8192, 1, 0, layer);
  const double gemms = kernel_compute_s(llm, gemms_only, device, peak, 2, tuning);
  CHECK(seconds < forward);
  CHECK(seconds > gemms * recomputed / layer);
}

TEST_CASE("kernel cost: recomputed norms and activations are memory passes before the backward") {
  const std::optional<Scenario> s = published("nvidia-llama3.1-8b-h100-8");
  const ModuleSpec& llm = s->model.modules[0];
  const TransformerArch& a = *llm.transformer;
  const DeviceSpec& device = s->cluster.device;
  const double peak = peak_flops(s->cluster, DType::kBf16);
  const KernelTuning tuning;
  Op b = forward_layer(8192, 1, 8192.0 * 8193 / 2, 1e12);
  b.phase = Phase::kB;
  b.layers = 2;
  const double plain = kernel_compute_s(llm, b, device, peak, 2, tuning);
  const double bandwidth = device.memory_bandwidth_bytes_per_s * device.kernels->memory_efficiency;
  // The two norms read and write the hidden vector again: 4 values a token and layer, 2 kernels.
  Op norms = b;
  norms.flags = kOpLayernormRecompute;
  CHECK(kernel_compute_s(llm, norms, device, peak, 2, tuning) - plain ==
        doctest::Approx(2 * 2 * 4.0 * static_cast<double>(a.hidden) * 8192 / bandwidth +
                        2 * 2 * tuning.launch_s));
  // A dense MLP's gated activation reads two values and writes one; its matrices are in op.flops.
  Op mlp = b;
  mlp.flags = kOpMlpRecompute;
  CHECK(kernel_compute_s(llm, mlp, device, peak, 2, tuning) - plain ==
        doctest::Approx(2 * 2 * 3.0 * static_cast<double>(a.ffn) * 8192 / bandwidth +
                        2 * 4 * tuning.launch_s));
  // Nothing of an MoE layer in a dense model; nothing outside the backward.
  Op moe = b;
  moe.flags = kOpMoeRecompute | kOpMoeActRecompute;
  CHECK(kernel_compute_s(llm, moe, device, peak, 2, tuning) == doctest::Approx(plain));
  Op forward = norms;
  forward.phase = Phase::kF;
  Op forward_plain = b;
  forward_plain.phase = Phase::kF;
  CHECK(kernel_compute_s(llm, forward, device, peak, 2, tuning) ==
        doctest::Approx(kernel_compute_s(llm, forward_plain, device, peak, 2, tuning)));
}

TEST_CASE("kernel cost: an MoE layer permutes its tokens around the experts") {
  const std::optional<Scenario> s = published("nvidia-deepseek-v3-h100-1024");
  const ModuleSpec& llm = s->model.modules[0];
  const TransformerArch& a = *llm.transformer;
  REQUIRE(moe_layer(a, 3));
  const DeviceSpec& device = s->cluster.device;
  const double peak = peak_flops(s->cluster, DType::kBf16);
  const KernelTuning tuning;
  const double bandwidth = device.memory_bandwidth_bytes_per_s * device.kernels->memory_efficiency;
  const double h = static_cast<double>(a.hidden), k = static_cast<double>(a.top_k);
  Op op = forward_layer(4096, 1, 4096.0 * 4097 / 2, 1e12);
  op.first_layer = 3;  // the first MoE layer
  op.ep = 64;          // four experts a rank
  op.flags = kOpDeepEpDispatch;
  const double deepep = kernel_compute_s(llm, op, device, peak, 2, tuning);
  // The all-to-all dispatcher also sorts the tokens by local expert, and back (a third
  // concatenation besides), and counts its tokens per expert (6 kernels).
  Op sorted = op;
  sorted.flags = 0;
  CHECK(kernel_compute_s(llm, sorted, device, peak, 2, tuning) - deepep ==
        doctest::Approx(2 * 4.0 * k * h * 4096 / bandwidth + (2 + 1 + 6) * tuning.launch_s));
  // With one expert a rank there is nothing to sort; the counts remain.
  sorted.ep = 256;
  Op one = op;
  one.ep = 256;
  CHECK(kernel_compute_s(llm, sorted, device, peak, 2, tuning) ==
        doctest::Approx(kernel_compute_s(llm, one, device, peak, 2, tuning) + 6 * tuning.launch_s));
  // Recomputing the MoE layer whole permutes once more before the backward, beside the
  // activations of its experts and shared expert, and computes its load-balancing loss again.
  Op b = op;
  b.phase = Phase::kB;
  const double backward = kernel_compute_s(llm, b, device, peak, 2, tuning);
  b.flags |= kOpMoeRecompute;
  const double routed = k * static_cast<double>(a.moe_ffn);
  const double shared = static_cast<double>(a.shared_expert_ffn);
  CHECK(kernel_compute_s(llm, b, device, peak, 2, tuning) - backward ==
        doctest::Approx(2 * (2 * (k + 1) * h + 3 * (routed + shared)) * 4096 / bandwidth +
                        (2 + 2 * 3 + 3 + 2 * 3 + 6) * tuning.launch_s));
}

TEST_CASE("kernel cost: Megatron-LM's MoE layer launches its router and a GEMM per local expert") {
  const std::optional<Scenario> s = published("nvidia-deepseek-v3-h100-1024");
  const ModuleSpec& llm = s->model.modules[0];
  const DeviceSpec& device = s->cluster.device;
  const double peak = peak_flops(s->cluster, DType::kBf16);
  // The kernels an op launches: its price's change per second of launch.
  const auto launches = [&](const Op& op) {
    KernelTuning none, slow;
    none.launch_s = 0;
    slow.launch_s = 1e-3;
    return std::round((kernel_compute_s(llm, op, device, peak, 2, slow) -
                       kernel_compute_s(llm, op, device, peak, 2, none)) /
                      1e-3);
  };
  Op op = forward_layer(4096, 1, 4096.0 * 4097 / 2, 1e12);
  op.first_layer = 3;  // the first MoE layer
  op.flags = kOpDeepEpDispatch;
  op.ep = 256;  // one expert a rank
  // A layer's 13 (4 GEMMs, attention, 8 element-wise), the permutation's 2, the router's 2,
  // its load-balancing loss and bookkeeping 6.
  CHECK(launches(op) == 23);
  Op eager = op;
  eager.flags |= kOpPytorchKernels;
  CHECK(launches(eager) < launches(op));
  // Four experts a rank: each of the experts' two GEMMs launched four times, in every phase.
  for (const Phase phase : {Phase::kF, Phase::kB, Phase::kW}) {
    Op one = op, four = op;
    one.phase = four.phase = phase;
    four.ep = 64;
    CHECK(launches(four) - launches(one) == 6);
  }
  Op b = op;
  b.phase = Phase::kB;
  Op w = op;
  w.phase = Phase::kW;
  CHECK(launches(w) == 4 + 1);  // the layer's 4 weight-gradient GEMMs, the router's
  CHECK(launches(b) == 2 * 13 + 2 + 2 + 7);
  // HybridEP: its probabilities' cast, routing-map scan and padding, and the barrier kernels
  // around each dispatch and combine; the permutation unfused: PyTorch's sort, index and
  // scatter kernels where the fused pair has one each.
  Op hybrid = op, hybrid_b = b, unfused = op, unfused_b = b;
  hybrid.flags |= kOpHybridEpDispatch;
  hybrid_b.flags |= kOpHybridEpDispatch;
  CHECK(launches(hybrid) - launches(op) == 10);
  CHECK(launches(hybrid_b) - launches(b) == 7);
  unfused.flags |= kOpUnfusedPermute;
  unfused_b.flags |= kOpUnfusedPermute;
  CHECK(launches(unfused) - launches(op) == 12);
  CHECK(launches(unfused_b) - launches(b) == 13);
}

TEST_CASE("kernel cost: FP8 GEMMs at the FP8 rate, their inputs quantized; attention unchanged") {
  Diagnostics diag;
  const auto s =
      load_scenario(kSource + "/scenarios/published/nvidia-llama3.1-8b-h100-8.json", diag);
  REQUIRE(s.has_value());
  const ModuleSpec& llm = s->model.modules[0];
  const DeviceSpec& device = s->cluster.device;
  const double peak = peak_flops(s->cluster, DType::kBf16);
  const KernelTuning tuning;
  // One Llama-3.1-8B layer's matrices at 8k tokens, no attention; then its attention alone.
  const Op gemms = forward_layer(8192, 1, 0, 2.0 * 218e6 * 8192);
  Op fp8 = gemms;
  fp8.flags = kOpFp8;
  Op current = fp8;
  current.flags = static_cast<uint32_t>(kOpFp8 | kOpFp8CurrentScaling);
  const double bf16_s = kernel_compute_s(llm, gemms, device, peak, 2, tuning);
  const double fp8_s = kernel_compute_s(llm, fp8, device, peak, 2, tuning);
  const double current_s = kernel_compute_s(llm, current, device, peak, 2, tuning);
  // The GEMMs alone would run 1.77x faster (the measured FP8/BF16 ratio); the quantization
  // passes and the unchanged element-wise kernels take part of it back.
  CHECK(fp8_s < bf16_s / 1.3);
  CHECK(fp8_s > bf16_s / 1.77);
  CHECK(current_s > fp8_s);
  CHECK(current_s < bf16_s);
  // Block scales: the quantization passes of delayed scaling (each block's scale taken as it is
  // cast), the GEMMs at the block-scaled rate, the measured ratio to per-tensor ones.
  Op block = fp8;
  block.flags = static_cast<uint32_t>(kOpFp8 | kOpFp8BlockScaling);
  const double block_s = kernel_compute_s(llm, block, device, peak, 2, tuning);
  const GemmKernels& g = device.kernels->gemm;
  CHECK(g.fp8_block() == doctest::Approx(g.fp8() * 1261.2 / 1460.4));
  CHECK(block_s > fp8_s);
  CHECK(block_s < bf16_s);
  CHECK(block_s - fp8_s < (fp8_s - bf16_s / 1.77) * 1.5);
  CHECK(fp8_gemm_s(device, 8192, 8192, 8192, 1, 1, true) /
            fp8_gemm_s(device, 8192, 8192, 8192, 1, 1, false) ==
        doctest::Approx(1460.4 / 1261.2));
  // The device's FP8 efficiency is read and used: stating it lower slows the FP8 op only.
  DeviceSpec slower = device;
  slower.kernels->gemm.fp8_efficiency = slower.kernels->gemm.fp8() / 2;
  CHECK(kernel_compute_s(llm, fp8, slower, peak, 2, tuning) > 1.3 * fp8_s);
  CHECK(kernel_compute_s(llm, gemms, slower, peak, 2, tuning) == doctest::Approx(bf16_s));
  // Attention stays in 16 bits: an attention-only op is not faster in FP8; it costs its
  // quantization passes more (each less than the FP8 GEMMs save).
  Op attention = forward_layer(8192, 1, 8192.0 * 8193 / 2, 0);
  attention.layers = 1;
  const double a16 = kernel_compute_s(llm, attention, device, peak, 2, tuning);
  attention.flags = kOpFp8;
  const double a8 = kernel_compute_s(llm, attention, device, peak, 2, tuning);
  CHECK(a8 > a16);
  CHECK(a8 < a16 + (bf16_s - fp8_s));
  // Bounded when read.
  Json kernels = to_json(*device.kernels);
  kernels["gemm"]["fp8_efficiency"] = 1.5;
  kernels["gemm"]["fp8_block_efficiency"] = -0.1;
  Diagnostics bad;
  read_device_kernels(kernels, "d.json", "kernels", bad);
  CHECK(bad.format().find("d.json: kernels.gemm.fp8_efficiency") != std::string::npos);
  CHECK(bad.format().find("d.json: kernels.gemm.fp8_block_efficiency") != std::string::npos);
  // A device's own block-scaled efficiency is kept through its JSON.
  kernels = to_json(*device.kernels);
  kernels["gemm"]["fp8_block_efficiency"] = 0.5;
  Diagnostics fine;
  CHECK(read_device_kernels(kernels, "d.json", "kernels", fine).gemm.fp8_block() == 0.5);
  CHECK(to_json(read_device_kernels(kernels, "d.json", "kernels",
                                    fine))["gemm"]["fp8_block_efficiency"] == 0.5);
}

TEST_CASE("tp_comm_overlap hides all but one chunk of the TP traffic behind the compute") {
  Diagnostics diag;
  const auto s =
      load_scenario(kSource + "/scenarios/published/nvidia-gpt3-175b-h100-128.json", diag);
  REQUIRE(s.has_value());
  ParallelPlan plan = *s->plan;
  REQUIRE(plan.sequence_parallel);
  plan.tp_comm_overlap = true;
  const Lowered lowered =
      lower(s->model, s->cluster, resolve_stage_split(plan, s->model, s->workload, s->cluster),
            s->workload, draw_batch(s->workload, 0));
  REQUIRE(lowered.error.empty());
  const CostModel cost(s->cluster, s->model.dtype, default_cost_params(s->cluster), s->model);
  const Program& p = lowered.program;
  int checked = 0;
  for (const Op& op : p.ranks[0]) {
    if (op.kind != OpKind::kCompute || op.nested.empty() || op.phase != Phase::kF) continue;
    REQUIRE((op.flags & kOpTpCommOverlap) != 0);
    Op plain = op;
    plain.flags = static_cast<uint8_t>(plain.flags & ~kOpTpCommOverlap);
    double tp_comm = 0;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kTp)
        tp_comm += n.count *
                   cost.collective_s(n.kind, p.groups[static_cast<std::size_t>(n.group)], n.bytes);
    REQUIRE(tp_comm > 0);
    const double compute = cost.compute_only_s(p, plain);
    // The compute that ran beside the hidden traffic runs slower by the measured factor
    // (overlap_slowdown.hpp), so only (2 - s) of the hidden seconds are saved.
    const double hidden = std::min(compute, tp_comm * (op.tp - 1.0) / op.tp);
    CHECK(cost.params().overlap_slowdown == kMeasuredOverlapSlowdown);
    CHECK(cost.compute_only_s(p, op) ==
          doctest::Approx(compute - hidden + (kMeasuredOverlapSlowdown - 1) * hidden));
    CHECK(cost.compute_s(p, op) < cost.compute_s(p, plain));
    ++checked;
  }
  CHECK(checked > 0);
  // It overlaps sequence parallelism's all-gathers and reduce-scatters: refused without it.
  ParallelPlan bad = plan;
  bad.sequence_parallel = false;
  Diagnostics v;
  validate_plan(bad, s->model, s->workload, s->cluster, "p.json", "plan", v);
  CHECK(v.format().find("tp_comm_overlap: needs sequence_parallel") != std::string::npos);
}

TEST_CASE("sequence parallelism: Megatron-LM gathers the inputs again in the backward, hidden") {
  const std::optional<Scenario> s = published("nvidia-gpt3-175b-h100-128");
  REQUIRE(s->plan->sequence_parallel);
  // The layer stack's gathers (two calls a layer; the embedding's and the head's, one each, are
  // not the layers').
  const auto gathers = [](const Op& op) {
    std::vector<NestedCollective> out;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kTp && n.kind == CollectiveKind::kAllGather &&
          n.count == 2 * op.layers)
        out.push_back(n);
    return out;
  };
  ParallelPlan pytorch = *s->plan;
  pytorch.framework = Framework::kPytorch;
  const Program p = lowered_program(*s, *s->plan), q = lowered_program(*s, pytorch);
  const CostModel cost(s->cluster, s->model.dtype, default_cost_params(s->cluster), s->model);
  REQUIRE(p.ranks[0].size() == q.ranks[0].size());
  int checked = 0;
  for (std::size_t i = 0; i < p.ranks[0].size(); ++i) {
    const Op& op = p.ranks[0][i];
    if (op.kind != OpKind::kCompute || op.layers == 0) continue;
    const std::vector<NestedCollective> g = gathers(op);
    // PyTorch's tensor parallelism keeps the gathered input: one gather in every phase.
    CHECK(gathers(q.ranks[0][i]).size() == (op.phase == Phase::kW ? 0u : 1u));
    if (op.phase != Phase::kB) {
      CHECK(g.size() == (op.phase == Phase::kW ? 0u : 1u));
      CHECK(cost.hidden_regather_s(p, op) == 0);
      continue;
    }
    // The backward: the output gradients' gathers, then the inputs' again, as many and as large.
    REQUIRE(g.size() == 2);
    CHECK(g[1].count == g[0].count);
    CHECK(g[1].bytes == doctest::Approx(g[0].bytes));
    // Each call hides behind its matrix's input-gradient GEMM: some of it, at most all.
    const double call = cost.collective_s(p, g[1]);
    const double hidden = cost.hidden_regather_s(p, op);
    CHECK(hidden > 0);
    CHECK(hidden <= g[1].count * call * (1 + 1e-9));
    // The hidden seconds come off the compute part, less the slowdown of compute beside them.
    Op single = op;
    std::size_t last = single.nested.size();
    for (std::size_t n = 0; n < single.nested.size(); ++n)
      if (single.nested[n].purpose == Purpose::kTp &&
          single.nested[n].kind == CollectiveKind::kAllGather)
        last = n;
    single.nested.erase(single.nested.begin() + static_cast<std::ptrdiff_t>(last));
    REQUIRE(gathers(single).size() == 1);
    CHECK(cost.hidden_regather_s(p, single) == 0);
    CHECK(cost.compute_only_s(p, single) - cost.compute_only_s(p, op) ==
          doctest::Approx((2 - kMeasuredOverlapSlowdown) * hidden));
    ++checked;
  }
  CHECK(checked > 0);
}

TEST_CASE(
    "fp8 delayed scaling: each chunk's forward and backward reduce their amaxes over the stage") {
  const std::optional<Scenario> s = published("nvidia-gpt3-175b-fp8-h100-128");
  REQUIRE(s->plan->fp8 == Fp8Recipe::kDelayed);
  REQUIRE(s->plan->overlap_grad_reduce);  // backwards in bucket pieces: one reduction a chunk
  const Program p = lowered_program(*s, *s->plan);
  const ModuleLayout& l = s->plan->layout;
  const double layer_gemms = 4;  // Q/K/V, output projection, the MLP's two
  std::map<std::tuple<Phase, int32_t, int16_t>, int> reductions;  // per phase, micro-batch, chunk
  for (const Op& op : p.ranks[0]) {
    if (op.kind != OpKind::kCompute) continue;
    for (const NestedCollective& n : op.nested) {
      if (n.purpose != Purpose::kAmax) continue;
      REQUIRE((op.phase == Phase::kF || op.phase == Phase::kB));
      ++reductions[{op.phase, op.microbatch, op.chunk}];
      CHECK(n.kind == CollectiveKind::kAllReduce);
      CHECK(n.count == 1);
      // The stage's TP, CP and DP ranks, rank 0 among them.
      const auto& group = p.groups[static_cast<std::size_t>(n.group)];
      CHECK(static_cast<int64_t>(group.size()) == l.tp * l.cp * l.dp);
      CHECK(std::find(group.begin(), group.end(), 0) != group.end());
      // A chunk's every layer's GEMMs: input and weight amaxes forward, output gradients' back.
      const double chunk_layers = static_cast<double>(s->model.modules[0].transformer->layers) /
                                  static_cast<double>(l.pp * l.vpp);
      CHECK(n.bytes ==
            doctest::Approx(4.0 * layer_gemms * chunk_layers * (op.phase == Phase::kF ? 2 : 1)));
    }
  }
  // One a forward and one a backward of each micro-batch on each of the rank's chunks.
  REQUIRE(!reductions.empty());
  CHECK(reductions.size() == static_cast<std::size_t>(2 * s->plan->num_micro_batches * l.vpp));
  for (const auto& [at, n] : reductions) CHECK(n == 1);
  // Their cost: the collective's time and two kernels (the amaxes gathered, the scales updated).
  const CostModel cost(s->cluster, s->model.dtype, default_cost_params(s->cluster), s->model);
  bool priced = false;
  for (const Op& op : p.ranks[0]) {
    if (op.kind != OpKind::kCompute || op.phase != Phase::kF || op.nested.empty()) continue;
    Op none = op;
    std::erase_if(none.nested,
                  [](const NestedCollective& n) { return n.purpose == Purpose::kAmax; });
    if (none.nested.size() == op.nested.size()) continue;
    const NestedCollective& amax =
        *std::find_if(op.nested.begin(), op.nested.end(),
                      [](const NestedCollective& n) { return n.purpose == Purpose::kAmax; });
    CHECK(cost.compute_s(p, op) - cost.compute_s(p, none) ==
          doctest::Approx(cost.collective_s(p, amax) + 2 * KernelTuning{}.launch_s));
    priced = true;
    break;
  }
  CHECK(priced);
  // Current and block scaling take their scales from the tensors themselves: no reduction.
  for (const Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kBlockwise}) {
    ParallelPlan other = *s->plan;
    other.fp8 = recipe;
    const Program q = lowered_program(*s, other);
    for (const Op& op : q.ranks[0])
      for (const NestedCollective& n : op.nested) CHECK(n.purpose != Purpose::kAmax);
  }
}

TEST_CASE("one layer of the 22B model as Korthikanti et al. 2022 timed it (their Table 4)") {
  // Forward and backward milliseconds of one transformer layer, GPT 22B, TP 8, micro-batch 4,
  // sequence 2048, on A100 (Korthikanti et al. 2022, Table 4). The backward's input-gradient
  // all-reduces run beside the weight-gradient GEMMs (tp_backward_overlap): without it the plain
  // backward is priced more than 10% slow.
  struct Row {
    const char* name;
    Recompute recompute;
    bool sequence_parallel;
    double forward_ms, backward_ms;
  };
  const Row rows[] = {{"no recompute", Recompute::kNone, false, 7.7, 11.9},
                      {"sequence parallelism", Recompute::kNone, true, 7.2, 11.8},
                      {"full recompute", Recompute::kFull, false, 7.7, 19.5},
                      {"selective recompute", Recompute::kSelective, false, 7.7, 13.2},
                      {"selective + sequence", Recompute::kSelective, true, 7.2, 13.1}};
  Diagnostics diag;
  const auto s = load_scenario(kSource + "/scenarios/published/korthikanti-22b-full.json", diag);
  REQUIRE(s.has_value());
  // Seconds of rank 0's forward ops and of its backward ops (R, B, W).
  auto phases = [&](const ModelSpec& model, const ParallelPlan& plan) {
    const Lowered lowered =
        lower(model, s->cluster, resolve_stage_split(plan, model, s->workload, s->cluster),
              s->workload, draw_batch(s->workload, 0));
    REQUIRE(lowered.error.empty());
    const CostModel c(s->cluster, model.dtype, default_cost_params(s->cluster), model);
    double forward = 0, backward = 0;
    for (const Op& op : lowered.program.ranks[0]) {
      if (op.kind != OpKind::kCompute) continue;
      (op.phase == Phase::kF ? forward : backward) += c.compute_s(lowered.program, op);
    }
    return std::make_pair(forward, backward);
  };
  ModelSpec fewer = s->model;
  --fewer.modules[0].transformer->layers;
  for (const Row& row : rows) {
    for (const bool overlap : {true, false}) {
      ParallelPlan plan = *s->plan;
      plan.recompute = row.recompute;
      plan.sequence_parallel = row.sequence_parallel;
      plan.tp_backward_overlap = overlap;
      const auto [f48, b48] = phases(s->model, plan);
      const auto [f47, b47] = phases(fewer, plan);
      const double forward_ms = (f48 - f47) * 1e3, backward_ms = (b48 - b47) * 1e3;
      const std::string what = std::string(row.name) + (overlap ? "" : ", no overlap") +
                               ": forward " + std::to_string(forward_ms) + " ms (published " +
                               std::to_string(row.forward_ms) + "), backward " +
                               std::to_string(backward_ms) + " ms (published " +
                               std::to_string(row.backward_ms) + ")";
      INFO(what);
      CHECK(std::abs(forward_ms / row.forward_ms - 1) < 0.1);
      if (overlap) CHECK(std::abs(backward_ms / row.backward_ms - 1) < 0.1);
      if (!overlap && row.recompute == Recompute::kNone && !row.sequence_parallel)
        CHECK(backward_ms / row.backward_ms - 1 > 0.1);
    }
  }
}

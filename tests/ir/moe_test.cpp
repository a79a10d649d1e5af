// Mixture of experts: the router's load model, expert parallelism in the lowering (experts split
// over EP ranks, their gradients reduced over expert-data-parallel replicas, the dispatch and
// combine all-to-alls) and the search over EP.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "shared/cost/collective_cost.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/model/expert_load.hpp"
#include "shared/model/model_math.hpp"
#include "shared/search/estimate.hpp"
#include "shared/search/megatron_export.hpp"
#include "shared/search/memory_bound.hpp"
#include "shared/search/plan_search.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

Scenario moe_scenario() {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-moe.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return *s;
}

ParallelPlan with_ep(const Scenario& s, int64_t dp, int64_t ep, bool distributed = false) {
  ParallelPlan p = *s.plan;
  p.layout.dp = dp;
  p.layout.ep = ep;
  p.distributed_optimizer = distributed;
  return p;
}

Program lowered(const Scenario& s, const ParallelPlan& plan) {
  Diagnostics diag;
  validate_plan(plan, s.model, s.workload, s.cluster, "", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  Lowered l = lower(s.model, s.cluster, resolve_stage_split(plan, s.model, s.workload, s.cluster),
                    s.workload, draw_batch(s.workload, 0));
  REQUIRE(l.error.empty());
  const auto problems = check_program(l.program);
  INFO((problems.empty() ? std::string() : problems.front()));
  CHECK(problems.empty());
  return std::move(l.program);
}

// The published DeepSeek-V3 row on 1,024 H100s (NVIDIA's recipe).
std::optional<Scenario> deepseek_v3_row() {
  Diagnostics diag;
  auto s = load_scenario(
      std::string(TESSERA_SOURCE_DIR) + "/scenarios/published/nvidia-deepseek-v3-h100-1024.json",
      diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return s;
}

const TransformerArch& llm_arch(const Scenario& s) {
  return *s.model.modules.back().transformer;
}

// A search of homogeneous plans without a pipeline, CP or recomputation, micro-batch 1: the EP
// and expert options alone vary.
SearchSpace homogeneous_space() {
  SearchSpace space;
  space.placements = {Placement::kHomogeneous};
  space.tp = {1};
  space.pp = {1};
  space.cp = {1};
  space.vpp = {1};
  space.recompute = {Recompute::kNone};
  space.micro_batch_sizes = {1};
  return space;
}

}  // namespace

TEST_CASE("expert load: even without skew, skewed by a Zipf law, clipped by a capacity") {
  // No skew: every rank its even share.
  CHECK(expert_load(8, 4, 0, 0, 1, 0).busiest == 1);
  CHECK(expert_load(8, 4, 0, 0, 1, 0).kept == 1);
  // One rank holds every expert: it always has all the tokens, the even share.
  CHECK(expert_load(8, 1, 0, 1.5, 1, 3).busiest == doctest::Approx(1));
  // Zipf 1 over 8 experts on 8 ranks: the most popular expert takes 1/H_8 of the tokens, 8/H_8
  // = 2.94 times its share, whichever rank the drawn order gives it.
  const double h8 = 1 + 1. / 2 + 1. / 3 + 1. / 4 + 1. / 5 + 1. / 6 + 1. / 7 + 1. / 8;
  CHECK(expert_load(8, 8, 0, 1.0, 7, 0).busiest == doctest::Approx(8 / h8));
  // Two experts per rank: the busiest rank's load depends on the order drawn, which the seed
  // and the layer fix; it lies between the even share and the two most popular experts'.
  for (int64_t layer = 0; layer < 16; ++layer) {
    const ExpertLoad l = expert_load(8, 4, 0, 1.0, 7, layer);
    CHECK(l.busiest == expert_load(8, 4, 0, 1.0, 7, layer).busiest);
    CHECK(l.busiest > 1);
    CHECK(l.busiest <= (1 + 1. / 2) / h8 * 8 / 2 + 1e-12);
    CHECK(l.kept == doctest::Approx(1));
  }
  bool differs = false;
  for (int64_t layer = 1; layer < 16; ++layer)
    differs = differs || expert_load(8, 4, 0, 1.0, 7, layer).busiest !=
                             expert_load(8, 4, 0, 1.0, 7, 0).busiest;
  CHECK(differs);
  // A capacity factor of 1.25 keeps at most 1.25 shares per expert and drops the rest.
  const ExpertLoad capped = expert_load(8, 8, 1.25, 1.0, 7, 0);
  CHECK(capped.busiest == doctest::Approx(1.25));
  CHECK(capped.kept < 1);
}

TEST_CASE("EP splits the routed experts; their gradients are reduced over expert-DP replicas") {
  const Scenario s = moe_scenario();
  const TransformerArch& a = llm_arch(s);
  const double expert_weights = static_cast<double>(a.layers) * expert_layer_parameters(a, 1, 1);
  REQUIRE(expert_weights > 0);
  // dp 4: EP 1 holds all 8 experts on every rank, EP 2 four, and reduces them over 2 replicas.
  const Program one = lowered(s, with_ep(s, 4, 1)), two = lowered(s, with_ep(s, 4, 2));
  const double bytes = 4;  // fp32
  CHECK(one.memory[0].weight_bytes - two.memory[0].weight_bytes ==
        doctest::Approx(expert_weights / 2 * bytes));
  int expert_reductions = 0;
  for (const auto& ops : {one.ranks[0], two.ranks[0]})
    for (const Op& op : ops)
      if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp &&
          (op.flags & kOpRoutedExperts) != 0) {
        ++expert_reductions;
        CHECK(two.groups[static_cast<std::size_t>(op.group)].size() == 2);
        CHECK(op.message_bytes == doctest::Approx(expert_weights / 2 * bytes));
        CHECK(op_name(two, op).ends_with(".experts"));
      }
  CHECK(expert_reductions == 1);  // EP 2's, none for EP 1
  // Each rank exchanges its token counts per expert (forward), dispatches and combines through
  // all-to-alls of its EP group, with the router weights beside the tokens in one of their own,
  // per layer; the backward sends the gradients of the last three.
  int dispatched = 0;
  for (const Op& op : two.ranks[1]) {
    if (op.kind != OpKind::kCompute || two.modules[static_cast<std::size_t>(op.module)] != "llm")
      continue;
    int32_t count = 0;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kEp) {
        CHECK(n.kind == CollectiveKind::kAllToAll);
        CHECK(two.groups[static_cast<std::size_t>(n.group)].size() == 2);
        count += n.count;
      }
    CHECK(count == (op.phase == Phase::kF ? 4 : op.phase == Phase::kB ? 3 : 0) * op.layers);
    ++dispatched;
  }
  CHECK(dispatched > 0);
  // The distributed optimizer shards each parameter's state over its replicas: dp of a dense
  // one, dp / ep of a routed expert, so a rank keeps the same optimizer state with EP as
  // without, and less weight and gradient memory.
  const Program d1 = lowered(s, with_ep(s, 4, 1, true)), d2 = lowered(s, with_ep(s, 4, 2, true));
  CHECK(d2.memory[0].optimizer_bytes == doctest::Approx(d1.memory[0].optimizer_bytes));
  CHECK(d2.memory[0].gradient_bytes < d1.memory[0].gradient_bytes);
}

TEST_CASE("a skewed router makes the EP group wait for its busiest rank") {
  Scenario s = moe_scenario();
  const ParallelPlan plan = with_ep(s, 2, 2);
  const auto llm_ops = [&](const Program& p) {
    double wait = 0, all_to_all = 0;
    for (const Op& op : p.ranks[0]) {
      if (op.kind != OpKind::kCompute || p.modules[static_cast<std::size_t>(op.module)] != "llm")
        continue;
      wait += op.expert_wait_flops;
      for (const NestedCollective& n : op.nested)
        if (n.purpose == Purpose::kEp) all_to_all += n.bytes;
    }
    return std::pair{wait, all_to_all};
  };
  REQUIRE(s.workload.router_skew == 1.0);
  const auto [skewed_wait, skewed_bytes] = llm_ops(lowered(s, plan));
  const double skewed_step = estimate(s, plan, 0, CostParams{}).metrics.step_s;
  s.workload.router_skew = 0;
  const auto [even_wait, even_bytes] = llm_ops(lowered(s, plan));
  const double even_step = estimate(s, plan, 0, CostParams{}).metrics.step_s;
  CHECK(even_wait == 0);
  CHECK(skewed_wait > 0);
  CHECK(skewed_bytes > even_bytes);
  CHECK(skewed_step > even_step);
  // A capacity factor of 1 keeps no expert above its share: the busiest rank has at most its
  // even share (it drops the rest), so nobody waits.
  s.workload.router_skew = 1.0;
  s.model.modules.back().transformer->capacity_factor = 1.0;
  CHECK(llm_ops(lowered(s, plan)).first <= 0);
}

TEST_CASE("the search tries EP where the LLM has experts, and only there") {
  Scenario s = moe_scenario();
  SearchSpace space = homogeneous_space();
  std::set<int64_t> eps;
  for (const Candidate& c : enumerate_plans(s, space, 4).valid) eps.insert(c.plan.layout.ep);
  CHECK(eps == std::set<int64_t>{1, 2, 4});  // 8 does not divide dp = 4
  s.model.modules.back().transformer->experts = 0;
  s.model.modules.back().transformer->top_k = 0;
  s.model.modules.back().transformer->shared_expert_ffn = 0;
  eps.clear();
  for (const Candidate& c : enumerate_plans(s, space, 4).valid) eps.insert(c.plan.layout.ep);
  CHECK(eps == std::set<int64_t>{1});
}

TEST_CASE("the search tries whole experts (etp 1) where the space lists it: EP out of tp*cp*dp") {
  Scenario s = moe_scenario();
  SearchSpace space = homogeneous_space();
  space.tp = {1, 2};
  space.sequence_parallel = {false, true};
  space.etp = {0, 1};
  // (tp, ep, etp as the plan holds it, sequence parallelism) of every valid plan on 4 devices.
  std::set<std::tuple<int64_t, int64_t, int64_t, bool>> seen;
  const Enumeration e = enumerate_plans(s, space, 4);
  for (const Candidate& c : e.valid) {
    const ModuleLayout& l = c.plan.layout;
    seen.emplace(l.tp, l.ep, l.etp, c.plan.sequence_parallel);
    // The parameter-state floor the search prunes by never exceeds what the Program holds.
    const ParallelPlan plan = resolve_stage_split(c.plan, s.model, s.workload, s.cluster);
    const Lowered lowered = lower(s.model, cluster_with_devices(s.cluster, 4), plan, s.workload,
                                  draw_batch(s.workload, 0));
    REQUIRE(lowered.error.empty());
    double busiest = 0;
    for (const RankMemory& m : lowered.program.memory)
      busiest = std::max(busiest, m.weight_bytes + m.gradient_bytes + m.optimizer_bytes);
    INFO(c.key);
    CHECK(mean_parameter_memory(plan, s.model).total() <= busiest * (1 + 1e-12));
  }
  using Seen = std::tuple<int64_t, int64_t, int64_t, bool>;
  // tp 1: one expert TP, EP out of dp = 4.
  for (int64_t ep : {1, 2, 4}) CHECK(seen.count(Seen{1, ep, 0, false}) == 1);
  CHECK(seen.count(Seen{1, 1, 1, false}) == 0);
  // tp 2, experts split over TP: EP out of dp = 2, with or without sequence parallelism.
  for (bool sp : {false, true})
    for (int64_t ep : {1, 2}) CHECK(seen.count(Seen{2, ep, 0, sp}) == 1);
  CHECK(seen.count(Seen{2, 4, 0, true}) == 0);
  // tp 2, whole experts: EP out of tp*dp = 4, only with sequence parallelism.
  for (int64_t ep : {1, 2, 4}) {
    CHECK(seen.count(Seen{2, ep, 1, true}) == 1);
    CHECK(seen.count(Seen{2, ep, 1, false}) == 0);
  }
  CHECK(seen.size() == 10);
  // With whole experts each rank holds tp times the routed experts of the split plan, at the
  // same EP: the floor says so.
  ParallelPlan split = *s.plan, whole;
  split.layout = {};
  split.layout.tp = 2;
  split.layout.dp = 2;
  split.layout.ep = 2;
  split.sequence_parallel = true;
  split.distributed_optimizer = false;
  split.fully_sharded = false;
  whole = split;
  whole.layout.etp = 1;
  const TransformerArch& a = llm_arch(s);
  const double routed = static_cast<double>(moe_layers(a, 0, a.layers)) *
                        static_cast<double>(expert_layer_parameters(a, 1, 1));
  // An fp32 weight and gradient and the optimizer's 12 bytes (parameter_memory), not sharded:
  // a rank holds 1/ep of the routed experts whole, or 1/(ep*tp) of them split.
  CHECK(mean_parameter_memory(whole, s.model).total() -
            mean_parameter_memory(split, s.model).total() ==
        doctest::Approx(20.0 * routed * (1.0 / 2 - 1.0 / 4)));

  // The space's key: "tp" or 1, written back as read; anything else named by its index.
  Diagnostics diag;
  const SearchSpace read =
      read_search_space(Json::parse(R"({"etp": ["tp", 1]})"), "s.json", "search", diag);
  CHECK(diag.ok());
  CHECK(read.etp == std::vector<int64_t>{0, 1});
  CHECK(to_json(read)["etp"] == Json::parse(R"(["tp", 1])"));
  CHECK(read_search_space(to_json(read), "", "", diag) == read);
  CHECK(to_json(SearchSpace{})["etp"] == Json::parse(R"(["tp"])"));
  read_search_space(Json::parse(R"({"etp": ["tp", 2]})"), "s.json", "search", diag);
  CHECK(diag.format().find("s.json: search.etp[1]: must be \"tp\" or 1") != std::string::npos);
  Diagnostics empty;
  read_search_space(Json::parse(R"({"etp": []})"), "s.json", "search", empty);
  CHECK(empty.format().find("s.json: search.etp: expected a non-empty array") != std::string::npos);
}

TEST_CASE("the search tries the expert dispatch the space lists, where there is an all-to-all") {
  Scenario s = moe_scenario();
  SearchSpace space = homogeneous_space();
  space.moe_dispatchers = {MoeDispatcher::kAllToAll, MoeDispatcher::kDeepEp};
  space.moe_a2a_overlap = {false, true};
  std::map<int64_t, std::set<std::pair<MoeDispatcher, bool>>> by_ep;
  for (const Candidate& c : enumerate_plans(s, space, 4).valid)
    by_ep[c.plan.layout.ep].emplace(c.plan.moe_dispatcher, c.plan.moe_a2a_overlap);
  const std::set<std::pair<MoeDispatcher, bool>> all = {{MoeDispatcher::kAllToAll, false},
                                                        {MoeDispatcher::kAllToAll, true},
                                                        {MoeDispatcher::kDeepEp, false},
                                                        {MoeDispatcher::kDeepEp, true}};
  // EP 1 has no all-to-all: one plan, the default dispatch.
  CHECK(by_ep[1] == std::set<std::pair<MoeDispatcher, bool>>{{MoeDispatcher::kAllToAll, false}});
  CHECK(by_ep[2] == all);
  CHECK(by_ep[4] == all);
  // Read and written back; a value that is no dispatcher named by its index.
  Diagnostics diag;
  const SearchSpace read = read_search_space(
      Json::parse(R"({"moe_dispatchers": ["deepep"], "moe_a2a_overlap": [true, false]})"), "s.json",
      "search", diag);
  CHECK(diag.ok());
  CHECK(read.moe_dispatchers == std::vector<MoeDispatcher>{MoeDispatcher::kDeepEp});
  CHECK(read.moe_a2a_overlap == std::vector<bool>{true, false});
  CHECK(read_search_space(to_json(read), "", "", diag) == read);
  CHECK(read_search_space(to_json(space), "", "", diag) == space);
  CHECK(diag.ok());
  read_search_space(Json::parse(R"({"moe_dispatchers": ["nccl"], "moe_a2a_overlap": [1]})"),
                    "s.json", "search", diag);
  CHECK(diag.format().find("s.json: search.moe_dispatchers[0]") != std::string::npos);
  CHECK(diag.format().find("s.json: search.moe_a2a_overlap: expected a non-empty array of true "
                           "and false") != std::string::npos);
}

TEST_CASE("layer patterns: dense layers before and between the MoE layers") {
  TransformerArch a = llm_arch(moe_scenario());
  a.layers = 7;
  // DeepSeek's first_k_dense_replace 1; Llama 4 Maverick's interleave step 2; both.
  for (const auto& [dense, every, expected] :
       {std::tuple{0, 1, std::set<int64_t>{0, 1, 2, 3, 4, 5, 6}},
        std::tuple{1, 1, std::set<int64_t>{1, 2, 3, 4, 5, 6}},
        std::tuple{0, 2, std::set<int64_t>{1, 3, 5}}, std::tuple{1, 2, std::set<int64_t>{2, 4, 6}},
        std::tuple{2, 3, std::set<int64_t>{4}}}) {
    a.dense_layers = dense;
    a.moe_every = every;
    std::set<int64_t> moe;
    for (int64_t l = 0; l < a.layers; ++l)
      if (moe_layer(a, l)) moe.insert(l);
    CHECK(moe == expected);
    double params = 0;
    for (int64_t first = 0; first <= a.layers; ++first)
      for (int64_t end = first; end <= a.layers; ++end) {
        int64_t count = 0;
        for (int64_t l = first; l < end; ++l) count += moe.contains(l) ? 1 : 0;
        CHECK(moe_layers(a, first, end) == count);
      }
    for (int64_t l = 0; l < a.layers; ++l)
      params += layer_parameters(moe.contains(l) ? a : dense_layer_arch(a), 2, 2);
    CHECK(stack_parameters(a, 0, a.layers, 2, 2) == doctest::Approx(params));
  }
  CHECK(layer_parameters(dense_layer_arch(a)) < layer_parameters(a));
}

TEST_CASE("a dense layer in an MoE stack routes nothing: no all-to-all, no expert weights") {
  Scenario s = moe_scenario();
  // Four layers: dense, dense, MoE, dense.
  TransformerArch& a = *s.model.modules.back().transformer;
  a.dense_layers = 1;
  a.moe_every = 2;
  REQUIRE(moe_layers(a, 0, a.layers) == 1);
  ParallelPlan plan = with_ep(s, 2, 2);
  plan.layout.pp = 2;  // stage 0 holds layers 0-1 (no experts), stage 1 layers 2-3
  plan.layout.stage_layers = {2, 2};
  const Program p = lowered(s, plan);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    for (const Op& op : p.ranks[r]) {
      if (op.kind == OpKind::kCompute && p.modules[static_cast<std::size_t>(op.module)] == "llm") {
        int32_t count = 0;
        for (const NestedCollective& n : op.nested)
          if (n.purpose == Purpose::kEp) count += n.count;
        const int64_t moe = moe_layers(a, op.first_layer, op.first_layer + op.layers);
        CHECK(moe == (op.first_layer == 2 ? 1 : 0));
        // Forward: the counts, the dispatch, the combine and the router weights' all-to-all;
        // backward: the last three's gradients.
        CHECK(count == (op.phase == Phase::kF ? 4 : op.phase == Phase::kB ? 3 : 0) * moe);
      }
      // Only the stage with the MoE layer reduces routed experts apart.
      if (op.kind == OpKind::kCollective && (op.flags & kOpRoutedExperts) != 0)
        CHECK(op.stage == 1);
    }
  }
  // Stage 0's two dense layers hold a dense MLP's weights where every layer with experts held
  // its share of the experts.
  a.dense_layers = 0;
  a.moe_every = 1;
  const Program all_moe = lowered(s, plan);
  const double dense_saving =
      2 * (layer_parameters(a, 1, 2) - layer_parameters(dense_layer_arch(a), 1, 2));
  CHECK(all_moe.memory[0].weight_bytes - p.memory[0].weight_bytes ==
        doctest::Approx(dense_saving * 4));  // fp32
}

TEST_CASE("router groups: read, written back, checked against the experts") {
  const auto read = [](const std::string& routing, Diagnostics& diag) {
    return read_model(Json::parse(R"({"name": "moe", "modules": [{"name": "llm", "role": "llm",
        "transformer": {"layers": 2, "hidden": 256, "heads": 4, "ffn": 512, "vocab": 100,
        "experts": 16, "top_k": 4)" +
                                  routing + "}}]}"),
                      "m.json", "", diag);
  };
  Diagnostics diag;
  const ModelSpec m = read(R"(, "router_groups": 4, "router_group_top_k": 2)", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  CHECK(m.modules[0].transformer->router_groups == 4);
  CHECK(m.modules[0].transformer->router_group_top_k == 2);
  Diagnostics again;
  CHECK(read_model(to_json(m), "m.json", "", again) == m);
  CHECK(again.ok());
  const auto error = [&](const std::string& routing) {
    Diagnostics d;
    read(routing, d);
    return d.format();
  };
  const std::string at = "m.json: modules[0].transformer.";
  CHECK(error(R"(, "router_groups": 4)")
            .find(at + "router_group_top_k: router_groups and router_group_top_k are given "
                       "together") != std::string::npos);
  CHECK(error(R"(, "router_groups": 3, "router_group_top_k": 1)")
            .find(at + "router_groups: 3 does not divide experts=16") != std::string::npos);
  CHECK(error(R"(, "router_groups": 4, "router_group_top_k": 5)")
            .find(at + "router_group_top_k: 5 is more than router_groups=4") != std::string::npos);
  CHECK(error(R"(, "router_groups": 8, "router_group_top_k": 1)")
            .find(at + "router_group_top_k: 1 groups of 2 experts hold fewer than top_k=4") !=
        std::string::npos);
}

TEST_CASE("DeepEP dispatches a token once to each other node; overlapped all-to-alls hide") {
  // Inside one node, or with one expert a token, nothing is shared.
  CHECK(node_deduplicated_share({1, 8}, {8}) == 1.0);
  CHECK(node_deduplicated_share({8, 8}, {1}) == 1.0);
  // Eight picks over 8 nodes reach 8 (1 - (7/8)^8) = 5.25 of them, 4.6 others, against 7 copies.
  CHECK(node_deduplicated_share({8, 8}, {8}) == doctest::Approx(1 - std::pow(7.0 / 8, 8)));
  CHECK(node_deduplicated_share({2, 8}, {8}) == doctest::Approx(2 * (1 - std::pow(0.5, 8)) / 8));
  // Node-limited routing (DeepSeek-V3's 8 groups, a token's best 4, each with a pick): a group a
  // node, so 4 nodes.
  CHECK(expected_nodes_reached({8, 8}, {8, 8, 4}) == doctest::Approx(4));
  CHECK(node_deduplicated_share({8, 8}, {8, 8, 4}) == doctest::Approx(0.5));
  // All groups allowed, or one group: no limit.
  CHECK(expected_nodes_reached({8, 8}, {8, 8, 8}) ==
        doctest::Approx(expected_nodes_reached({8, 8}, {8})));
  CHECK(expected_nodes_reached({8, 8}, {8, 1, 1}) ==
        doctest::Approx(expected_nodes_reached({8, 8}, {8})));
  // Two groups a node: the 4 best groups lie on 2 to 4 nodes, 8 (1 - C(14, 4) / C(16, 4)) of
  // them on average.
  CHECK(expected_nodes_reached({8, 8}, {8, 16, 4}) == doctest::Approx(8 * (1 - 1001.0 / 1820)));
  // With fewer picks than best groups, only as many groups get one.
  CHECK(expected_nodes_reached({8, 8}, {2, 8, 4}) == doctest::Approx(8 * (1 - 21.0 / 28)));
  // A group over two nodes: each of the best 2 groups' 4 picks over its 2 nodes.
  CHECK(expected_nodes_reached({8, 8}, {8, 4, 2}) ==
        doctest::Approx(2 * 2 * (1 - std::pow(0.5, 4))));

  // DeepSeek-V3 on 1,024 H100s: EP 64 over 8 nodes, top-8 from the best 4 of 8 groups (a group a
  // node); its row's plan, all-to-all dispatch.
  std::optional<Scenario> s = deepseek_v3_row();
  const auto routed = [](const Program& p) {  // the largest EP all-to-all of rank 0's MoE ops
    double bytes = 0;
    for (const Op& op : p.ranks[0])
      for (const NestedCollective& n : op.nested)
        if (n.purpose == Purpose::kEp) bytes = std::max(bytes, n.bytes);
    return bytes;
  };
  s->plan->moe_dispatcher = MoeDispatcher::kAllToAll;
  ParallelPlan deepep = *s->plan;
  deepep.moe_dispatcher = MoeDispatcher::kDeepEp;
  const Program plain = lowered(*s, *s->plan), dedup = lowered(*s, deepep);
  REQUIRE(routed(plain) > 0);
  CHECK(routed(dedup) == doctest::Approx(routed(plain) * 4 / 8));
  // Without the groups, a token's picks reach more nodes.
  Scenario free = *s;
  free.model.modules[0].transformer->router_groups = 0;
  free.model.modules[0].transformer->router_group_top_k = 0;
  CHECK(routed(lowered(free, deepep)) ==
        doctest::Approx(routed(plain) * (1 - std::pow(7.0 / 8, 8))));
  const double plain_step = estimate(*s, *s->plan, 0, CostParams{}).metrics.step_s;
  CHECK(estimate(*s, deepep, 0, CostParams{}).metrics.step_s < plain_step);

  // Overlapped, each MoE op's compute part loses up to its all-to-alls' time, but for the
  // forwards before a rank's first backward and the backwards after its last forward, which have
  // no partner to overlap with.
  ParallelPlan overlap = *s->plan;
  overlap.moe_a2a_overlap = true;
  const Program o = lowered(*s, overlap);
  const CostModel cost(s->cluster, s->model.dtype, CostParams{}, s->model);
  CostParams half_slower;
  half_slower.overlap_slowdown = 1.5;
  const CostModel slowed(s->cluster, s->model.dtype, half_slower, s->model);
  int flagged = 0, unpaired = 0;
  std::ptrdiff_t first_backward = -1, last_forward = -1;
  for (std::size_t i = 0; i < o.ranks[0].size(); ++i) {
    const Op& op = o.ranks[0][i];
    if (op.kind != OpKind::kCompute) continue;
    if (op.phase == Phase::kB && first_backward < 0)
      first_backward = static_cast<std::ptrdiff_t>(i);
    if (op.phase == Phase::kF) last_forward = static_cast<std::ptrdiff_t>(i);
  }
  for (std::size_t i = 0; i < o.ranks[0].size(); ++i) {
    const Op& op = o.ranks[0][i];
    const Op& before = plain.ranks[0][i];
    double ep = 0;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kEp)
        ep += n.count *
              cost.collective_s(n.kind, o.groups[static_cast<std::size_t>(n.group)], n.bytes);
    if (ep == 0) continue;
    const auto at = static_cast<std::ptrdiff_t>(i);
    if ((op.phase == Phase::kF && at < first_backward) ||
        (op.phase != Phase::kF && at > last_forward)) {
      ++unpaired;
      CHECK((op.flags & kOpEpCommOverlap) == 0);
      CHECK(cost.compute_only_s(o, op) == doctest::Approx(cost.compute_only_s(plain, before)));
      continue;
    }
    ++flagged;
    CHECK((op.flags & kOpEpCommOverlap) != 0);
    const double alone = cost.compute_only_s(plain, before);
    CHECK(cost.compute_only_s(o, op) == doctest::Approx(std::max(0.0, alone - ep)));
    // Compute slowed beside collectives (overlap_slowdown.hpp): the hidden seconds cost
    // (s - 1) of themselves back.
    const double hidden = std::min(alone, ep);
    CHECK(slowed.compute_only_s(o, op) == doctest::Approx(alone - hidden + 0.5 * hidden));
  }
  CHECK(flagged > 0);
  CHECK(unpaired > 0);  // interleaved 1F1B over 8 stages: a warm-up and a cool-down
  CHECK(estimate(*s, overlap, 0, CostParams{}).metrics.step_s < plain_step);
}

TEST_CASE("selective recomputation of MoE layers: the experts run again, and route again") {
  const Scenario s = moe_scenario();
  ParallelPlan base = with_ep(s, 2, 2);
  base.recompute = Recompute::kSelective;  // the attention core alone
  ParallelPlan act = base, whole = base;
  act.recompute_modules = kRecomputeMoeAct;
  whole.recompute_modules = kRecomputeMoe;
  const Program p0 = lowered(s, base), pa = lowered(s, act), pw = lowered(s, whole);
  const TransformerArch& a = llm_arch(s);
  const auto ep_calls = [](const Op& op) {
    int32_t n = 0;
    for (const NestedCollective& c : op.nested)
      if (c.purpose == Purpose::kEp) n += c.count;
    return n;
  };
  int checked = 0;
  REQUIRE(p0.ranks[0].size() == pw.ranks[0].size());
  for (std::size_t i = 0; i < p0.ranks[0].size(); ++i) {
    const Op& before = p0.ranks[0][i];
    const Op& op = pw.ranks[0][i];
    if (op.kind != OpKind::kCompute || op.layers == 0 ||
        pw.modules[static_cast<std::size_t>(op.module)] != "llm")
      continue;
    const int64_t moe = moe_layers(a, op.first_layer, op.first_layer + op.layers);
    REQUIRE(moe > 0);
    if (op.phase == Phase::kB) {
      ++checked;
      // The count exchange, dispatch, router weights and combine again, then the backward's
      // three.
      CHECK(ep_calls(before) == 3 * moe);
      CHECK(ep_calls(op) == 7 * moe);
      CHECK((op.flags & kOpMoeRecompute) != 0);
      CHECK(op.flops - before.flops ==
            doctest::Approx(
                static_cast<double>(moe) * 2.0 *
                static_cast<double>(selective_recomputed_matmul_parameters(a, kRecomputeMoe)) *
                static_cast<double>(op.tokens) / op.tp));
      // The activation alone runs nothing through the experts' matrices again.
      CHECK(pa.ranks[0][i].flops == doctest::Approx(before.flops));
    } else {
      CHECK(ep_calls(op) == ep_calls(before));
      CHECK(op.flops == doctest::Approx(before.flops));
    }
  }
  CHECK(checked > 0);
  const auto stash = [](const Program& p) {
    double bytes = 0;
    for (const Op& op : p.ranks[0]) bytes += op.stash_bytes;
    return bytes;
  };
  CHECK(stash(pa) < stash(p0));
  CHECK(stash(pw) < stash(pa));
  // The experts' matrices and all-to-alls again make the step longer.
  CHECK(estimate(s, whole, 0, CostParams{}).metrics.step_s >
        estimate(s, base, 0, CostParams{}).metrics.step_s);
}

TEST_CASE("expert TP 1: whole experts on each TP rank, the rank's own tokens through them") {
  Scenario s = moe_scenario();
  s.model.modules.back().transformer->shared_expert_ffn = 0;  // no shared expert to gather for
  const TransformerArch& a = llm_arch(s);
  ParallelPlan split = with_ep(s, 2, 2);
  split.layout.tp = 2;
  split.sequence_parallel = true;
  ParallelPlan whole = split;
  whole.layout.etp = 1;
  // EP 2 out of tp*dp = 4 would also do for expert TP 1; the same EP keeps the comparison.
  const Program ps = lowered(s, split), pw = lowered(s, whole);
  // Each rank holds its experts whole: twice the routed experts' weights of expert TP 2.
  const double experts = static_cast<double>(a.layers) * expert_layer_parameters(a, 1, 2);
  CHECK(pw.memory[0].weight_bytes - ps.memory[0].weight_bytes ==
        doctest::Approx(experts / 2 * 4));  // fp32
  // The LLM's compute ops of rank 0, in order (expert TP 1 adds a reduction of the experts,
  // whose replicas are now two).
  const auto llm_ops = [](const Program& p) {
    std::vector<Op> ops;
    for (const Op& op : p.ranks[0])
      if (op.kind == OpKind::kCompute && op.layers > 0 &&
          p.modules[static_cast<std::size_t>(op.module)] == "llm")
        ops.push_back(op);
    return ops;
  };
  const std::vector<Op> split_ops = llm_ops(ps), whole_ops = llm_ops(pw);
  REQUIRE(split_ops.size() == whole_ops.size());
  int checked = 0;
  for (std::size_t i = 0; i < whole_ops.size(); ++i) {
    const Op& op = whole_ops[i];
    const Op& before = split_ops[i];
    ++checked;
    CHECK((op.flags & kOpExpertsWhole) != 0);
    CHECK((before.flags & kOpExpertsWhole) == 0);
    // The same work, dealt by tokens instead of by matrix columns.
    CHECK(op.flops == doctest::Approx(before.flops));
    // The MLP's all-gather and reduce-scatter over TP are gone from each MoE layer (and the
    // backward's second gather of the MLP's input).
    const auto tp_calls = [&](const Op& o, CollectiveKind kind) {
      int32_t n = 0;
      for (const NestedCollective& c : o.nested)
        if (c.purpose == Purpose::kTp && c.kind == kind) n += c.count;
      return n;
    };
    if (op.phase == Phase::kW) continue;
    const int64_t moe = moe_layers(a, op.first_layer, op.first_layer + op.layers);
    for (const CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter})
      CHECK(tp_calls(before, kind) - tp_calls(op, kind) ==
            moe * (op.phase == Phase::kB && kind == CollectiveKind::kAllGather ? 2 : 1));
  }
  CHECK(checked > 0);
  // Its routed experts' gradients reduce over the replicas of one expert shard: tp*dp/ep = 2.
  int reductions = 0;
  for (const Op& op : pw.ranks[0])
    if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp &&
        (op.flags & kOpRoutedExperts) != 0) {
      ++reductions;
      CHECK(pw.groups[static_cast<std::size_t>(op.group)] == RankList{0, 2});
    }
  CHECK(reductions == 1);
  CHECK(estimate(s, whole, 0, CostParams{}).metrics.step_s > 0);

  // Expert TP is 1 or TP, needs sequence parallelism below TP, and experts.
  const auto problems = [&](const ParallelPlan& p, const ModelSpec& model) {
    Diagnostics diag;
    validate_plan(p, model, s.workload, s.cluster, "s.json", "plan", diag);
    return diag.format();
  };
  CHECK(problems(whole, s.model).empty());
  ParallelPlan bad = whole;
  bad.sequence_parallel = false;
  CHECK(problems(bad, s.model).find("plan.layout.etp: etp 1 below tp=2 needs sequence_parallel") !=
        std::string::npos);
  bad = whole;
  bad.layout.tp = 4;
  bad.layout.etp = 2;
  CHECK(problems(bad, s.model).find("plan.layout.etp: expert tensor parallelism is 1 or tp=4") !=
        std::string::npos);
  ModelSpec dense = s.model;
  dense.modules.back().transformer->experts = 0;
  ParallelPlan no_experts = whole;
  no_experts.layout.ep = 1;
  CHECK(problems(no_experts, dense).find("plan.layout.etp: etp=1 but llm has no experts") !=
        std::string::npos);
  // Written back and read again; exported as Megatron-LM's expert_tensor_parallel_size.
  Diagnostics diag;
  CHECK(read_plan(to_json(whole), "", "", diag) == whole);
  CHECK(to_json(whole)["layout"]["etp"] == 1);
  CHECK(!to_json(split)["layout"].contains("etp"));
}

TEST_CASE("FP8 dispatch: the tokens to their experts in FP8, the combines in 16 bits") {
  const std::optional<Scenario> s = deepseek_v3_row();
  Diagnostics diag;
  ParallelPlan fp8 = *s->plan;
  fp8.fp8 = Fp8Recipe::kCurrent;
  ParallelPlan fp8_dispatch = fp8;
  fp8_dispatch.moe_fp8_dispatch = true;
  const Program plain = lowered(*s, fp8), quantized = lowered(*s, fp8_dispatch);
  int checked = 0;
  for (std::size_t i = 0; i < plain.ranks[0].size(); ++i) {
    std::vector<double> before, after;  // bytes of the routed all-to-alls, in order
    for (const NestedCollective& n : plain.ranks[0][i].nested)
      if (n.purpose == Purpose::kEp && n.bytes > 8.0 * 256) before.push_back(n.bytes);
    for (const NestedCollective& n : quantized.ranks[0][i].nested)
      if (n.purpose == Purpose::kEp && n.bytes > 8.0 * 256) after.push_back(n.bytes);
    REQUIRE(before.size() == after.size());
    if (before.empty()) continue;
    ++checked;
    // Per pass: to the experts, then back.
    REQUIRE(after.size() == 2);
    CHECK(after[0] == doctest::Approx(before[0] / 2 * (1 + 4.0 / 128)));
    CHECK(after[1] == doctest::Approx(before[1]));
  }
  CHECK(checked > 0);
  CHECK(estimate(*s, fp8_dispatch, 0, CostParams{}).metrics.step_s <
        estimate(*s, fp8, 0, CostParams{}).metrics.step_s);
  // Only with FP8 GEMMs.
  ParallelPlan bad = *s->plan;
  bad.moe_fp8_dispatch = true;
  Diagnostics v;
  validate_plan(bad, s->model, s->workload, s->cluster, "s.json", "plan", v);
  CHECK(v.format().find("plan.moe_fp8_dispatch: needs fp8") != std::string::npos);
  CHECK(read_plan(to_json(fp8_dispatch), "", "", diag) == fp8_dispatch);
}

TEST_CASE("HybridEP all-gathers the routing maps; the all-to-all dispatcher sends the weights") {
  const std::optional<Scenario> s = deepseek_v3_row();
  REQUIRE(s.has_value());
  ParallelPlan alltoall = *s->plan, deepep = *s->plan, hybridep = *s->plan;
  alltoall.moe_dispatcher = MoeDispatcher::kAllToAll;
  deepep.moe_dispatcher = MoeDispatcher::kDeepEp;
  hybridep.moe_dispatcher = MoeDispatcher::kHybridEp;
  const Program a = lowered(*s, alltoall), d = lowered(*s, deepep), h = lowered(*s, hybridep);
  const TransformerArch& arch = *s->model.modules[0].transformer;
  const auto ep = [](const Op& op, CollectiveKind kind) {
    std::vector<NestedCollective> out;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kEp && n.kind == kind) out.push_back(n);
    return out;
  };
  int checked = 0;
  REQUIRE(d.ranks[0].size() == h.ranks[0].size());
  for (std::size_t i = 0; i < d.ranks[0].size(); ++i) {
    const Op& dop = d.ranks[0][i];
    const Op& hop = h.ranks[0][i];
    const std::vector<NestedCollective> moved = ep(dop, CollectiveKind::kAllToAll);
    if (dop.kind != OpKind::kCompute || moved.empty()) continue;
    ++checked;
    CHECK((hop.flags & kOpHybridEpDispatch) != 0);
    CHECK((hop.flags & kOpDeepEpDispatch) != 0);
    CHECK((dop.flags & kOpHybridEpDispatch) == 0);
    const std::vector<NestedCollective> hmoved = ep(hop, CollectiveKind::kAllToAll);
    const std::vector<NestedCollective> maps = ep(hop, CollectiveKind::kAllGather);
    // A forward routes; so does a backward that recomputes its MoE layers first.
    const bool routes = dop.phase == Phase::kF || (dop.flags & kOpMoeRecompute) != 0;
    if (!routes) {
      CHECK(maps.empty());
      CHECK(hmoved.size() == moved.size());
    } else {
      // DeepEP's forward: the counts, the dispatch, the combine. HybridEP's: the routing map
      // (a byte per token and expert, each TP rank its own tokens under sequence parallelism)
      // over NCCL in place of the counts, then the same transfers at HybridEP's own rate.
      if (dop.phase == Phase::kF) REQUIRE(moved.size() == 3);
      REQUIRE(hmoved.size() == moved.size() - 1);
      REQUIRE(maps.size() == 1);
      const double tp = s->plan->sequence_parallel ? static_cast<double>(hop.tp) : 1.0;
      CHECK(maps[0].bytes == doctest::Approx(static_cast<double>(hop.tokens) / tp *
                                             static_cast<double>(arch.experts)));
      CHECK(maps[0].transport == Transport::kNccl);
      CHECK(maps[0].count == moved[0].count);
      for (std::size_t n = 0; n < hmoved.size(); ++n) {
        CHECK(hmoved[n].bytes == doctest::Approx(moved[n + 1].bytes));
        CHECK(hmoved[n].transport == Transport::kHybridEp);
      }
    }
    // The all-to-all dispatcher sends a router weight (16-bit) beside each routed copy, in an
    // all-to-all of its own after the combine's; DeepEP and HybridEP carry them with the tokens.
    const std::vector<NestedCollective> plain = ep(a.ranks[0][i], CollectiveKind::kAllToAll);
    REQUIRE(plain.size() == moved.size() + 1);
    CHECK(plain.back().bytes ==
          doctest::Approx(plain[plain.size() - 2].bytes / static_cast<double>(arch.hidden)));
  }
  CHECK(checked > 0);
  // Read, written back and exported as Megatron-LM's flex dispatcher with its HybridEP backend.
  Diagnostics diag;
  CHECK(read_plan(to_json(hybridep), "", "", diag) == hybridep);
  CHECK(to_json(hybridep)["moe_dispatcher"] == "hybridep");
  const MegatronExport e = megatron_export(*s, hybridep);
  REQUIRE(e.refusal.empty());
  CHECK(e.config["transformer_config"]["moe_token_dispatcher_type"] == "flex");
  CHECK(e.config["transformer_config"]["moe_flex_dispatcher_backend"] == "hybridep");
  const auto flag = [](const MegatronExport& x, const std::string& name) {
    for (const auto& [f, value] : x.arguments)
      if (f == name) return value;
    return std::string("(absent)");
  };
  CHECK(flag(e, "--moe-flex-dispatcher-backend") == "hybridep");
  CHECK(flag(e, "--moe-permute-fusion").empty());  // a switch
  ParallelPlan unfused = hybridep;
  unfused.moe_permute_fusion = false;
  const MegatronExport u = megatron_export(*s, unfused);
  CHECK(flag(u, "--moe-permute-fusion") == "(absent)");
  CHECK(u.config["transformer_config"]["moe_permute_fusion"] == false);
  CHECK(read_plan(to_json(unfused), "", "", diag) == unfused);
  CHECK(to_json(unfused)["moe_permute_fusion"] == false);
}

// Plan search and tessera sweep.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include <unistd.h>

#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/memory_bound.hpp"
#include "shared/search/plan_search.hpp"
#include "shared/search/stage_split.hpp"
#include "sim/sweep.hpp"
#include "sim/sweep_families.hpp"
#include "sim/sweep_plan.hpp"

using namespace tessera;
using namespace tessera::sim;
namespace fs = std::filesystem;

namespace {

Scenario tiny(const char* search) {
  const std::string text = std::string(R"({"name": "tiny-sweep",
    "model": {"name": "vlm", "modules": [
      {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
       "transformer": {"layers": 2, "hidden": 128, "heads": 4, "ffn": 512, "linear_bias": true, "norm": "layernorm"},
       "patching": {"patch_size": 8, "resize": "fixed", "image_size": 64}},
      {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 128, "out": 256}},
      {"name": "llm", "role": "llm", "inputs": ["proj"],
       "transformer": {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "ffn": 688, "gated_ffn": true, "vocab": 1000}}]},
    "workload": {"global_batch": 8, "max_seq_len": 512, "seed": 3, "samples": {
      "text_tokens": {"dist": "uniform", "min": 16, "max": 200}, "image": {"count": {"dist": "choice", "values": [0, 1, 2]}, "width": 64, "height": 64}}},
    "cluster": {"name": "c4", "nodes": 1, "devices_per_node": 4,
      "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": 8e10, "memory_bandwidth_bytes_per_s": 2e12},
      "intra_node": {"bandwidth_bytes_per_s": 2e11, "latency_s": 2e-6}},
    "search": )") + search +
                           "}";
  Diagnostics diag;
  auto s = read_scenario(Json::parse(text), "tiny.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return *s;
}

const auto quiet = [](const std::string&, const std::string&, std::size_t, std::size_t,
                      const std::string&, bool) {};

fs::path scratch(const char* name) {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-sweep-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  return dir;
}

std::vector<std::pair<std::string, double>> keys_and_steps(const SweepResult& r) {
  std::vector<std::pair<std::string, double>> out;
  for (const SweepRow& row : r.rows) out.emplace_back(row.key, row.step_s);
  return out;
}

}  // namespace

TEST_CASE(
    "enumeration of a small case equals the brute-force list, and every emitted plan validates") {
  const Scenario s =
      tiny(R"({"placements": ["homogeneous"], "tp": [1, 2, 4], "cp": [1], "pp": [1, 2], "vpp": [1],
                               "micro_batch_sizes": [1, 2], "recompute": ["none", "full"]})");
  const Enumeration e = enumerate_plans(s, *s.search, 4);
  // Brute force: every (tp, pp, mbs, recompute) whose tp*pp divides 4, dp = 4 / (tp*pp); a
  // pipeline once per stage split.
  int64_t expected = 0;
  std::set<std::tuple<int64_t, int64_t, int64_t, Recompute, StageSplit>> grids;
  for (int64_t tp : {1, 2, 4})
    for (int64_t pp : {1, 2})
      for (int64_t mbs : {1, 2})
        for (Recompute r : {Recompute::kNone, Recompute::kFull})
          for (StageSplit split : {StageSplit::kFrozenAware, StageSplit::kUniform})
            if (4 % (tp * pp) == 0 && (pp > 1 || split == StageSplit::kUniform)) {
              ++expected;
              grids.emplace(tp, pp, mbs, r, split);
            }
  CHECK(e.considered == expected);
  int64_t rejected = 0;
  for (const auto& [reason, count] : e.rejected) rejected += count;
  CHECK(static_cast<int64_t>(e.valid.size()) + rejected == expected);
  for (const Candidate& c : e.valid) {
    CHECK(grids.contains({c.plan.layout.tp, c.plan.layout.pp, c.plan.micro_batch_size,
                          c.plan.recompute, c.plan.stage_split}));
    // A frozen-aware plan carries its stage boundaries.
    CHECK((c.plan.stage_split == StageSplit::kFrozenAware) == !c.plan.layout.stage_layers.empty());
    Diagnostics diag;
    validate_plan(c.plan, s.model, s.workload, cluster_with_devices(s.cluster, 4), "", "", diag);
    CHECK(diag.ok());
  }
  // Every family appears when asked for.
  const Scenario all =
      tiny(R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1]})");
  std::set<Placement> families;
  for (const Candidate& c : enumerate_plans(all, *all.search, 4).valid)
    families.insert(c.plan.placement);
  CHECK(families.size() == 3);

  // encoder_pp pipelines the encoder over stages of its own in non-colocated plans.
  const Scenario staged = tiny(R"({"placements": ["non_colocated"], "tp": [1], "cp": [1],
                                   "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1],
                                   "encoder_pp": [1, 2]})");
  std::set<int64_t> encoder_stages;
  for (const Candidate& c : enumerate_plans(staged, *staged.search, 4).valid)
    encoder_stages.insert(c.plan.modules.front().second.pp);
  CHECK(encoder_stages == std::set<int64_t>{1, 2});

  // An encoder work share (Entrain's static layout) adds that share of the devices: 6 of 8
  // (the fractions 1/8, 1/4, 1/2 give 1, 2 and 4).
  Scenario shared = staged;
  shared.workload.global_batch = 24;
  auto vision_spans = [&](double share) {
    std::set<int64_t> spans;
    for (const Candidate& c : enumerate_plans(shared, *shared.search, 8, nullptr, share).valid)
      spans.insert(c.plan.modules.front().second.size());
    return spans;
  };
  CHECK(vision_spans(0) == std::set<int64_t>{2, 4});  // 1 leaves the LLM 7: no valid grid
  CHECK(vision_spans(0.75) == std::set<int64_t>{2, 4, 6});
}

TEST_CASE("sequence_parallel and distributed_optimizer are search keys; sp only where tp > 1") {
  const Scenario s = tiny(R"({"placements": ["homogeneous"], "tp": [1, 2], "cp": [1], "pp": [1],
                              "vpp": [1], "micro_batch_sizes": [1], "recompute": ["none"],
                              "sequence_parallel": [false, true],
                              "distributed_optimizer": [false, true]})");
  std::set<std::tuple<int64_t, bool, bool>> seen;
  for (const Candidate& c : enumerate_plans(s, *s.search, 4).valid)
    seen.emplace(c.plan.layout.tp, c.plan.sequence_parallel, c.plan.distributed_optimizer);
  CHECK(seen == std::set<std::tuple<int64_t, bool, bool>>{{1, false, false},
                                                          {1, false, true},
                                                          {2, false, false},
                                                          {2, false, true},
                                                          {2, true, false},
                                                          {2, true, true}});
  // The sweep table names them, and an expert dispatch other than the default.
  ParallelPlan last = enumerate_plans(s, *s.search, 4).valid.back().plan;
  CHECK(describe_layout(last, s.model).find("sp dopt") != std::string::npos);
  CHECK(describe_layout(last, s.model).find("deepep") == std::string::npos);
  last.moe_dispatcher = MoeDispatcher::kDeepEp;
  last.moe_a2a_overlap = true;
  CHECK(describe_layout(last, s.model).find("sp dopt deepep a2a:overlap") != std::string::npos);
  Diagnostics diag;
  read_search_space(Json::parse(R"({"sequence_parallel": [1]})"), "s.json", "search", diag);
  CHECK(diag.format().find("s.json: search.sequence_parallel: expected a non-empty array of true "
                           "and false") != std::string::npos);
  // The second stage's keys, read back as written.
  Diagnostics refine_diag;
  const SearchSpace refine = read_search_space(
      Json::parse(
          R"({"refine": {"top": 4, "microbatching": ["entrain"], "dip": false, "cp_splits": []}})"),
      "s.json", "search", refine_diag);
  CHECK(refine_diag.ok());
  CHECK(refine.refine.top == 4);
  CHECK(refine.refine.microbatching == std::vector<MicrobatchPolicy>{MicrobatchPolicy::kEntrain});
  CHECK_FALSE(refine.refine.dip);
  CHECK(refine.refine.cp_splits.empty());
  Diagnostics round_trip;
  CHECK(read_search_space(to_json(refine), "", "", round_trip) == refine);
  read_search_space(Json::parse(R"({"refine": {"top": -1, "depth": 2}})"), "s.json", "search",
                    refine_diag);
  CHECK(refine_diag.format().find("s.json: search.refine.top: must be >= 0") != std::string::npos);
  CHECK(refine_diag.format().find("search.refine.depth") != std::string::npos);
}

TEST_CASE("planning a sweep forks nothing: the top K of each GPU count, and what run_sweep runs") {
  const Scenario s = tiny(
      R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1], "top_k": 3, "gpus": [2, 4]})");
  SweepOptions options;
  options.out_dir = scratch("plan").string();
  SweepResult planned;
  const std::vector<ChosenPlan> chosen = plan_sweep(s, options, planned);
  CHECK_FALSE(fs::exists(options.out_dir));  // nothing written
  CHECK(planned.top_k == 3);
  CHECK(planned.ranked > 0);
  // Every estimate: the first stage's and the second stage's variants that fit.
  CHECK(planned.refined > 0);
  CHECK(static_cast<int64_t>(planned.estimated.size()) ==
        planned.ranked + planned.refined - planned.refined_rejected);
  // Per GPU count, the first three chosen are the three best estimates (then the stage-split
  // twins of chosen frozen-aware plans).
  std::map<int64_t, std::vector<double>> chosen_rates;  // gpus -> tokens/s, in chosen order
  std::set<std::string> keys;
  for (const ChosenPlan& c : chosen) {
    CHECK(keys.insert(c.ranked.candidate.key).second);  // no plan twice
    chosen_rates[c.ranked.candidate.gpus].push_back(c.ranked.estimate.metrics.tokens_per_s);
  }
  REQUIRE(chosen_rates.size() == 2);
  for (const auto& [gpus, rates] : chosen_rates) {
    INFO(gpus << " GPUs");
    REQUIRE(rates.size() >= 3);
    std::vector<double> all;
    for (const EstimatedPlan& e : planned.estimated)
      if (e.gpus == gpus) all.push_back(e.tokens_per_s);
    std::sort(all.rbegin(), all.rend());
    REQUIRE(all.size() > 3);
    std::vector<double> first(rates.begin(), rates.begin() + 3);
    std::sort(first.rbegin(), first.rend());
    CHECK(first == std::vector<double>(all.begin(), all.begin() + 3));
  }
  // run_sweep simulates exactly these plans.
  const SweepResult ran = run_sweep(s, options, quiet);
  std::set<std::string> simulated;
  for (const SweepRow& row : ran.rows) simulated.insert(row.key);
  CHECK(simulated == keys);
  CHECK(ran.considered == planned.considered);
  CHECK(ran.ranked == planned.ranked);
  fs::remove_all(options.out_dir);
}

TEST_CASE(
    "the second stage refines the best plans with Entrain, sorting and DIP; every family's "
    "best is simulated") {
  const Scenario s = tiny(
      R"({"tp": [1, 2], "cp": [1], "pp": [2], "vpp": [1], "micro_batch_sizes": [1], "top_k": 2,
          "gpus": [4], "refine": {"top": 2}})");
  SweepOptions options;
  options.out_dir = scratch("refine").string();
  SweepResult planned;
  const std::vector<ChosenPlan> chosen = plan_sweep(s, options, planned);
  // Two bases and every family's best (three families here), each with its variants.
  CHECK(planned.refined_bases >= 3);
  std::set<std::string> techniques;
  for (const TechniqueGain& g : planned.technique_gains) {
    techniques.insert(g.technique);
    CHECK(g.base_s > 0);
    CHECK(g.variant_s > 0);
    if (g.technique.starts_with("dip")) {  // only pipelined homogeneous plans get DIP
      CHECK(g.base.placement == Placement::kHomogeneous);
      CHECK(g.base.layout.pp > 1);
    }
  }
  CHECK(techniques.count("sorted") == 1);
  CHECK(techniques.count("entrain") == 1);
  CHECK(techniques.count("dip") == 1);
  // The chosen plans: the best two, and the best of each family however low it ranks.
  std::set<Placement> estimated_families, chosen_families;
  for (const EstimatedPlan& e : planned.estimated) estimated_families.insert(e.placement);
  for (const ChosenPlan& c : chosen) chosen_families.insert(c.ranked.candidate.plan.placement);
  CHECK(estimated_families.size() == 3);
  CHECK(chosen_families == estimated_families);
  // No second stage: nothing refined, and no variant among the chosen.
  options.refine_top = 0;
  SweepResult first_only;
  const std::vector<ChosenPlan> plain = plan_sweep(s, options, first_only);
  CHECK(first_only.refined == 0);
  CHECK(first_only.technique_gains.empty());
  for (const ChosenPlan& c : plain) {
    CHECK(c.ranked.candidate.plan.microbatching == MicrobatchPolicy::kArrival);
    CHECK(c.ranked.candidate.plan.schedule != Schedule::kDip);
  }
  // A frozen-aware split that comes out even is the uniform plan: counted once.
  CHECK(first_only.rejected.count("same as its uniform split") == 1);
}

TEST_CASE("sweep: -j 1 and -j 2 agree; a resumed sweep equals an uninterrupted one") {
  const Scenario s = tiny(
      R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1], "top_k": 4})");
  SweepOptions options;
  options.jobs = 1;
  options.out_dir = scratch("j1").string();
  const SweepResult one = run_sweep(s, options, quiet);
  options.jobs = 2;
  options.out_dir = scratch("j2").string();
  const SweepResult two = run_sweep(s, options, quiet);
  // The best 4, and the stage-split twin of a chosen frozen-aware plan beside it.
  REQUIRE(one.rows.size() >= 4);
  CHECK(keys_and_steps(one) == keys_and_steps(two));
  for (const SweepRow& row : one.rows) {
    CHECK(row.ok);
    // Idle time is a share of the step: the step less what the busiest rank computes at least.
    CHECK(row.idle_share >= 0);
    CHECK(row.idle_share < 1);
    CHECK(row.idle_share == doctest::Approx(1 - row.compute_s / row.step_s).epsilon(1e-6));
  }
  // The report draws each family's best, one step op by op, from the evaluator's times.
  REQUIRE_FALSE(one.pictures.empty());
  for (const auto& [key, picture] : one.pictures) {
    INFO(key);
    CHECK(picture.error.empty());
    CHECK_FALSE(picture.lanes.empty());
  }
  {
    std::ifstream report(fs::path(one.out_dir) / "report.html");
    const std::string html((std::istreambuf_iterator<char>(report)),
                           std::istreambuf_iterator<char>());
    CHECK(html.find("One step, op by op") != std::string::npos);
    CHECK(html.find("<rect class='op'") != std::string::npos);
    // The plan table says what results.jsonl holds, row by row, to the digits it prints; its
    // percentages are shares, at most 100.
    const std::vector<SweepRow> stored =
        load_sweep_rows((fs::path(one.out_dir) / "results.jsonl").string());
    const std::string table = html.substr(html.find("<h2>Simulated plans</h2>"));
    const std::regex row_re("<tr><td>([0-9]+)</td>(.*?)</tr>");
    const std::regex cell_re("<td[^>]*>([^<]*)</td>");
    std::size_t seen = 0;
    for (auto it = std::sregex_iterator(table.begin(), table.end(), row_re);
         it != std::sregex_iterator(); ++it) {
      const std::size_t index = std::stoul((*it)[1].str()) - 1;
      REQUIRE(index < stored.size());
      const SweepRow& want = stored[index];
      const std::string cells_text = (*it)[2].str();
      std::vector<std::string> cells;
      for (auto c = std::sregex_iterator(cells_text.begin(), cells_text.end(), cell_re);
           c != std::sregex_iterator(); ++c)
        cells.push_back((*c)[1].str());
      INFO("row " << index + 1 << ": " << cells_text);
      REQUIRE(want.ok);
      REQUIRE(cells.size() == 16);
      CHECK(std::stod(cells[10]) == doctest::Approx(want.step_s).epsilon(5e-4));
      CHECK(std::stod(cells[11]) == doctest::Approx(want.tokens_per_s).epsilon(5e-4));
      CHECK(std::stod(cells[13]) == doctest::Approx(100 * want.mfu).epsilon(0.01));
      const double idle = std::stod(cells[15]);
      CHECK(idle == doctest::Approx(100 * want.idle_share).epsilon(0.01));
      CHECK(idle <= 100);
      CHECK(cells[13].ends_with("%"));
      CHECK(cells[15].ends_with("%"));
      ++seen;
    }
    CHECK(seen == stored.size());
  }
  // A results file written when rows kept idle over busy time (1.0: idle half the step).
  {
    SweepRow old;
    Json j = row_to_json(one.rows.front());
    j.erase("idle_share");
    j["bubble"] = 1.0;
    REQUIRE(row_from_json(j, old));
    CHECK(old.idle_share == doctest::Approx(0.5));
  }

  // Interrupted: two finished rows and half of a third line remain.
  const fs::path dir = scratch("resume");
  fs::create_directories(dir);
  {
    std::ifstream in(fs::path(one.out_dir) / "results.jsonl");
    std::ofstream out(dir / "results.jsonl");
    std::string line;
    for (int i = 0; i < 2 && std::getline(in, line); ++i) out << line << "\n";
    std::getline(in, line);
    out << line.substr(0, line.size() / 2);
  }
  options.out_dir = dir.string();
  options.resume = true;
  const SweepResult resumed = run_sweep(s, options, quiet);
  CHECK(keys_and_steps(resumed) == keys_and_steps(one));
  // No row is lost or duplicated in the file either.
  std::ifstream in(dir / "results.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) ++lines;
  CHECK(lines == static_cast<int>(one.rows.size()));
  for (const char* name : {"j1", "j2", "resume"}) fs::remove_all(scratch(name));
}

TEST_CASE("sweep: a failing simulation yields a failed row and the sweep completes") {
  const Scenario s = tiny(
      R"({"placements": ["homogeneous"], "tp": [1, 2], "cp": [1], "pp": [1], "vpp": [1], "micro_batch_sizes": [1], "top_k": 2})");
  SweepOptions options;
  options.out_dir = scratch("fail").string();
  options.timeout_s = 1e-9;  // every simulated iteration overruns its limit
  const SweepResult r = run_sweep(s, options, quiet);
  REQUIRE(r.rows.size() == 2);
  for (const SweepRow& row : r.rows) {
    CHECK_FALSE(row.ok);
    CHECK(row.failure.find("timed out") != std::string::npos);
  }
  CHECK(fs::exists(fs::path(options.out_dir) / "results.csv"));
  fs::remove_all(options.out_dir);
}

TEST_CASE("sweep shards merge into exactly the unsharded ranking") {
  const Scenario s = tiny(
      R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1, 2], "top_k": 3})");
  SweepOptions options;
  options.out_dir = scratch("whole").string();
  options.scenario_file = "unused";
  options.refine_top = 0;  // a shard has no second stage: it needs the whole first ranking
  const SweepResult whole = run_sweep(s, options, quiet);
  std::vector<std::string> dirs;
  for (int64_t i = 1; i <= 3; ++i) {
    SweepOptions shard = options;
    shard.shard_index = i;
    shard.shard_count = 3;
    shard.out_dir = scratch(("shard" + std::to_string(i)).c_str()).string();
    // merge reloads the scenario from the path a shard records: write one.
    shard.scenario_file =
        (fs::path(shard.out_dir).parent_path() / ("tiny-" + std::to_string(::getpid()) + ".json"))
            .string();
    std::ofstream(shard.scenario_file) << inline_scenario_json(s).dump();
    run_sweep(s, shard, quiet);
    dirs.push_back(shard.out_dir);
  }
  SweepResult merged;
  std::optional<Scenario> reloaded;
  const std::string problem = merge_sweeps(dirs, scratch("merged").string(), merged, reloaded);
  INFO(problem);
  REQUIRE(problem.empty());
  CHECK(keys_and_steps(merged) == keys_and_steps(whole));
  CHECK(merged.considered == whole.considered);
  CHECK(merged.valid == whole.valid);
  CHECK(merged.rejected == whole.rejected);
  for (const char* name : {"whole", "shard1", "shard2", "shard3", "merged"})
    fs::remove_all(scratch(name));
}

TEST_CASE("the parameter-state floor never exceeds what the lowered Program holds, every family") {
  const Scenario s =
      tiny(R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1],
              "distributed_optimizer": [false, true], "fully_sharded": [false, true]})");
  int checked = 0;
  for (const Candidate& c : enumerate_plans(s, *s.search, 4).valid) {
    INFO(c.key);
    const ParallelPlan plan = resolve_stage_split(c.plan, s.model, s.workload, s.cluster);
    Scenario sized = s;
    sized.cluster = cluster_with_devices(s.cluster, c.gpus);
    const Lowered lowered =
        lower(s.model, sized.cluster, plan, s.workload, draw_batch(s.workload, 0));
    REQUIRE(lowered.error.empty());
    double busiest = 0;
    for (const RankMemory& m : lowered.program.memory)
      busiest = std::max(busiest, m.weight_bytes + m.gradient_bytes + m.optimizer_bytes);
    CHECK(mean_parameter_memory(plan, s.model).total() <= busiest * (1 + 1e-12));
    ++checked;
  }
  CHECK(checked > 20);
  // One rank per replica with the whole model: the floor is every rank's state exactly.
  const Candidate* whole = nullptr;
  const Enumeration e = enumerate_plans(s, *s.search, 4);
  for (const Candidate& c : e.valid)
    if (c.plan.placement == Placement::kHomogeneous && c.plan.layout.dp == 4 &&
        !c.plan.fully_sharded)
      whole = &c;
  REQUIRE(whole != nullptr);
  const Lowered lowered =
      lower(s.model, s.cluster, whole->plan, s.workload, draw_batch(s.workload, 0));
  const RankMemory& m = lowered.program.memory[0];
  CHECK(mean_parameter_memory(whole->plan, s.model).total() ==
        doctest::Approx(m.weight_bytes + m.gradient_bytes + m.optimizer_bytes).epsilon(1e-12));
}

TEST_CASE("plans dropped by the parameter-state floor are exactly those the estimate rejects") {
  Scenario s = tiny(R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1], "micro_batch_sizes": [1],
              "distributed_optimizer": [false, true]})");
  // A device just large enough for some plans' parameter state and not for others'.
  s.cluster.device.memory_bytes = 2.2e7;
  const std::vector<Candidate> valid = enumerate_plans(s, *s.search, 4).valid;
  std::map<std::string, int64_t> rejected;
  const std::vector<RankedCandidate> ranked = rank_candidates(s, valid, 0, rejected, 2);
  std::set<std::string> kept;
  for (const RankedCandidate& r : ranked) kept.insert(r.candidate.key);
  // The full estimate of every candidate, floor or not.
  std::set<std::string> fit;
  int64_t floored = 0;
  for (const Candidate& c : valid) {
    Scenario sized = s;
    sized.cluster = cluster_with_devices(s.cluster, c.gpus);
    const Estimate e = estimate(sized, c.plan, 0, default_cost_params(sized.cluster));
    if (e.feasible) fit.insert(c.key);
    if (mean_parameter_memory(c.plan, s.model).total() > e.capacity_bytes) {
      ++floored;
      CHECK_FALSE(e.feasible);
    }
  }
  CHECK(kept == fit);
  CHECK(rejected["memory"] == static_cast<int64_t>(valid.size() - fit.size()));
  CHECK(floored > 0);  // the floor dropped some
  CHECK(floored <= static_cast<int64_t>(valid.size() - fit.size()));
  CHECK_FALSE(fit.empty());
}

TEST_CASE("where a step goes: the five parts add up to the step; the largest growth names why") {
  SweepRow even;
  even.ok = true;
  even.plan.placement = Placement::kColocated;
  even.step_s = 1.0;
  even.compute_s = 0.7;
  even.compute_max_s = 0.72;
  even.exposed_comm_s = 0.1;
  even.exposed_boundary_s = 0.04;
  const StepParts e = step_parts(even);
  CHECK(e.compute_s == doctest::Approx(0.7));
  CHECK(e.imbalance_s == doctest::Approx(0.02));
  CHECK(e.bubble_s == doctest::Approx(0.18));
  CHECK(e.comm_s == doctest::Approx(0.06));
  CHECK(e.boundary_s == doctest::Approx(0.04));
  CHECK(e.compute_s + e.imbalance_s + e.bubble_s + e.comm_s + e.boundary_s ==
        doctest::Approx(even.step_s));

  // The same mean work, but one rank computes far longer: the others wait on it.
  SweepRow skewed = even;
  skewed.plan.placement = Placement::kHomogeneous;
  skewed.step_s = 1.2;
  skewed.compute_max_s = 1.0;
  const StepParts k = step_parts(skewed);
  CHECK(k.imbalance_s == doctest::Approx(0.3));
  CHECK(k.bubble_s == doctest::Approx(0.1));
  CHECK(why_faster(even, skewed)
            .find("ranks wait 0.28 s longer per step for their busiest one "
                  "(0.3 s vs 0.02 s") != std::string::npos);

  // More exposed boundary traffic, nothing else: the boundary is named.
  SweepRow boundary = even;
  boundary.plan.placement = Placement::kNonColocated;
  boundary.step_s = 1.1;
  boundary.exposed_comm_s = 0.2;
  boundary.exposed_boundary_s = 0.14;
  CHECK(why_faster(even, boundary).find("module-boundary transfer") != std::string::npos);

  // A row written before the busiest rank was recorded: its idle time is all bubble and waits,
  // and never more than the step leaves.
  SweepRow old = even;
  old.compute_max_s = 0;
  CHECK(step_parts(old).imbalance_s == 0);
  CHECK(step_parts(old).bubble_s == doctest::Approx(0.2));
  old.compute_max_s = 5;
  CHECK(step_parts(old).imbalance_s == doctest::Approx(0.2));
  CHECK(step_parts(old).bubble_s == doctest::Approx(0));
}

TEST_CASE("fully_sharded: a search key, tried with the distributed optimizer over replicas") {
  const Scenario s = tiny(R"({"tp": [1, 2], "cp": [1], "pp": [1, 2], "vpp": [1],
                              "micro_batch_sizes": [1], "distributed_optimizer": [false, true],
                              "fully_sharded": [false, true]})");
  std::map<Placement, int> sharded;
  for (const Candidate& c : enumerate_plans(s, *s.search, 4).valid) {
    if (!c.plan.fully_sharded) continue;
    INFO(c.key);
    ++sharded[c.plan.placement];
    CHECK(c.plan.distributed_optimizer);
    CHECK(c.plan.schedule != Schedule::kDip);
    const ModuleLayout& llm =
        c.plan.placement == Placement::kHomogeneous ? c.plan.layout : c.plan.modules.back().second;
    CHECK(llm.dp * llm.cp > 1);
  }
  CHECK(sharded[Placement::kHomogeneous] > 0);
  CHECK(sharded[Placement::kNonColocated] > 0);
  CHECK(sharded[Placement::kColocated] > 0);
  Diagnostics diag;
  CHECK(read_search_space(to_json(*s.search), "", "", diag) == *s.search);
  CHECK(diag.ok());
}

TEST_CASE("fp8: a search key; FP8 plans keep and gather their weights in FP8 when sharded") {
  Scenario s = tiny(R"({"tp": [1, 2], "cp": [1], "pp": [1], "vpp": [1], "micro_batch_sizes": [1],
                        "distributed_optimizer": [false, true], "fp8": ["none", "delayed"]})");
  // A device without an FP8 peak: every FP8 plan is refused, the others stay.
  const Enumeration without = enumerate_plans(s, *s.search, 4);
  for (const Candidate& c : without.valid) CHECK(c.plan.fp8 == Fp8Recipe::kNone);
  int64_t refused = 0;
  for (const auto& [reason, count] : without.rejected)
    if (reason.find("fp8") != std::string::npos) refused += count;
  CHECK(refused == static_cast<int64_t>(without.valid.size()));  // each valid plan's FP8 twin
  // With one, each plan has its FP8 twin.
  s.cluster.device.peak_flops[DType::kFp8] = 2e14;
  const Enumeration with = enumerate_plans(s, *s.search, 4);
  int fp8 = 0;
  for (const Candidate& c : with.valid) {
    if (c.plan.fp8 == Fp8Recipe::kNone) continue;
    ++fp8;
    CHECK(c.plan.fp8_param_gather == c.plan.distributed_optimizer);
  }
  CHECK(2 * fp8 == static_cast<int>(with.valid.size()));
  Diagnostics diag;
  CHECK(read_search_space(to_json(*s.search), "", "", diag) == *s.search);
  CHECK(diag.ok());
}

TEST_CASE("encoder context parallelism: enumerated where the space lists it, homogeneous aside") {
  const Scenario s = tiny(R"({"tp": [1], "cp": [1], "pp": [1], "vpp": [1],
                              "micro_batch_sizes": [1], "encoder_cp": [1, 2]})");
  std::map<Placement, std::set<int64_t>> encoder_cps;
  for (const Candidate& c : enumerate_plans(s, *s.search, 4).valid) {
    int64_t cp = c.plan.layout.cp;  // homogeneous: the encoders follow the LLM's grid
    for (const auto& [name, l] : c.plan.modules)
      if (name == "vision") cp = l.cp;
    encoder_cps[c.plan.placement].insert(cp);
  }
  CHECK(encoder_cps[Placement::kHomogeneous] == std::set<int64_t>{1});
  CHECK(encoder_cps[Placement::kColocated] == std::set<int64_t>{1, 2});
  CHECK(encoder_cps[Placement::kNonColocated] == std::set<int64_t>{1, 2});
  Diagnostics diag;
  CHECK(read_search_space(to_json(*s.search), "", "", diag) == *s.search);
  CHECK(diag.ok());
}

TEST_CASE("a sweep where no image fits on one encoder rank offers encoder context parallelism") {
  // Two samples of one 4,096-patch image each (merged 4x4 to 256 LLM tokens) on four devices
  // whose memory holds half an image's activations: TP is held to 1 and recomputation off, so
  // only splitting an image's tokens over encoder ranks can fit.
  const auto scenario = [](const char* memory, const char* search) {
    const std::string text = std::string(R"({"name": "long-images",
      "model": {"name": "vlm", "modules": [
        {"name": "vision", "role": "encoder", "modality": "image",
         "transformer": {"layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "linear_bias": true, "norm": "layernorm"},
         "patching": {"patch_size": 8, "resize": "fixed", "image_size": 512, "spatial_merge": 4}},
        {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 4096, "out": 128}},
        {"name": "llm", "role": "llm", "inputs": ["proj"],
         "transformer": {"layers": 2, "hidden": 128, "heads": 4, "ffn": 256, "vocab": 1000}}]},
      "workload": {"global_batch": 2, "max_seq_len": 512, "samples": {"text_tokens": 64, "image": {"count": 1, "width": 512, "height": 512}}},
      "cluster": {"name": "c4", "nodes": 1, "devices_per_node": 4,
        "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": )") +
                             memory + R"(, "memory_bandwidth_bytes_per_s": 2e12},
        "intra_node": {"bandwidth_bytes_per_s": 2e11, "latency_s": 2e-6}},
      "search": )" + search + "}";
    Diagnostics diag;
    auto s = read_scenario(Json::parse(text), "long-images.json", diag);
    INFO(diag.format());
    REQUIRE(s.has_value());
    return *s;
  };
  const char* space = R"({"tp": [1], "cp": [1, 2], "pp": [1, 2], "vpp": [1],
                          "micro_batch_sizes": [1], "recompute": ["none"], "gpus": [4]})";
  SweepOptions options;
  options.refine_top = 0;
  const auto encoder_cp = [](const ChosenPlan& c) {
    for (const auto& [name, l] : c.ranked.candidate.plan.modules)
      if (name == "vision") return l.cp;
    return int64_t{1};
  };
  // Room for a whole image on a rank: the space's own plans, nothing offered.
  SweepResult roomy;
  const std::vector<ChosenPlan> whole = plan_sweep(scenario("1.0e9", space), options, roomy);
  CHECK(roomy.notes.empty());
  REQUIRE(!whole.empty());
  for (const ChosenPlan& c : whole) CHECK(encoder_cp(c) == 1);
  // Room for half an image: nothing in the space fits; encoder CP does, and the sweep says so.
  SweepResult offered;
  const std::vector<ChosenPlan> split = plan_sweep(scenario("1.5e8", space), options, offered);
  REQUIRE(offered.notes.size() == 1);
  CHECK(offered.notes[0].find("at 4 GPUs: no plan fit with each media item on one encoder rank; "
                              "encoder context parallelism (search.encoder_cp 2, 4, 8) offered") !=
        std::string::npos);
  REQUIRE(!split.empty());
  for (const ChosenPlan& c : split) {
    CHECK(encoder_cp(c) > 1);
    CHECK(c.ranked.candidate.plan.placement != Placement::kHomogeneous);
    CHECK(c.ranked.estimate.feasible);
  }
  // Listed in the space, encoder CP is searched like any other option: no note.
  SweepResult listed;
  const std::string with_cp = std::string(space).replace(std::string(space).find("\"gpus\""), 0,
                                                         "\"encoder_cp\": [1, 2], ");
  CHECK(!plan_sweep(scenario("1.5e8", with_cp.c_str()), options, listed).empty());
  CHECK(listed.notes.empty());
  // Room for no plan at all: the note names the leanest and what its fullest rank needs.
  SweepResult none;
  CHECK(plan_sweep(scenario("4.0e7", space), options, none).empty());
  REQUIRE(none.notes.size() == 2);
  CHECK(none.notes[0].find("offered: 0 plans fit with it") != std::string::npos);
  CHECK(none.notes[1].find("at 4 GPUs: no plan fits in memory; the leanest, ") !=
        std::string::npos);
  CHECK(none.notes[1].find("(weights ") != std::string::npos);
  CHECK(none.notes[1].find("on a rank of ") != std::string::npos);
}

TEST_CASE("framework: a search key every enumerated plan takes, not searched") {
  Scenario s = tiny(R"({"tp": [1, 2], "cp": [1], "pp": [1], "vpp": [1], "micro_batch_sizes": [1],
                        "framework": "pytorch"})");
  REQUIRE(s.search->framework == Framework::kPytorch);
  const Enumeration e = enumerate_plans(s, *s.search, 4);
  REQUIRE(!e.valid.empty());
  for (const Candidate& c : e.valid) CHECK(c.plan.framework == Framework::kPytorch);
  Diagnostics diag;
  CHECK(read_search_space(to_json(*s.search), "", "", diag) == *s.search);
  CHECK(diag.ok());
}

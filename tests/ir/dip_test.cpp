// DIP: sub-micro-batch sizing, the list-scheduled stage orders, the lowering of segments and
// sub-micro-batches (valid Programs doing the same work as 1F1B), and the per-batch schedule
// search (never worse than where it starts; identical sub-problems come from the cache).
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>

#include "shared/cost/evaluator.hpp"
#include "shared/layout/dip_schedule.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/dip_search.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

Scenario variable(const std::string& schedule, int64_t pp = 4, int64_t vpp = 1) {
  Diagnostics diag;
  auto s =
      load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  s->plan->schedule = schedule == "dip" ? Schedule::kDip : Schedule::k1F1B;
  s->plan->layout.pp = pp;
  s->plan->layout.vpp = vpp;
  return *s;
}

// Sum over the compute ops of `module` in one phase: FLOPs, or token-layers (tokens times the
// layers that process them; tokens alone for a projector), which cutting layers or media into
// pieces leaves unchanged.
double total(const Program& p, const ModelSpec& model, const std::string& module, Phase phase,
             bool flops) {
  double sum = 0;
  for (const auto& ops : p.ranks)
    for (const Op& op : ops)
      if (op.kind == OpKind::kCompute && op.phase == phase &&
          model.modules[static_cast<std::size_t>(op.module)].name == module)
        sum += flops ? op.flops : static_cast<double>(op.tokens) * std::max<int32_t>(1, op.layers);
  return sum;
}

}  // namespace

TEST_CASE(
    "dip sub-micro-batches: a piece per LLM virtual-stage time, at least 1, at most the items") {
  CHECK(dip_sub_microbatches(0, 10, 1, 0) == 0);    // no media
  CHECK(dip_sub_microbatches(1, 10, 1, 3) == 1);    // small encoder: one piece
  CHECK(dip_sub_microbatches(30, 10, 1, 8) == 3);   // 3x the LLM's forward: three pieces
  CHECK(dip_sub_microbatches(30, 10, 2, 8) == 6);   // interleaved LLM stages are half as long
  CHECK(dip_sub_microbatches(300, 10, 1, 4) == 4);  // never more pieces than items
}

TEST_CASE("split_contiguous: pieces of about equal weight, every item once, none empty") {
  CHECK(split_contiguous({1, 1, 1, 1}, 2) == std::vector<std::size_t>{0, 2});
  CHECK(split_contiguous({3, 1, 1, 1}, 2) == std::vector<std::size_t>{0, 1});
  CHECK(split_contiguous({1, 1, 1}, 3) == std::vector<std::size_t>{0, 1, 2});
  // A heavy last item still leaves one item to every piece.
  CHECK(split_contiguous({1, 1, 1, 100}, 3) == std::vector<std::size_t>{0, 2, 3});
  CHECK(split_contiguous({5}, 1) == std::vector<std::size_t>{0});
}

TEST_CASE("dip_orders: every step once on its stage, in an order an execution respects") {
  DipPipeline p;
  p.stages = 2;
  p.llm_chunks = 2;
  p.microbatches = 3;
  p.segments.push_back({{2, 0, 1}, 0});  // micro-batch 1 has no media
  p.seconds = [](const DipStep& s, int32_t stage) {
    return (s.segment < 0 ? 2.0 : 1.0) * (s.backward ? 2 : 1) + 0.1 * stage;
  };
  for (bool encoders_first : {true, false})
    for (int32_t lookahead : {1, 3}) {
      DipSchedule schedule;
      schedule.encoders_first = encoders_first;
      schedule.lookahead = lookahead;
      const DipOrders orders = dip_orders(p, schedule);
      REQUIRE(orders.stages.size() == 2);
      for (const auto& order : orders.stages) {
        // LLM: 3 micro-batches x 2 chunks x F/B; encoder: 3 pieces x F/B.
        CHECK(order.size() == 3 * 2 * 2 + 3 * 2);
        std::set<std::tuple<int, int, int, int, bool>> seen;
        for (const DipStep& s : order)
          CHECK(seen.insert({s.segment, s.chunk, s.microbatch, s.sub, s.backward}).second);
        // Each forward before its own backward on the stage.
        for (std::size_t i = 0; i < order.size(); ++i)
          if (order[i].backward)
            for (std::size_t j = i + 1; j < order.size(); ++j) {
              DipStep f = order[i];
              f.backward = false;
              CHECK_FALSE(order[j] == f);
            }
      }
      // The LLM's first stage starts micro-batch 0 only after its media's pieces.
      const auto& first = orders.stages[0];
      const auto llm0 = std::find(first.begin(), first.end(), DipStep{-1, 0, 0, 0, false});
      const auto piece = std::find(first.begin(), first.end(), DipStep{0, 0, 0, 1, false});
      CHECK(piece < llm0);
    }
}

TEST_CASE("dip lowering: a valid Program doing the same work as 1F1B, media cut into pieces") {
  for (const auto& [pp, vpp] : {std::pair<int64_t, int64_t>{2, 1}, {4, 1}, {2, 2}}) {
    CAPTURE(pp);
    CAPTURE(vpp);
    Scenario dip = variable("dip", pp, vpp);
    Scenario base = variable("1f1b", pp, 1);
    // DIP with Entrain: the LLM micro-batches of Entrain's two levels, their media cut by DIP.
    if (vpp == 1 && pp == 4) dip.plan->microbatching = MicrobatchPolicy::kEntrain;
    for (int64_t iteration : {0, 1, 2}) {
      const Batch batch = draw_batch(dip.workload, iteration);
      const Lowered a = lower(dip.model, dip.cluster,
                              resolve_stage_split(*dip.plan, dip.model, dip.workload, dip.cluster),
                              dip.workload, batch);
      const Lowered b =
          lower(base.model, base.cluster,
                resolve_stage_split(*base.plan, base.model, base.workload, base.cluster),
                base.workload, batch);
      REQUIRE(a.error.empty());
      REQUIRE(b.error.empty());
      const auto problems = check_program(a.program);
      INFO((problems.empty() ? std::string() : problems.front()));
      CHECK(problems.empty());
      // Every image's tokens pass the encoder once, in some piece, and the model work is the
      // same (the encoder's layers cut over the stages instead of sitting in the first).
      for (const char* module : {"vision", "vision_projector", "llm"}) {
        CAPTURE(module);
        CHECK(total(a.program, dip.model, module, Phase::kF, false) ==
              doctest::Approx(total(b.program, base.model, module, Phase::kF, false)));
        CHECK(total(a.program, dip.model, module, Phase::kF, true) ==
              doctest::Approx(total(b.program, base.model, module, Phase::kF, true)).epsilon(1e-9));
      }
      CHECK(a.program.model_flops == doctest::Approx(b.program.model_flops).epsilon(1e-9));
      // The vision encoder runs on every stage; the frozen encoder has no backward at all.
      std::set<int16_t> stages;
      for (const auto& ops : a.program.ranks)
        for (const Op& op : ops)
          if (op.kind == OpKind::kCompute &&
              dip.model.modules[static_cast<std::size_t>(op.module)].name == "vision") {
            stages.insert(op.stage);
            CHECK(op.phase == Phase::kF);
          }
      CHECK(stages.size() == static_cast<std::size_t>(pp));
      const CostModel cost(dip.cluster, dip.model.dtype, default_cost_params(dip.cluster),
                           dip.model);
      CHECK(evaluate(a.program, cost).error.empty());
    }
  }
}

TEST_CASE("dip lowering: what it does not lower yet is refused by name") {
  const Batch batch = draw_batch(variable("dip").workload, 0);
  Scenario t = variable("dip", 4);
  t.plan->layout.cp = 2;
  t.plan->layout.pp = 2;
  CHECK(lower(t.model, t.cluster, resolve_stage_split(*t.plan, t.model, t.workload, t.cluster),
              t.workload, batch)
            .error.find("cp > 1") != std::string::npos);
}

TEST_CASE("dip with overlapped reduction and gathers: replicas order apart, collectives alike") {
  // The ViT trained, images rare (some replica's batch may have none): each replica orders its
  // steps by its own batch, so a module's last backward comes at different points, yet the
  // data-parallel collectives of a stage share one group and must come in one order.
  Scenario s = variable("dip", 2, 2);
  for (ModuleSpec& m : s.model.modules) m.frozen = false;
  s.plan->layout.dp = 2;
  s.plan->overlap_grad_reduce = true;
  s.plan->distributed_optimizer = true;
  s.plan->overlap_param_gather = true;
  s.plan->grad_bucket_mb = 0.1;
  REQUIRE(s.workload.sources.size() == 1);
  REQUIRE(s.workload.sources[0].image.has_value());
  Distribution& count = s.workload.sources[0].image->count;
  count.kind = DistKind::kChoice;
  count.values.assign(12, 0.0);
  count.values.push_back(1);
  int diverged = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    CAPTURE(seed);
    s.workload.seed = seed;
    const Lowered l =
        lower(s.model, s.cluster, resolve_stage_split(*s.plan, s.model, s.workload, s.cluster),
              s.workload, draw_batch(s.workload, 0));
    REQUIRE(l.error.empty());
    const auto problems = check_program(l.program);
    INFO((problems.empty() ? std::string() : problems.front()));
    CHECK(problems.empty());
    // Per rank: the modules in the order their bucketed backward pieces run, and the
    // data-parallel collectives in order.
    std::vector<std::vector<std::pair<int16_t, int16_t>>> backward(l.program.ranks.size());
    std::vector<std::vector<std::tuple<int16_t, int16_t, int32_t, int>>> collectives(
        l.program.ranks.size());
    for (std::size_t r = 0; r < l.program.ranks.size(); ++r)
      for (const Op& op : l.program.ranks[r]) {
        if (op.kind == OpKind::kCompute && op.phase == Phase::kW &&
            (op.flags & kOpGradientBucket) != 0 &&
            (backward[r].empty() || backward[r].back() != std::pair{op.module, op.chunk}))
          backward[r].emplace_back(op.module, op.chunk);
        if (op.kind == OpKind::kCollective && op.purpose == Purpose::kDp)
          collectives[r].emplace_back(op.module, op.chunk, op.first_layer,
                                      static_cast<int>(op.collective));
      }
    // Ranks 2s and 2s + 1 are stage s of replicas 0 and 1.
    for (std::size_t r = 0; r + 1 < l.program.ranks.size(); r += 2) {
      CHECK(collectives[r] == collectives[r + 1]);
      diverged += backward[r] != backward[r + 1] ? 1 : 0;
    }
  }
  // Some batch did order the replicas' backward apart.
  CHECK(diverged > 0);
}

TEST_CASE("dip search: never worse than its start, and an unchanged batch is answered from cache") {
  const Scenario s = variable("dip", 4);
  const CostModel cost(s.cluster, s.model.dtype, default_cost_params(s.cluster), s.model);
  const ParallelPlan plan = resolve_stage_split(*s.plan, s.model, s.workload, s.cluster);
  DipPlanner planner(s, plan, cost);
  DipSchedule previous;
  for (int64_t iteration = 0; iteration < 4; ++iteration) {
    CAPTURE(iteration);
    const Batch batch = draw_batch(s.workload, iteration);
    const DipSearchResult r = planner.search(batch, previous);
    REQUIRE(r.error.empty());
    CHECK(r.step_s <= r.start_step_s);
    CHECK(r.scored > 1);
    // The chosen schedule lowers to what the search scored.
    const Lowered l = lower(s.model, s.cluster, plan, s.workload, batch, &r.schedule);
    REQUIRE(l.error.empty());
    CHECK(evaluate(l.program, cost).step_s == doctest::Approx(r.step_s));
    // A deliberately poor start: the search improves on it.
    DipSchedule poor;
    poor.lookahead = 1;
    poor.in_flight = 1;
    poor.encoders_first = false;
    const DipSearchResult from_poor = planner.search(batch, poor);
    CHECK(from_poor.step_s < from_poor.start_step_s);
    // The same batch from the same start again: every candidate's score is cached.
    const DipSearchResult again = planner.search(batch, previous);
    CHECK(again.cached == again.scored);
    CHECK(again.schedule == r.schedule);
    previous = r.schedule;
  }
}

TEST_CASE(
    "dip schedules read back from JSON: names resolved, layer counts checked against a plan") {
  const Scenario s = variable("dip", 4);
  DipSchedule schedule;
  schedule.segment_order = {0};
  schedule.encoders_first = false;
  schedule.lookahead = 3;
  schedule.in_flight = 5;
  schedule.layers[0] = {3, 2, 2, 1};
  schedule.layers[2] = {1, 3, 2, 2};
  Diagnostics diag;
  const auto back = read_dip_schedule(dip_schedule_to_json(schedule, s.model), s.model, "run.json",
                                      "iterations[1].dip.schedule", diag);
  INFO(diag.format());
  REQUIRE(back.has_value());
  CHECK(*back == schedule);
  CHECK(dip_schedule_problem(schedule, s.model, 4, 1).empty());
  CHECK(dip_schedule_problem(schedule, s.model, 2, 1).find("layers of vision must be 2") == 0);
  DipSchedule zero = schedule;
  zero.layers[2] = {0, 4, 2, 2};
  CHECK_FALSE(dip_schedule_problem(zero, s.model, 4, 1).empty());
  // lower() refuses it by name instead of failing inside.
  const Batch batch = draw_batch(s.workload, 0);
  CHECK(lower(s.model, s.cluster, resolve_stage_split(*s.plan, s.model, s.workload, s.cluster),
              s.workload, batch, &zero)
            .error.find("DIP schedule") == 0);
  // Unknown modules and bad values are reported with their JSON path.
  Json bad = dip_schedule_to_json(schedule, s.model);
  bad["segment_order"] = {"camera"};
  bad["lookahead"] = 0;
  Diagnostics d2;
  CHECK_FALSE(read_dip_schedule(bad, s.model, "run.json", "x", d2).has_value());
  const std::string text = d2.format();
  CHECK(text.find("x.segment_order[0]: no module named 'camera'") != std::string::npos);
  CHECK(text.find("x.lookahead: must be >= 1") != std::string::npos);
}

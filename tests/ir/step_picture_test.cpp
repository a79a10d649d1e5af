// A step of a plan as a picture (the sweep report's timelines): which ranks get a lane, and that
// the bars are the evaluator's op times, inside the step, the compute stream never doubled.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "shared/layout/scenario.hpp"
#include "shared/search/estimate.hpp"
#include "shared/search/step_picture.hpp"

using namespace tessera;

namespace {

StepPicture picture_of(const std::string& plan_json) {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json", diag);
  REQUIRE(s.has_value());
  const ParallelPlan plan = read_plan(Json::parse(plan_json), "", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  return step_picture(*s, plan, default_cost_params(s->cluster));
}

void check_bars(const StepPicture& p) {
  REQUIRE(p.error.empty());
  REQUIRE(p.step_s > 0);
  std::set<int64_t> ranks;
  for (const StepLane& lane : p.lanes) {
    INFO(lane.label);
    CHECK(ranks.insert(lane.rank).second);
    CHECK_FALSE(lane.bars.empty());
    double compute_end = 0, compute = 0, previous_start = 0;
    for (const StepBar& b : lane.bars) {
      INFO(b.name);
      CHECK(b.start_s >= previous_start);
      previous_start = b.start_s;
      CHECK(b.start_s >= 0);
      CHECK(b.finish_s > b.start_s);
      CHECK(b.finish_s <= p.step_s * (1 + 1e-9));
      if (!b.compute) continue;
      CHECK(b.start_s >= compute_end - 1e-12 * p.step_s);  // one compute stream
      compute_end = b.finish_s;
      compute += b.finish_s - b.start_s;
    }
    CHECK(compute <= p.step_s * (1 + 1e-9));
  }
}

}  // namespace

TEST_CASE("a step picture: a lane per pipeline stage, TP shards folded into one") {
  const StepPicture p = picture_of(
      R"({"placement": "homogeneous", "layout": {"tp": 2, "pp": 2, "dp": 1},
          "micro_batch_size": 1, "schedule": "1f1b"})");
  check_bars(p);
  REQUIRE(p.lanes.size() == 2);
  CHECK(p.lanes[0].rank == 0);
  CHECK(p.lanes[0].label.find("llm s0") != std::string::npos);
  CHECK(p.lanes[1].rank == 2);  // the second stage's first rank; rank 1 is rank 0's TP shard
  CHECK(p.lanes[1].label.find("llm s1") != std::string::npos);
  CHECK(p.lanes[0].label == "rank 0: vision + vision_projector + llm s0");  // encoders in stage 0
}

TEST_CASE("a step picture: non-colocated modules each get a lane; replicas with other data too") {
  const StepPicture p = picture_of(
      R"({"placement": "non_colocated", "micro_batch_size": 1,
          "modules": {"vision": {"dp": 2}, "llm": {"pp": 2}}})");
  check_bars(p);
  bool vision = false, llm = false;
  for (const StepLane& lane : p.lanes) {
    vision = vision || lane.label.find("vision") != std::string::npos;
    llm = llm || lane.label.find("llm") != std::string::npos;
  }
  CHECK(vision);
  CHECK(llm);
  // The two vision replicas encode different images (cpu-tiny draws 0-2 per sample): both shown.
  CHECK(p.lanes.back().label.find("another replica") != std::string::npos);
}

TEST_CASE("a step picture of a plan the lowering refuses says why") {
  const StepPicture p = picture_of(
      R"({"placement": "homogeneous", "layout": {"pp": 2, "vpp": 2, "dp": 2},
          "microbatching": "entrain", "micro_batch_size": 1})");
  CHECK(p.error.find("not lowered yet") != std::string::npos);
  CHECK(p.lanes.empty());
}

// Per-module stage counts under a device budget: every split of the stages is tried, both
// planners rank what fits, and on Cornstarch's frozen VLM the frozen-aware planner gives the
// frozen encoder fewer stages than the freeze-unaware one and predicts a shorter step.
#include <doctest/doctest.h>

#include <algorithm>

#include "shared/search/stage_allocation.hpp"

using namespace tessera;

namespace {

const std::string kCornstarch = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cornstarch/";

Scenario load(const std::string& name) {
  Diagnostics diag;
  auto s = load_scenario(kCornstarch + name, diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return *s;
}

int64_t total(const std::vector<std::pair<std::string, int64_t>>& stages) {
  int64_t n = 0;
  for (const auto& [name, count] : stages) n += count;
  return n;
}

}  // namespace

TEST_CASE("stage allocation: every split of the budget, ranked; frozen encoder gets fewer stages") {
  const Scenario s = load("vlm-small.json");
  Diagnostics diag;
  const StageAllocation a =
      allocate_stages(s, StageBudget{16, 2, 1, 1}, default_cost_params(s.cluster), diag);
  REQUIRE(diag.ok());
  CHECK(a.stages == 8);
  // vision 0 (in the LLM's first stage) .. 7: eight splits, each planned with both splits.
  CHECK(a.frozen_aware.size() == 8);
  CHECK(a.freeze_unaware.size() == 8);
  for (const StageCountPlan& p : a.frozen_aware) {
    CHECK(total(p.stages) == 8);
    CHECK(p.plan.stage_split == StageSplit::kFrozenAware);
    CHECK(p.estimate.feasible);
  }
  for (const StageCountPlan& p : a.freeze_unaware) {
    CHECK(p.plan.stage_split == StageSplit::kUniform);
    CHECK(p.believed_s > p.estimate.metrics.step_s);  // it thinks the frozen modules train
  }
  CHECK(std::is_sorted(a.frozen_aware.begin(), a.frozen_aware.end(),
                       [](const StageCountPlan& x, const StageCountPlan& y) {
                         return x.estimate.metrics.step_s < y.estimate.metrics.step_s;
                       }));
  CHECK(std::is_sorted(a.freeze_unaware.begin(), a.freeze_unaware.end(),
                       [](const StageCountPlan& x, const StageCountPlan& y) {
                         return x.believed_s < y.believed_s;
                       }));
  // The frozen ViT runs forward only: the frozen-aware planner never gives it more stages than
  // a planner that thinks it trains (two here), and its plan is faster.
  const auto& aware = a.frozen_aware.front();
  const auto& unaware = a.freeze_unaware.front();
  REQUIRE(aware.stages.size() == 2);
  CHECK(unaware.stages == std::vector<std::pair<std::string, int64_t>>{{"vision", 2}, {"llm", 6}});
  CHECK(aware.stages[0].first == "vision");
  CHECK(aware.stages[0].second <= unaware.stages[0].second);
  CHECK(aware.estimate.metrics.step_s < unaware.estimate.metrics.step_s);
  // The chosen plan carries its boundaries, which sum to the layers.
  REQUIRE(aware.plan.modules.size() == 2);
  const int64_t vision_stages = aware.stages[0].second, llm_stages = aware.stages[1].second;
  CHECK(vision_stages + llm_stages == 8);
  const ModuleLayout& llm = aware.plan.modules[1].second;
  CHECK(static_cast<int64_t>(llm.stage_layers.size()) == llm_stages);
  int64_t layers = 0;
  for (int64_t n : llm.stage_layers) layers += n;
  CHECK(layers == 16);
  CHECK(aware.plan.modules[0].second.ranks == RankSpan{0, 2 * vision_stages});
  CHECK(llm.ranks == RankSpan{2 * vision_stages, 2 * llm_stages});
  // The LLM-centric layout is the homogeneous one with equal layers.
  REQUIRE(a.llm_centric.has_value());
  CHECK(a.llm_centric->plan.placement == Placement::kHomogeneous);
  CHECK(a.llm_centric->plan.layout.pp == 8);
  CHECK(stage_counts_text(aware.stages) ==
        "vision " + std::to_string(vision_stages) + " + llm " + std::to_string(llm_stages));
  CHECK(stage_counts_text(a.llm_centric->stages) == "vision in stage 1 + llm 8");
}

TEST_CASE("stage allocation: heads that tp does not divide run data-parallel in their stage") {
  // InternViT-6B has 25 heads: its stages keep 2 devices as tp 1 x dp 2; the homogeneous layout,
  // which would need tp 2 for it, is not possible and says why.
  const Scenario s = load("vlm-large.json");
  Diagnostics diag;
  const StageAllocation a =
      allocate_stages(s, StageBudget{16, 2, 1, 1}, default_cost_params(s.cluster), diag);
  REQUIRE(diag.ok());
  REQUIRE(!a.frozen_aware.empty());
  const ModuleLayout& vision = a.frozen_aware.front().plan.modules[0].second;
  CHECK(vision.tp == 1);
  CHECK(vision.dp == 2);
  CHECK(!a.llm_centric.has_value());
  CHECK(a.llm_centric_reason.find("heads=25") != std::string::npos);
  CHECK(a.rejected.count("memory") == 1);  // a 70B LLM on 1 or 2 stages of 2 devices
}

TEST_CASE("stage allocation: a budget that makes no whole stages, or too few, is refused") {
  const Scenario s = load("valm-small.json");
  Diagnostics diag;
  allocate_stages(s, StageBudget{15, 2, 1, 1}, default_cost_params(s.cluster), diag);
  REQUIRE(!diag.ok());
  CHECK(diag.errors().front().message.find("do not make whole stages") != std::string::npos);
  Diagnostics few;
  allocate_stages(s, StageBudget{4, 2, 1, 1}, default_cost_params(s.cluster), few);
  REQUIRE(!few.ok());
  CHECK(few.errors().front().message.find("2 stages for 3 pipelined modules") != std::string::npos);
  // A text-only model has nothing to share out.
  Scenario text = s;
  std::erase_if(text.model.modules, [](const ModuleSpec& m) { return m.role != ModuleRole::kLlm; });
  text.model.modules.front().inputs.clear();
  Diagnostics none;
  allocate_stages(text, StageBudget{16, 2, 1, 1}, default_cost_params(s.cluster), none);
  REQUIRE(!none.ok());
  CHECK(none.errors().front().path == "model");
  CHECK(none.errors().front().message.find("no transformer encoder") != std::string::npos);
}

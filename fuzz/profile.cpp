// Fuzz target: a calibration profile (profile.json, `--profile` of simulate/sweep/replay).
// Properties: a refusal gives a reason; an accepted profile writes back to the same JSON; with
// its fits, a step of the cpu-tiny scenario prices every op at a finite, non-negative time and
// the in-order evaluator finishes the step.
#include <cmath>
#include <cstdint>
#include <filesystem>

#include "fuzz/support.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/cost/profile.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

struct Fixture {
  Scenario scenario;
  Program program;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Diagnostics diag;
    const std::string file = std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json";
    std::optional<Scenario> s = load_scenario(file, diag);
    if (!s || !s->plan) fuzz::fail("the fixture scenario does not load:\n" + diag.format());
    Lowered lowered = lower(s->model, s->cluster,
                            resolve_stage_split(*s->plan, s->model, s->workload, s->cluster),
                            s->workload, draw_batch(s->workload, 0));
    if (!lowered.error.empty()) fuzz::fail("the fixture scenario does not lower: " + lowered.error);
    return Fixture{std::move(*s), std::move(lowered.program)};
  }();
  return f;
}

std::optional<Profile> load_text(const std::string& text, Diagnostics& diag) {
  const std::string file = fuzz::scratch_dir() + "/profile.json";
  fuzz::write_text(file, text);
  return load_profile(file, diag);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const Fixture& f = fixture();
  Diagnostics diag;
  const std::optional<Profile> profile = load_text(std::string(fuzz::as_text(data, size)), diag);
  if (!profile) {
    fuzz::refused("a profile", diag);
    return 0;
  }
  fuzz::accepted("a profile", diag);
  fuzz::check_round_trip(to_json(*profile), "a profile", [](const Json& j, Diagnostics& d) {
    const std::optional<Profile> again = load_text(j.dump(), d);
    return again ? std::optional<Json>(to_json(*again)) : std::nullopt;
  });
  // Price the fixture's step on the machine the profile names.
  ClusterSpec cluster = f.scenario.cluster;
  if (profile->cluster_kind != cluster.kind) return 0;
  cluster.device.name = profile->device;
  CostParams params = profile_cost_params(*profile, cluster, "profile.json", diag);
  if (!diag.ok()) fuzz::fail("a matching profile refused:\n" + diag.format());
  const CostModel cost(cluster, f.scenario.model.dtype, std::move(params), f.scenario.model);
  for (const auto& ops : f.program.ranks)
    for (const Op& op : ops) {
      if (op.kind != OpKind::kCompute && op.kind != OpKind::kOptimizerStep) continue;
      const double s = cost.compute_s(f.program, op);
      if (!std::isfinite(s) || s < 0)
        fuzz::fail("the profile prices " + op_name(f.program, op) + " at " + std::to_string(s) +
                   " s");
    }
  const Timeline timeline = evaluate(f.program, cost);
  if (!timeline.error.empty()) fuzz::fail("the step does not finish: " + timeline.error);
  if (!std::isfinite(timeline.step_s) || timeline.step_s < 0)
    fuzz::fail("the step takes " + std::to_string(timeline.step_s) + " s");
  return 0;
}

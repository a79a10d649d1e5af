// Fuzz target: a scenario file (model, workload, cluster, plan and search space inline) through
// the reader and every validator. Properties: a refusal gives a reason; an accepted scenario
// writes back (to_json) to JSON that reads to the same scenario; a small accepted plan lowers
// (a batch drawn from its workload) to a Program that passes check_program, or is refused for
// the reason lowering_refusal() gives.
#include <cstdint>

#include "fuzz/support.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

// Small enough to lower in well under a millisecond per input.
bool small(const Scenario& s) {
  if (!s.plan || s.workload.global_batch > 64) return false;
  if (world_size(*s.plan, s.model) > 64) return false;
  if (micro_batches(*s.plan, s.model, s.workload) > 64) return false;
  int64_t layers = 0;
  for (const ModuleSpec& m : s.model.modules)
    if (m.transformer) layers += m.transformer->layers;
  return layers <= 512;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string file = fuzz::scratch_dir() + "/scenario.json";
  Diagnostics diag;
  const std::optional<Json> json = parse_json_text(fuzz::as_text(data, size), file, diag);
  if (!json) {
    fuzz::refused("JSON text", diag);
    return 0;
  }
  const std::optional<Scenario> scenario = read_scenario(*json, file, diag);
  if (!scenario) {
    fuzz::refused("a scenario", diag);
    return 0;
  }
  fuzz::accepted("a scenario", diag);
  fuzz::check_round_trip(to_json(*scenario), "a scenario", [&](const Json& j, Diagnostics& d) {
    const std::optional<Scenario> again = read_scenario(j, file, d);
    return again ? std::optional<Json>(to_json(*again)) : std::nullopt;
  });
  if (small(*scenario)) {
    // A validated plan lowers to a valid Program, or lower() refuses it for the reason
    // lowering_refusal() states; never an internal error.
    const Scenario& s = *scenario;
    const ParallelPlan plan = resolve_stage_split(*s.plan, s.model, s.workload, s.cluster);
    const Lowered lowered = lower(s.model, s.cluster, plan, s.workload, draw_batch(s.workload, 0));
    if (lowered.error != lowering_refusal(plan, s.model))
      fuzz::fail("lower() refused for another reason than lowering_refusal(): " + lowered.error);
    if (lowered.error.empty())
      for (const std::string& problem : check_program(lowered.program))
        fuzz::fail("the lowered Program is broken: " + problem);
  }
  return 0;
}

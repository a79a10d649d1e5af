// Where a command's plan comes from: the scenario's own, a plan JSON file, or the row ranked R
// of a sweep's results (`results.jsonl#R`). Shared by `tessera` and `tessera-train`.
#pragma once

#include <optional>
#include <string>

#include "shared/layout/scenario.hpp"

namespace tessera {

// The scenario at `file` with its plan replaced by `plan_spec` ("" keeps the scenario's),
// validated against it. nullopt after recording every problem (file and JSON path) in `diag`,
// including a scenario without any plan.
std::optional<Scenario> load_scenario_with_plan(const std::string& file,
                                                const std::string& plan_spec, Diagnostics& diag);
// The same for a scenario already loaded. `validate` false: the plan is only read (the caller
// changes the scenario further and validates the result, as --set does).
std::optional<Scenario> with_plan(Scenario scenario, const std::string& plan_spec,
                                  Diagnostics& diag, bool validate = true);

}  // namespace tessera

// `--set json.path=value`: changes of a scenario's fields, by JSON path of the inlined scenario,
// for the commands that take them (tessera's, tessera-train) and the sweep's grid of them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/base/diagnostics.hpp"
#include "shared/base/json_reader.hpp"
#include "shared/layout/scenario.hpp"

namespace tessera {

// One --set: a JSON path of the (inlined) scenario and the values to try there.
struct SetAxis {
  std::string path;
  std::vector<Json> values;
};

// The --set texts ("json.path=v1,v2", as given, or split at commas by the option parser: a
// piece without '=' continues the one before): each value is JSON when it parses (numbers,
// true, "text"), else a string. nullopt after recording what is malformed in `diag`.
std::optional<std::vector<SetAxis>> parse_set_axes(const std::vector<std::string>& pieces,
                                                   Diagnostics& diag);

// The --set texts as one point {path: value}, for commands that run one scenario: nullopt
// (recorded in `diag`) where one is malformed or gives more than one value.
std::optional<Json> parse_set_point(const std::vector<std::string>& pieces, Diagnostics& diag);

// The scenario at one point {path: value}; problems (a bad path, an invalid value) go to `diag`.
std::optional<Scenario> scenario_at(const Scenario& scenario, const Json& point, Diagnostics& diag);

// The scenario at `file` with its plan replaced by `plan_spec` (plan_source.hpp), then changed at
// `point` (which may change the plan too) and validated whole; nullopt after recording every
// problem in `diag`.
std::optional<Scenario> load_scenario_at(const std::string& file, const std::string& plan_spec,
                                         const Json& point, Diagnostics& diag);

}  // namespace tessera

// What `tessera simulate` prints: a simulation's step time, throughput, memory, idle share and
// how far it landed from the contention-free estimate, as text or JSON.
#pragma once

#include <string>

#include "shared/base/json_reader.hpp"
#include "shared/layout/scenario.hpp"
#include "sim/simulator.hpp"

namespace tessera::sim {

std::string format_simulation(const SimulationResult& r, const Scenario& scenario);
Json simulation_to_json(const SimulationResult& r);

}  // namespace tessera::sim

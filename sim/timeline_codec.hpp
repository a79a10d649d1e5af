// A Timeline as bytes for the trip out of the forked child that simulated it (one SimGrid engine
// per process), and back: counters, every op's start and finish, each rank's nested slices, then
// the error text.
#pragma once

#include <string>

#include "shared/cost/evaluator.hpp"
#include "shared/program/program.hpp"

namespace tessera::sim {

std::string serialize_timeline(const Timeline& timeline);
// A truncated or empty message gives a Timeline whose error says so.
Timeline deserialize_timeline(const std::string& bytes, const Program& program);

}  // namespace tessera::sim

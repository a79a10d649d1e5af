// Twins: ranks that run the same ops at the same times, so a simulation may run one of them
// and copy its times to the others. Two ranks r and r+δ are twins when their op lists are equal
// in everything but peers and groups, each peer and group of r+δ is r's translated by δ (or the
// very same group), and — closed under that relation — their peers and the other members of
// their groups are twins with the same offset. TP shards (and CP shards under an even split)
// are twins by construction; data-parallel replicas are not, since their data differs.
#pragma once

#include <cstdint>
#include <vector>

#include "shared/program/program.hpp"

namespace tessera::sim {

struct Twins {
  std::vector<int32_t> leader;  // per rank: the rank that runs its class
  std::vector<std::vector<int32_t>>
      offsets;  // per leader: δ of every member, 0 first; empty otherwise
  int32_t classes = 0;
};

Twins find_twins(const Program& program);

}  // namespace tessera::sim

// Flow lanes: which of a run's flows the simulator may leave out because a simulated flow
// stands for each of them exactly.
//
// On the platforms built for GPU clusters every link that can limit a flow belongs to one rank
// (its NVLink port, its NIC), and a non-blocking fabric's node uplinks carry at most what the
// NICs under them can send. Ranks joined by flows form a component; components then never slow
// each other. A component that holds no class leader, and whose flows are those of a leader's
// component moved by one rank offset δ — started by the same ops, of the same sizes, crossing
// nodes where those cross nodes — runs exactly as that component does, so its flows need not
// run: the ops that wait for them wait as long for their stand-ins. This holds, for instance,
// for the TP shards of a folded pipeline whose data-parallel replicas are joined to their
// representative by gradient rings: each TP shard's pipeline and rings form a lane of their own.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shared/program/program.hpp"

namespace tessera::sim {

// The flows one op of a class starts together, as the runner starts them: sends (a flow from
// one rank to another) and rings (a flow from each member of a group to the next).
struct FlowUnit {
  struct Item {
    int32_t first = 0;  // ranks[first, first + count): a send's (from, to), a ring's group
    int32_t count = 0;
    bool ring = false;
    double key[2] = {0, 0};  // equal in a stand-in: a send's bytes; a ring's sequence and price
  };
  std::vector<int32_t> ranks;
  std::vector<Item> items;

  void send(int32_t from, int32_t to, double bytes);
  // `sequence`: the collective's place among its group's; `seconds`: what the cost model
  // charges it.
  void ring(const RankList& group, int32_t sequence, double seconds);
  void clear();
};

// Calls its argument with every unit of the run, in a fixed order; it is called twice.
using FlowUnits = std::function<void(const std::function<void(const FlowUnit&)>&)>;

// Per rank: true when the flows whose first rank it is (a send's sender, a ring's first member)
// have a stand-in and may be left out. `leader`: each rank's class leader (twins.hpp); the ranks
// of a node are devices_per_node consecutive ones. Only for a platform whose limiting links are
// per rank (not cpu-local, no oversubscribed uplink).
std::vector<char> flows_stood_for(int64_t world, const std::vector<int32_t>& leader,
                                  int64_t devices_per_node, const FlowUnits& units);

}  // namespace tessera::sim

#include <doctest/doctest.h>

#include <vector>

#include "sim/flow_lanes.hpp"

using namespace tessera::sim;
using tessera::RankList;

namespace {

// Units given as lists of sends (from, to, bytes) and rings (group), one list per unit.
struct Send {
  int32_t from, to;
  double bytes;
};
FlowUnits units_of(std::vector<std::vector<Send>> sends,
                   std::vector<std::vector<RankList>> rings = {}) {
  return [sends, rings](const std::function<void(const FlowUnit&)>& visit) {
    FlowUnit u;
    for (const auto& unit : sends) {
      u.clear();
      for (const Send& s : unit) u.send(s.from, s.to, s.bytes);
      visit(u);
    }
    for (const auto& unit : rings) {
      u.clear();
      for (const RankList& g : unit) u.ring(g, 0, 1.0);
      visit(u);
    }
  };
}

}  // namespace

TEST_CASE("flow lanes: a moved copy of a leader's lane is stood for, anything else runs") {
  // Two nodes of four. Classes {0, 1} and {4, 5}: ranks 0 and 4 lead, 1 and 5 follow by +1.
  const std::vector<int32_t> leader{0, 0, 2, 3, 4, 4, 6, 7};
  // Each class op sends from both members; the second lane is the first moved by one.
  const auto stood = flows_stood_for(8, leader, 4, units_of({{{0, 4, 8}, {1, 5, 8}}}));
  CHECK(stood == std::vector<char>{0, 1, 0, 0, 0, 1, 0, 0});
  // Different sizes: not a copy.
  CHECK(flows_stood_for(8, leader, 4, units_of({{{0, 4, 8}, {1, 5, 9}}})) ==
        std::vector<char>(8, 0));
  // Started by different ops: not a copy (the stand-in would start at another time).
  CHECK(flows_stood_for(8, leader, 4, units_of({{{0, 4, 8}}, {{1, 5, 8}}})) ==
        std::vector<char>(8, 0));
  // A flow that joins the two lanes (1 -> 4) makes one component with the leaders: all run.
  CHECK(flows_stood_for(8, leader, 4, units_of({{{0, 4, 8}, {1, 5, 8}}, {{1, 4, 8}}})) ==
        std::vector<char>(8, 0));
  // A lane with a flow its stand-in lacks: the item counts differ, it runs.
  CHECK(flows_stood_for(8, leader, 4, units_of({{{0, 4, 8}, {1, 5, 8}, {5, 1, 8}}})) ==
        std::vector<char>(8, 0));
}

TEST_CASE("flow lanes: a copy that crosses nodes where its stand-in does not runs") {
  // Nodes of four; classes {2, 3} and {6, 7}: 2 sends to 6, 3 to 7, both across: a copy.
  const std::vector<int32_t> leader{0, 1, 2, 2, 4, 5, 6, 6};
  CHECK(flows_stood_for(8, leader, 4, units_of({{{2, 6, 8}, {3, 7, 8}}})) ==
        std::vector<char>{0, 0, 0, 1, 0, 0, 0, 1});
  // Classes of pairs: leader 2 sends to 0 and member 3 to 1, all inside node 0: a copy.
  const std::vector<int32_t> pairs{0, 0, 2, 2, 4, 4, 6, 6};
  CHECK(flows_stood_for(8, pairs, 4, units_of({{{2, 0, 8}, {3, 1, 8}}})) ==
        std::vector<char>{0, 1, 0, 1, 0, 0, 0, 0});
  // Class {1, 3, 4}: leader 1 sends to 2 inside node 0, member 3 to 4 across: no stand-in.
  const std::vector<int32_t> apart{0, 1, 2, 1, 1, 5, 6, 7};
  CHECK(flows_stood_for(8, apart, 4, units_of({{{1, 2, 8}, {3, 4, 8}}})) ==
        std::vector<char>(8, 0));
  // On one node of eight both stay inside: a copy.
  CHECK(flows_stood_for(8, apart, 8, units_of({{{1, 2, 8}, {3, 4, 8}}})) ==
        std::vector<char>{0, 0, 0, 1, 1, 0, 0, 0});
}

TEST_CASE("flow lanes: rings are moved with their groups") {
  // Two lanes of a gradient ring each: {0, 4} and {1, 5}, on two nodes of four.
  const std::vector<int32_t> leader{0, 0, 2, 3, 0, 0, 6, 7};
  CHECK(flows_stood_for(8, leader, 4, units_of({}, {{{0, 4}, {1, 5}}})) ==
        std::vector<char>{0, 1, 0, 0, 0, 1, 0, 0});
  // The second ring in another order: not the first moved.
  CHECK(flows_stood_for(8, leader, 4, units_of({}, {{{0, 4}, {5, 1}}})) == std::vector<char>(8, 0));
}

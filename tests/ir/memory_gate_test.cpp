#include <doctest/doctest.h>

#include <fstream>

#include "shared/layout/scenario.hpp"
#include "shared/search/memory_gate.hpp"

using namespace tessera;

TEST_CASE(
    "the memory gate admits estimates side by side within its budget, an oversize one alone") {
  MemoryGate gate(10);
  REQUIRE(gate.try_acquire(8));
  CHECK_FALSE(gate.try_acquire(5));  // 13 > 10: waits for the first
  CHECK(gate.try_acquire(2));        // 10: fits beside it
  gate.release(8);
  gate.release(2);
  CHECK(gate.try_acquire(25));  // larger than the whole budget: runs when nothing else does
  CHECK_FALSE(gate.try_acquire(1));
  gate.release(25);
  CHECK(gate.try_acquire(1));
  gate.release(1);
}

TEST_CASE("a Program's footprint grows with ranks, micro-batches and pipeline chunks") {
  Diagnostics diag;
  const auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json", diag);
  REQUIRE(s.has_value());
  ParallelPlan plan = *s->plan;  // PP2, 8 samples of one: 8 micro-batches
  const double base = lowering_footprint_bytes(plan, s->model, s->workload);
  CHECK(base == 800.0 * 4 * 2 * 8);
  plan.layout.dp = 2;  // twice the ranks, half the micro-batches each
  CHECK(lowering_footprint_bytes(plan, s->model, s->workload) == base);
  plan.layout.vpp = 2;
  CHECK(lowering_footprint_bytes(plan, s->model, s->workload) == 2 * base);
  CHECK(available_memory_bytes() > 0);
  // Read from the system where it says (not the 8 GiB assumed where it does not).
  if (std::ifstream("/proc/meminfo").good()) CHECK(available_memory_bytes() != 8.0 * (1 << 30));
}

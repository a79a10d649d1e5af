// Iteration metrics from a Program and its Timeline: exposed communication, MFU and HFU.
#include <doctest/doctest.h>

#include "shared/cost/metrics.hpp"
#include "shared/layout/scenario.hpp"

using namespace tessera;

TEST_CASE("exposed comm: transfers while the rank computes nothing, the trailing reduction too") {
  Diagnostics diag;
  const auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json", diag);
  REQUIRE(s.has_value());
  Program p;
  p.world = 2;
  p.modules = {"llm"};
  p.groups = {{0, 1}};
  p.memory.assign(2, {});
  Op f;
  f.module = 0;
  f.flops = 1e9;
  Op r = f;
  r.phase = Phase::kR;  // recomputation: hardware FLOPs, not model FLOPs
  Op reduce;
  reduce.kind = OpKind::kCollective;
  reduce.stream = StreamKind::kCollective;
  reduce.purpose = Purpose::kDp;
  reduce.group = 0;
  p.ranks = {{f, reduce, r}, {f, reduce}};
  p.model_flops = 2e9;
  Timeline t;
  // Rank 0 computes 0-1 s, reduces 1-1.5 s while recomputing 1-1.2 s; rank 1 computes 0-0.8 s,
  // idles (not communication), then reduces 1-1.5 s with nothing else to do.
  t.ops = {{{0, 1}, {1, 1.5}, {1, 1.2}}, {{0, 0.8}, {1, 1.5}}};
  t.step_s = 1.5;
  const IterationMetrics m = compute_metrics(p, t, s->model, s->cluster, Batch{});
  CHECK(m.exposed_comm_s[0] == doctest::Approx(0.3));
  CHECK(m.exposed_comm_s[1] == doctest::Approx(0.5));
  CHECK(m.exposed_comm_mean_s == doctest::Approx(0.4));
  CHECK_FALSE(m.pipelined);
  // Idle is what the rank does not compute: transfers count as idle, exposed or not.
  CHECK(m.bubble[0] == doctest::Approx((1.5 - 1.2) / 1.2));
  CHECK(m.bubble[1] == doctest::Approx((1.5 - 0.8) / 0.8));
  // HFU counts the recomputed forward, MFU does not.
  CHECK(m.hfu == doctest::Approx(m.mfu * 3e9 / 2e9));
}

// Compute slowed by the collectives beside it: the shared time, and the evaluator's use of it.
#include <doctest/doctest.h>

#include <algorithm>

#include "shared/cost/overlap_slowdown.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

TEST_CASE("shared_seconds: the time an interval shares with sorted disjoint busy intervals") {
  const std::vector<std::pair<double, double>> busy = {{1, 2}, {3, 5}, {6, 7}};
  CHECK(shared_seconds(0, 1, busy) == 0);
  CHECK(shared_seconds(0, 10, busy) == doctest::Approx(4));
  CHECK(shared_seconds(1.5, 3.5, busy) == doctest::Approx(1));
  CHECK(shared_seconds(4, 4.5, busy) == doctest::Approx(0.5));
  CHECK(shared_seconds(5, 6, busy) == 0);
  CHECK(shared_seconds(0, 10, {}) == 0);
}

TEST_CASE(
    "compute beside the overlapped gradient reduction runs slower, by the factor, and only "
    "there") {
  Diagnostics diag;
  const ModelSpec model = read_model(Json::parse(R"({"name": "m", "modules": [
    {"name": "llm", "role": "llm", "transformer": {"layers": 8, "hidden": 1024, "heads": 8,
     "ffn": 4096, "vocab": 1000}}]})"),
                                     "", "", diag);
  const WorkloadSpec workload =
      read_workload(Json::parse(R"({"global_batch": 8, "max_seq_len": 1024, "seed": 1,
                      "samples": {"text_tokens": 1024}})"),
                    "", "", ".", diag);
  const ClusterSpec c = read_cluster(Json::parse(R"({"name": "c", "nodes": 1, "devices_per_node": 4,
    "device": {"name": "g", "peak_flops": {"bf16": 1e14}, "memory_bytes": 8e10,
               "memory_bandwidth_bytes_per_s": 2e12},
    "intra_node": {"bandwidth_bytes_per_s": 2e11, "latency_s": 2e-6},
    "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 5e-6}})"),
                                     "", "", diag);
  REQUIRE(diag.ok());
  const auto step = [&](const char* plan_text, double factor, ComputeExtras* extras = nullptr) {
    Diagnostics d;
    const ParallelPlan plan = read_plan(Json::parse(plan_text), "", "", d);
    validate_plan(plan, model, workload, c, "", "", d);
    INFO(d.format());
    REQUIRE(d.ok());
    const Lowered l = lower(model, c, resolve_stage_split(plan, model, workload, c), workload,
                            draw_batch(workload, 0));
    REQUIRE(l.error.empty());
    CostParams params = default_cost_params(c);
    params.overlap_slowdown = factor;
    const CostModel cost(c, DType::kBf16, params, model);
    if (extras != nullptr) {
      *extras = overlap_slowdown_s(l.program, cost);
      // Never more than the factor's share of an op's compute.
      for (std::size_t r = 0; r < extras->size(); ++r)
        for (std::size_t i = 0; i < (*extras)[r].size(); ++i) {
          if (l.program.ranks[r][i].kind != OpKind::kCompute) {
            CHECK((*extras)[r][i] == 0);
            continue;
          }
          CHECK((*extras)[r][i] <=
                (factor - 1) * cost.compute_only_s(l.program, static_cast<int32_t>(r), i) + 1e-12);
        }
    }
    return evaluate(l.program, cost).step_s;
  };
  // The reduction bucketed behind the backward: compute runs beside it and sets the step.
  const char* overlapped =
      R"({"placement": "homogeneous", "layout": {"dp": 4}, "overlap_grad_reduce": true, "grad_bucket_mb": 4})";
  ComputeExtras extras;
  const double quiet = step(overlapped, 1);
  const double slowed = step(overlapped, 1.5, &extras);
  CHECK(slowed > quiet);
  double added = 0;
  for (const auto& rank : extras)
    for (double e : rank) added += e;
  CHECK(added > 0);
  // Every rank's compute stream carries its own extra, so the step grows by at most the largest.
  double most = 0;
  for (const auto& rank : extras) {
    double sum = 0;
    for (double e : rank) sum += e;
    most = std::max(most, sum);
  }
  CHECK(slowed <= quiet + most + 1e-9);
  // Without the overlap the reduction runs after the backward, beside no compute: no change.
  const char* serial = R"({"placement": "homogeneous", "layout": {"dp": 4}})";
  ComputeExtras none;
  CHECK(step(serial, 1.5, &none) == doctest::Approx(step(serial, 1)).epsilon(1e-12));
  for (const auto& rank : none)
    for (double e : rank) CHECK(e == 0);
}

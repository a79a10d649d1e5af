// evaluate(): executes a Program with the cost model and no network contention. Each stream of
// a rank is a serial resource; a receive completes when its send does (pre-posted receives);
// a collective starts when its last member reaches it. Exact for the model it implements, and
// the reference the SimGrid simulator must match with contention switched off.
// A folded Program (Program::represented_by) runs its representatives only; each represented
// rank's times are its representative's (its ops are empty here too), and its per-rank figures
// (compute_busy_s, peak_activation_bytes) are copied.
#pragma once

#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/program/program.hpp"

namespace tessera {

struct OpTime {
  double start_s = -1;
  double finish_s = -1;
};

// A collective measured inside a compute op (the executor's TP all-reduces, CP gathers).
struct NestedSlice {
  int32_t op = 0;  // index of the enclosing op on its rank
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double start_s = 0, finish_s = 0;
  double bytes = 0;
};

struct Timeline {
  std::vector<std::vector<OpTime>> ops;  // [rank][op] (a folded Program's representatives only)
  double step_s = 0;
  std::vector<double> compute_busy_s;  // per rank: time its compute stream was busy
  std::vector<double>
      peak_activation_bytes;  // per rank, from stash/release along the compute stream
  std::string error;  // non-empty when the program cannot finish (a deadlock), naming stuck ops
  std::vector<std::vector<NestedSlice>> nested;  // [rank]; executor only, may be empty
  int64_t activities = 0;  // simulator only: SimGrid activities started (flows, sleeps, executions)
  int64_t actors = 0;      // simulator only: actors run
  int64_t folded_flows = 0;  // simulator only: flows left out, simulated ones stood for them
  // Simulator only, nested collectives as timed activities: whether one of them may have run
  // while another transfer used its links (a compute op with nested collectives overlapped a
  // transfer over its rank's NVLink links, or a nested group spans nodes) — then ring flows
  // could give other times. False: ring flows would give exactly these.
  bool nested_shared_links = false;
};

// Seconds a Compute op runs beyond the cost model's time for it, per rank and op
// ([rank][op], a folded Program's representatives only); empty: none.
using ComputeExtras = std::vector<std::vector<double>>;

// The Program's timeline, its compute slowed where collectives run beside it:
// evaluate_with(program, cost, overlap_slowdown_s(program, cost)), timed once where nothing is
// slowed.
Timeline evaluate(const Program& program, const CostModel& cost);

// One pass with the given extra compute seconds (empty: the cost model's times alone).
Timeline evaluate_with(const Program& program, const CostModel& cost, const ComputeExtras& extra);

}  // namespace tessera

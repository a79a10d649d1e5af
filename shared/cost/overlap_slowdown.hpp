// Compute slowed by the collectives beside it. On a GPU an overlapped collective is not free to
// the compute it hides behind: NCCL's kernels hold SMs and draw on the same memory bandwidth.
// A compute op runs (overlap_slowdown - 1) times longer for every second its rank's collective
// stream runs beside it in the timeline without the slowdown (CostParams::overlap_slowdown;
// kernel-priced GPUs default to a published measurement, calibration fits it from traces).
// The evaluator and the SimGrid simulator both add these seconds, so they stay equal with
// contention off. The collectives nested in an op that hide behind its compute (TP
// communication overlap, the backward TP overlap, overlapped expert all-to-alls) slow it by the
// same rule, inside the op's price (CostModel::compute_only_s).
#pragma once

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/program/program.hpp"

namespace tessera {

// Per rank and compute op, the seconds it runs longer; empty when nothing is slowed (the factor
// is 1, no compute ran beside a collective, or the program cannot finish).
ComputeExtras overlap_slowdown_s(const Program& program, const CostModel& cost);
// The same from the program's timeline without the slowdown, evaluate_with(program, cost, {}).
ComputeExtras overlap_slowdown_s(const Program& program, const CostModel& cost,
                                 const Timeline& quiet);

// The seconds a compute part of `compute` seconds runs longer for `beside` seconds of collectives
// running beside it: (factor - 1) * min(beside, compute). Timeline overlap (above) and the
// collectives nested in an op that hide behind its compute (CostModel::compute_only_s) alike.
double slowed_s(double beside, double compute, double factor);

// The seconds `[start, finish)` shares with the sorted, disjoint `busy` intervals.
double shared_seconds(double start, double finish,
                      const std::vector<std::pair<double, double>>& busy);

}  // namespace tessera

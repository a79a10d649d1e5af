// A floor under a plan's memory that needs no lowering, for the search to drop plans that
// cannot fit before paying for their Programs.
#pragma once

#include "shared/cost/cost_model.hpp"
#include "shared/layout/parallel_plan.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera {

// The mean parameter state (weights, gradients, optimizer) over the plan's ranks: each module's
// state split over its TP and pipeline ranks, copied to each of its DP·CP replicas (the
// optimizer's divided over them with the distributed optimizer). The busiest rank needs at
// least this much before any activation, so a plan whose mean exceeds the device cannot fit.
// REQUIRES: plan validated against model.
RankMemory mean_parameter_memory(const ParallelPlan& plan, const ModelSpec& model);

}  // namespace tessera

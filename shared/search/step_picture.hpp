// One step of a plan as a picture: the ops of a few representative ranks with their start and
// finish from the analytic evaluator (no network contention), for the sweep report's timelines.
// The lanes are the first rank of each distinct set of (module, stage) pairs a rank computes —
// every pipeline stage, an encoder's ranks where they are apart — then the rank that computes
// longest (the one the others wait for) and, where data-parallel replicas run differently
// shaped micro-batches, a replica of the first rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/program/program.hpp"

namespace tessera {

// A run of ops of one kind back to back (a micro-batch's forward, consecutive sends...).
struct StepBar {
  double start_s = 0, finish_s = 0;
  int module = -1;  // Program::modules index; -1 for none (the gradient norm, say)
  Phase phase = Phase::kF;
  bool compute = true;  // compute or optimizer op; false: a transfer (send, receive, collective)
  int32_t ops = 1;      // ops merged into the bar
  std::string name;     // the first op's name (op_name)
};

struct StepLane {
  int64_t rank = 0;
  std::string label;          // "rank 8: llm s1", "rank 1: vision + llm s0 (another replica)"
  std::vector<StepBar> bars;  // by start
};

struct StepPicture {
  std::string error;  // why there is no picture (a refused plan, a deadlock)
  double step_s = 0;
  std::vector<std::string> modules;
  std::vector<StepLane> lanes;
};

// The picture of an evaluated, simulated or measured step (a recorded run's traced iteration).
StepPicture step_picture(const Program& program, const Timeline& timeline,
                         std::size_t max_lanes = 6);
// The same lanes as `lanes_of` (ranks and labels) drawn from another timeline of the step: the
// measured and the predicted side by side.
StepPicture step_picture_like(const StepPicture& lanes_of, const Program& program,
                              const Timeline& timeline);
// A plan's first iteration, lowered and evaluated (evaluate_step). REQUIRES: scenario
// validated, sized to the plan's devices.
StepPicture step_picture(const Scenario& scenario, const ParallelPlan& plan,
                         const CostParams& params, std::size_t max_lanes = 6);

}  // namespace tessera

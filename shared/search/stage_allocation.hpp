// Per-module stage counts under a device budget (Cornstarch; docs/ALGORITHMS.md §1): in a
// non-colocated pipeline every encoder and the LLM own consecutive stages of `tp · dp` devices
// each, the encoders side by side, the LLM after them. How many stages each module gets decides
// how long its stages take; a planner that ignores what is frozen gives a frozen encoder as many
// stages as a trainable one of its size, so its stages idle while the LLM's are the bottleneck.
//
// Both planners enumerate every way to share the budget's stages among the modules — and the
// homogeneous layout, where the encoders run in the LLM's first stage — and keep the plans that
// fit in memory; the frozen-aware planner ranks them by the estimated step of the real
// model with frozen-aware stage boundaries, the freeze-unaware one by the step of the same model
// with nothing frozen and equal layers per stage (what it believes), so its choice can then be
// priced on the real model beside the other's.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/search/estimate.hpp"

namespace tessera {

struct StageBudget {
  int64_t gpus = 0;  // devices in all
  int64_t tp = 1;    // tensor parallel size of every stage
  int64_t dp = 1;    // data-parallel replicas of every module
  int64_t micro_batch_size = 1;
};

struct StageCountPlan {
  // Per pipelined module, in model order. Encoders with 0 run in the LLM's first stage.
  std::vector<std::pair<std::string, int64_t>> stages;
  ParallelPlan plan;      // non_colocated with graph 1F1B, or homogeneous with 1F1B
  Estimate estimate;      // of the real model
  double believed_s = 0;  // the freeze-unaware planner's step (nothing frozen, equal layers)
};

struct StageAllocation {
  int64_t stages = 0;                          // gpus / (tp · dp)
  std::vector<StageCountPlan> frozen_aware;    // feasible, best first by estimate.metrics.step_s
  std::vector<StageCountPlan> freeze_unaware;  // feasible, best first by believed_s
  std::map<std::string, int64_t> rejected;     // reason -> count, of both planners
  // The LLM-centric layout on the same devices, what Megatron-LM does for a multimodal model:
  // homogeneous, the encoders and projectors in the LLM's first stage, equal layers per stage
  // (the freeze-unaware candidate without encoder stages, priced on the real model). Absent
  // (with the reason) when that layout is invalid or does not fit.
  std::optional<StageCountPlan> llm_centric;
  std::string llm_centric_reason;
};

// "vision 2 + llm 4" for a plan's stage counts.
std::string stage_counts_text(const std::vector<std::pair<std::string, int64_t>>& stages);

// Every split of the budget's stages among the model's encoders and LLM (each at least one stage,
// at most its layers) and the homogeneous layout, planned both ways. Problems with the budget
// itself (the devices do not make whole stages, fewer stages than modules) go to `diag` under
// "--gpus"/"--tp"/"--dp". REQUIRES: scenario validated.
StageAllocation allocate_stages(const Scenario& scenario, const StageBudget& budget,
                                const CostParams& cost, Diagnostics& diag);

}  // namespace tessera

#include "shared/search/stage_allocation.hpp"

#include <algorithm>
#include <functional>

#include "shared/model/model_math.hpp"
#include "shared/search/plan_search.hpp"
#include "shared/search/stage_split.hpp"

namespace tessera {

namespace {

struct Pipelined {
  std::string name;
  int64_t layers = 0;
  int64_t tp = 1;  // the budget's tp, or the largest divisor of it that divides the heads
};

// A stage keeps the budget's devices: where the heads do not divide its tp (InternViT-6B's 25),
// the module runs the largest tp that does and data-parallel over the rest.
int64_t module_tp(const TransformerArch& t, int64_t budget_tp) {
  int64_t tp = budget_tp;
  while (tp > 1 && (budget_tp % tp != 0 || !accepts_tp(t, tp))) --tp;
  return tp;
}

// Every way to give each module 1..layers stages, `total` in all.
std::vector<std::vector<int64_t>> compositions(const std::vector<Pipelined>& modules,
                                               int64_t total) {
  std::vector<std::vector<int64_t>> out;
  std::vector<int64_t> counts(modules.size(), 0);
  std::function<void(std::size_t, int64_t)> fill = [&](std::size_t i, int64_t left) {
    if (i + 1 == modules.size()) {
      if (left >= 1 && left <= modules[i].layers) {
        counts[i] = left;
        out.push_back(counts);
      }
      return;
    }
    const int64_t later = static_cast<int64_t>(modules.size() - i - 1);  // one stage each at least
    for (int64_t s = 1; s <= std::min(modules[i].layers, left - later); ++s) {
      counts[i] = s;
      fill(i + 1, left - s);
    }
  };
  // First: no encoder stages of their own — the encoders in the LLM's first stage.
  std::vector<int64_t> hosted(modules.size(), 0);
  if (!modules.empty() && total <= modules.back().layers) {
    hosted.back() = total;
    out.push_back(hosted);
  }
  if (!modules.empty()) fill(0, total);
  return out;
}

// Homogeneous when the encoders have no stages of their own (the LLM's tp for all), else
// non-colocated with the modules' spans in model order.
ParallelPlan plan_for(const std::vector<Pipelined>& modules, const std::vector<int64_t>& counts,
                      const StageBudget& budget, StageSplit split) {
  ParallelPlan p;
  p.micro_batch_size = budget.micro_batch_size;
  p.stage_split = split;
  p.sequence_parallel = budget.tp > 1;
  p.distributed_optimizer = budget.dp > 1;
  if (counts.front() == 0) {
    p.placement = Placement::kHomogeneous;
    p.schedule = Schedule::k1F1B;
    p.layout.tp = budget.tp;
    p.layout.pp = counts.back();
    p.layout.dp = budget.dp;
    return p;
  }
  p.placement = Placement::kNonColocated;
  p.schedule = Schedule::kGraph1F1B;
  int64_t first = 0;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    ModuleLayout l;
    l.tp = modules[i].tp;
    l.pp = counts[i];
    l.dp = budget.dp * (budget.tp / modules[i].tp);
    l.ranks = RankSpan{first, l.size()};
    first += l.size();
    p.modules.emplace_back(modules[i].name, l);
  }
  return p;
}

}  // namespace

std::string stage_counts_text(const std::vector<std::pair<std::string, int64_t>>& stages) {
  std::string out;
  for (const auto& [name, count] : stages)
    out += (out.empty() ? "" : " + ") + name +
           (count > 0 ? " " + std::to_string(count) : " in stage 1");
  return out;
}

StageAllocation allocate_stages(const Scenario& s, const StageBudget& budget,
                                const CostParams& cost, Diagnostics& diag) {
  StageAllocation out;
  if (budget.gpus < 1 || budget.tp < 1 || budget.dp < 1 || budget.micro_batch_size < 1) {
    diag.error("--gpus", "", "the budget needs gpus, tp, dp and micro-batch size >= 1");
    return out;
  }
  std::vector<Pipelined> modules;
  for (const ModuleSpec& m : s.model.modules)
    if (m.role == ModuleRole::kEncoder && m.transformer)
      modules.push_back({m.name, m.transformer->layers, module_tp(*m.transformer, budget.tp)});
  const ModuleSpec* llm = find_llm(s.model);
  if (llm != nullptr && llm->transformer)
    modules.push_back(
        {llm->name, llm->transformer->layers, module_tp(*llm->transformer, budget.tp)});
  if (modules.size() < 2) {
    diag.error(
        s.file, "model",
        "model " + s.model.name + " has no transformer encoder: there are no stages to share out");
    return out;
  }
  const int64_t per_stage = budget.tp * budget.dp;
  if (budget.gpus % per_stage != 0) {
    diag.error("--gpus", "",
               std::to_string(budget.gpus) + " devices do not make whole stages of tp " +
                   std::to_string(budget.tp) + " x dp " + std::to_string(budget.dp));
    return out;
  }
  out.stages = budget.gpus / per_stage;
  if (out.stages < static_cast<int64_t>(modules.size())) {
    diag.error("--gpus", "",
               std::to_string(out.stages) + " stages for " + std::to_string(modules.size()) +
                   " pipelined modules: each needs one at least");
    return out;
  }
  Scenario sized = s;
  sized.cluster = cluster_with_devices(s.cluster, budget.gpus);
  // What a planner that ignores freezing believes: every module trains.
  Scenario trainable = sized;
  for (ModuleSpec& m : trainable.model.modules) m.frozen = false;

  for (const std::vector<int64_t>& counts : compositions(modules, out.stages)) {
    std::vector<std::pair<std::string, int64_t>> stages;
    for (std::size_t i = 0; i < modules.size(); ++i)
      stages.emplace_back(modules[i].name, counts[i]);
    for (StageSplit split : {StageSplit::kFrozenAware, StageSplit::kUniform}) {
      ParallelPlan plan = plan_for(modules, counts, budget, split);
      Diagnostics check;
      validate_plan(plan, sized.model, sized.workload, sized.cluster, "", "", check);
      if (!check.ok()) {
        ++out.rejected[rejection_reason(check.errors().front().message)];
        if (counts.front() == 0)
          out.llm_centric_reason =
              check.errors().front().path + ": " + check.errors().front().message;
        continue;
      }
      plan = resolve_stage_split(plan, sized.model, sized.workload, sized.cluster, &cost);
      StageCountPlan candidate{stages, plan, estimate(sized, plan, 0, cost), 0};
      const bool llm_centric = counts.front() == 0 && split == StageSplit::kUniform;
      if (llm_centric && (candidate.estimate.metrics.step_s <= 0 || !candidate.estimate.feasible))
        out.llm_centric_reason = candidate.estimate.reason;
      else if (llm_centric)
        out.llm_centric = candidate;
      if (candidate.estimate.metrics.step_s <= 0 || !candidate.estimate.feasible) {
        ++out.rejected[candidate.estimate.metrics.step_s <= 0
                           ? rejection_reason(candidate.estimate.reason)
                           : "memory"];
        continue;
      }
      if (split == StageSplit::kFrozenAware) {
        out.frozen_aware.push_back(std::move(candidate));
        continue;
      }
      const Estimate believed = estimate(trainable, plan, 0, cost);
      if (believed.metrics.step_s <= 0) {
        ++out.rejected[rejection_reason(believed.reason)];
        continue;
      }
      candidate.believed_s = believed.metrics.step_s;
      out.freeze_unaware.push_back(std::move(candidate));
    }
  }
  // Ties go to the earlier composition (fewer encoder stages first), so the order is total.
  std::stable_sort(out.frozen_aware.begin(), out.frozen_aware.end(),
                   [](const StageCountPlan& a, const StageCountPlan& b) {
                     return a.estimate.metrics.step_s < b.estimate.metrics.step_s;
                   });
  std::stable_sort(
      out.freeze_unaware.begin(), out.freeze_unaware.end(),
      [](const StageCountPlan& a, const StageCountPlan& b) { return a.believed_s < b.believed_s; });
  return out;
}

}  // namespace tessera

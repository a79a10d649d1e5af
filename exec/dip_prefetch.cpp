#include "exec/dip_prefetch.hpp"

#include <chrono>
#include <utility>

#include "shared/base/check.hpp"

namespace tessera::exec {

DipPrefetcher::DipPrefetcher(const Scenario& scenario, const ParallelPlan& plan,
                             DatasetKind dataset)
    : scenario_(scenario),
      dataset_(dataset),
      cost_(scenario.cluster, scenario.model.dtype, default_cost_params(scenario.cluster),
            scenario.model),
      planner_(scenario, plan, cost_) {}

TrainBatch DipPrefetcher::batch(int64_t iteration) {
  std::optional<TrainBatch> ahead = std::exchange(next_batch_, std::nullopt);
  if (ahead && ahead->batch.iteration == iteration) return std::move(*ahead);
  return make_batch(scenario_, dataset_, iteration);
}

DipStepInfo DipPrefetcher::schedule_for_step(int64_t iteration, const Comm& world) {
  DipStepInfo info;
  const bool pending = next_.valid();
  const bool ready =
      pending && next_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  torch::Tensor flag = torch::tensor({ready ? 1.0 : 0.0}, torch::kFloat64);
  all_reduce(world, flag, c10d::ReduceOp::MIN);
  if (flag.item<double>() > 0.5) {
    const DipSearchResult r = next_.get();
    TESSERA_CHECK(r.error.empty(), r.error);
    schedule_ = r.schedule;
    info.searched = true;
    info.search_s = r.seconds;
    info.scored = r.scored;
    info.cached = r.cached;
  } else {
    info.late = pending;
  }
  info.schedule = schedule_;
  if (!next_.valid()) {
    next_batch_ = make_batch(scenario_, dataset_, iteration + 1);
    next_ = std::async(std::launch::async, [this, batch = next_batch_->batch, start = schedule_] {
      return planner_.search(batch, start, /*move_layers=*/false);
    });
  }
  return info;
}

}  // namespace tessera::exec

#include "shared/cost/overlap_slowdown.hpp"

#include <algorithm>

namespace tessera {

double slowed_s(double beside, double compute, double factor) {
  return factor > 1 && beside > 0 ? (factor - 1) * std::min(beside, compute) : 0;
}

double shared_seconds(double start, double finish,
                      const std::vector<std::pair<double, double>>& busy) {
  // The first interval that ends after `start`.
  auto it = std::upper_bound(busy.begin(), busy.end(), start,
                             [](double s, const auto& b) { return s < b.second; });
  double shared = 0;
  for (; it != busy.end() && it->first < finish; ++it)
    shared += std::min(finish, it->second) - std::max(start, it->first);
  return shared;
}

namespace {

bool beside(const Op& op) {
  return op.kind == OpKind::kCollective && op.stream == StreamKind::kCollective;
}

bool slows(const Program& p, const CostModel& cost) {
  return cost.params().overlap_slowdown > 1 &&
         std::any_of(p.ranks.begin(), p.ranks.end(), [](const std::vector<Op>& ops) {
           return std::any_of(ops.begin(), ops.end(), beside);
         });
}

}  // namespace

ComputeExtras overlap_slowdown_s(const Program& p, const CostModel& cost) {
  if (!slows(p, cost)) return {};
  return overlap_slowdown_s(p, cost, evaluate_with(p, cost, {}));
}

ComputeExtras overlap_slowdown_s(const Program& p, const CostModel& cost, const Timeline& quiet) {
  const double factor = cost.params().overlap_slowdown;
  // A rank without collectives on its stream has nothing to slow (the loop finds them).
  if (factor <= 1 || !quiet.error.empty()) return {};
  ComputeExtras extra(p.ranks.size());
  bool any = false;
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const std::vector<Op>& ops = p.ranks[r];
    extra[r].assign(ops.size(), 0);
    std::vector<std::pair<double, double>> busy;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (beside(ops[i]) && quiet.ops[r][i].finish_s > quiet.ops[r][i].start_s)
        busy.emplace_back(quiet.ops[r][i].start_s, quiet.ops[r][i].finish_s);
    if (busy.empty()) continue;
    // One collective stream per rank runs one collective at a time; sorted, they are disjoint.
    std::sort(busy.begin(), busy.end());
    // An op with nested collectives computes for its compute part alone.
    for (std::size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != OpKind::kCompute) continue;
      const double shared = shared_seconds(quiet.ops[r][i].start_s, quiet.ops[r][i].finish_s, busy);
      if (shared <= 0) continue;
      extra[r][i] = slowed_s(shared, cost.compute_only_s(p, static_cast<int32_t>(r), i), factor);
      any = true;
    }
  }
  if (!any) return {};
  return extra;
}

}  // namespace tessera

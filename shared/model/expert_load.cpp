#include "shared/model/expert_load.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "shared/base/check.hpp"
#include "shared/base/random.hpp"

namespace tessera {

ExpertLoad expert_load(int64_t experts, int64_t ep, double capacity_factor, double skew,
                       uint64_t seed, int64_t layer) {
  TESSERA_CHECK(experts >= 1 && ep >= 1 && experts % ep == 0 && skew >= 0);
  TESSERA_CHECK(capacity_factor == 0 || capacity_factor >= 1);
  if (skew == 0) return {};  // even shares: every rank gets its share, nothing is dropped
  // Zipf weights, dealt to the experts in an order drawn for this layer (Fisher-Yates).
  std::vector<double> share(static_cast<std::size_t>(experts));
  double total = 0;
  for (int64_t i = 0; i < experts; ++i) {
    share[static_cast<std::size_t>(i)] = 1.0 / std::pow(static_cast<double>(i + 1), skew);
    total += share[static_cast<std::size_t>(i)];
  }
  Rng rng(mix64(seed ^ mix64(static_cast<uint64_t>(layer) + 0x9e3779b97f4a7c15ULL)));
  for (int64_t i = experts - 1; i > 0; --i)
    std::swap(share[static_cast<std::size_t>(i)],
              share[static_cast<std::size_t>(rng.uniform_int(0, i))]);
  // Each expert's tokens in units of its even share, clipped at the capacity.
  const auto e = static_cast<double>(experts);
  double kept = 0, busiest = 0;
  const int64_t local = experts / ep;
  for (int64_t r = 0; r < ep; ++r) {
    double rank_load = 0;
    for (int64_t i = r * local; i < (r + 1) * local; ++i) {
      double load = share[static_cast<std::size_t>(i)] / total * e;
      if (capacity_factor > 0) load = std::min(load, capacity_factor);
      rank_load += load;
    }
    kept += rank_load;
    busiest = std::max(busiest, rank_load);
  }
  return {busiest / static_cast<double>(local), kept / e};
}

}  // namespace tessera

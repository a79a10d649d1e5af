// How unevenly a mixture-of-experts router spreads tokens over the ranks of an expert-parallel
// group, and so how long the busiest rank's experts run while the others wait at the combining
// all-to-all.
//
// The stated distribution: in layer l, the experts in an order drawn from (seed, l) take shares
// of the routed tokens proportional to 1 / i^skew for the i-th of them (a Zipf law; skew 0 gives
// every expert its even share). EP rank r holds experts [r·E/ep, (r+1)·E/ep), Megatron's
// contiguous local experts. With a capacity factor c an expert keeps at most c times its even
// share and drops the rest; dropless, it keeps all.
#pragma once

#include <cstdint>

namespace tessera {

struct ExpertLoad {
  // Tokens the busiest EP rank's experts process, over the group's even share per rank (≥ 1
  // dropless; ≤ the capacity factor otherwise).
  double busiest = 1;
  double kept = 1;  // the fraction of routed tokens an expert keeps (1 dropless)
};

// One layer's load. REQUIRES: experts >= 1, ep >= 1 divides experts, skew >= 0,
// capacity_factor 0 or >= 1.
ExpertLoad expert_load(int64_t experts, int64_t ep, double capacity_factor, double skew,
                       uint64_t seed, int64_t layer);

}  // namespace tessera

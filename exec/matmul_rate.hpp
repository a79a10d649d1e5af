// The dense matrix-product rate a device reaches: the measured ceiling that MFU is read against
// beside the datasheet peak. Random operands (zeros run faster than real data), warm-up products
// first, then rounds of products timed end to end after a synchronisation; the median round.
#pragma once

#include <cstdint>

#include <torch/types.h>

namespace tessera::exec {

struct MatmulRate {
  double flops_per_s = 0;  // median round
  double min_flops_per_s = 0, max_flops_per_s = 0;
  int64_t n = 0;  // n x n x n products
  int rounds = 0, per_round = 0;
};

// REQUIRES: the device setting (device.hpp) is made; n >= 1, rounds >= 1, per_round >= 1.
MatmulRate measure_matmul_rate(torch::ScalarType dtype, int64_t n, int rounds, int per_round);

}  // namespace tessera::exec

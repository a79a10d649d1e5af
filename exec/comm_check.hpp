// comm-check: an all-reduce sanity and speed check of the process group, in the NCCL-tests
// convention (algorithm bandwidth S/t, bus bandwidth 2(n-1)/n · S/t for all-reduce).
#pragma once

#include <cstdint>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "exec/torch_compat.hpp"

namespace tessera::exec {

struct CommCheckResult {
  bool correct = false;  // every element equals the sum of the ranks' contributions
  double seconds = 0;    // median time of one all-reduce
  double algorithm_bandwidth_bytes_per_s = 0;
  double bus_bandwidth_bytes_per_s = 0;
  std::string problem;  // what was wrong when !correct
};

// All-reduces a float32 tensor of `bytes` bytes `iterations` times (after one warm-up); rank r
// contributes r + 1 everywhere, so the result must be n(n+1)/2.
CommCheckResult run_comm_check(CollectiveGroup& group, int64_t bytes, int iterations);

}  // namespace tessera::exec

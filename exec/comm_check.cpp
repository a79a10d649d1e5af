#include "exec/comm_check.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "exec/torch_api.hpp"

namespace tessera::exec {

CommCheckResult run_comm_check(CollectiveGroup& group, int64_t bytes, int iterations) {
  CommCheckResult result;
  const int n = group.getSize();
  const int64_t elements = std::max<int64_t>(1, bytes / static_cast<int64_t>(sizeof(float)));
  const float expected = static_cast<float>(n) * static_cast<float>(n + 1) / 2.0F;
  std::vector<double> times;
  for (int i = 0; i <= iterations; ++i) {  // iteration 0 warms up
    std::vector<at::Tensor> tensors{
        torch::full({elements}, static_cast<float>(group.getRank() + 1))};
    const auto start = std::chrono::steady_clock::now();
    group.allreduce(tensors)->wait();
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) times.push_back(t);
    const float lo = tensors[0].min().item<float>();
    const float hi = tensors[0].max().item<float>();
    if (lo != expected || hi != expected) {
      result.problem = "all-reduce gave values in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "], expected " + std::to_string(expected);
      return result;
    }
  }
  std::sort(times.begin(), times.end());
  result.correct = true;
  result.seconds = times.empty() ? 0 : times[times.size() / 2];
  const double size = static_cast<double>(elements) * sizeof(float);
  if (result.seconds > 0) {
    result.algorithm_bandwidth_bytes_per_s = size / result.seconds;
    result.bus_bandwidth_bytes_per_s = result.algorithm_bandwidth_bytes_per_s * 2.0 * (n - 1) / n;
  }
  return result;
}

}  // namespace tessera::exec

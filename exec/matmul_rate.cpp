#include "exec/matmul_rate.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/cuda.hpp"
#include "exec/device.hpp"

namespace tessera::exec {

MatmulRate measure_matmul_rate(torch::ScalarType dtype, int64_t n, int rounds, int per_round) {
  const auto options = on_device(dtype);
  // Two operand pairs used in turn, so that no product reads what the last one left in cache.
  const std::vector<torch::Tensor> a{torch::randn({n, n}, options), torch::randn({n, n}, options)};
  const std::vector<torch::Tensor> b{torch::randn({n, n}, options), torch::randn({n, n}, options)};
  torch::Tensor c = torch::empty({n, n}, options);
  const bool gpu = device_setting().device.is_cuda();
  auto settle = [&] {
    if (gpu) cuda_synchronize();
  };
  for (int i = 0; i < 3; ++i) torch::matmul_out(c, a[i % 2], b[i % 2]);  // warm-up
  settle();
  std::vector<double> rates;
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < per_round; ++i) torch::matmul_out(c, a[i % 2], b[i % 2]);
    settle();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(flops * per_round / s);
  }
  std::sort(rates.begin(), rates.end());
  MatmulRate out;
  out.flops_per_s = rates[rates.size() / 2];
  out.min_flops_per_s = rates.front();
  out.max_flops_per_s = rates.back();
  out.n = n;
  out.rounds = rounds;
  out.per_round = per_round;
  return out;
}

}  // namespace tessera::exec

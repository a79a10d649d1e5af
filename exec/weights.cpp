#include "exec/weights.hpp"

#include <cmath>

#include "shared/base/check.hpp"

namespace tessera::exec {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return h;
}

}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return splitmix(splitmix(splitmix(splitmix(seed) ^ a) ^ b) ^ c);
}

double stream_uniform(uint64_t key, uint64_t n) {
  return static_cast<double>(splitmix(key ^ splitmix(n)) >> 11) * 0x1.0p-53;
}

torch::Tensor seeded_uniform(uint64_t seed, const std::string& name, at::IntArrayRef shape,
                             double scale) {
  torch::Tensor t = torch::empty(shape, torch::kFloat32);
  const uint64_t key = splitmix(seed) ^ name_hash(name);
  float* data = t.data_ptr<float>();
  const double half_width = scale * std::sqrt(3.0);
  for (int64_t i = 0; i < t.numel(); ++i)
    data[i] =
        static_cast<float>((2 * stream_uniform(key, static_cast<uint64_t>(i)) - 1) * half_width);
  return t;
}

torch::Tensor shard(const torch::Tensor& full, int64_t dim, int64_t index, int64_t parts) {
  TESSERA_CHECK(parts >= 1 && full.size(dim) % parts == 0,
                "a tensor of " + std::to_string(full.size(dim)) + " along dim " +
                    std::to_string(dim) + " cannot be cut into " + std::to_string(parts) +
                    " shards");
  const int64_t n = full.size(dim) / parts;
  return full.narrow(dim, index * n, n).contiguous();
}

}  // namespace tessera::exec

// Deterministic weights: every element is a function of (global seed, parameter name, element
// index in the full, unsharded tensor), so any plan — whatever its TP shards or pipeline stages —
// starts from the same model, and a parallel run can be compared with the single-rank one.
#pragma once

#include <cstdint>
#include <string>

#include "exec/torch_api.hpp"

namespace tessera::exec {

// Uniform in [-scale·√3, scale·√3) (standard deviation `scale`), float32, full shape.
torch::Tensor seeded_uniform(uint64_t seed, const std::string& name, at::IntArrayRef shape,
                             double scale);

// The `index`-th of `parts` equal slices of `full` along `dim` (a TP shard), contiguous.
// REQUIRES: parts divides full.size(dim).
torch::Tensor shard(const torch::Tensor& full, int64_t dim, int64_t index, int64_t parts);

// A hash of (seed, key words) for per-sample data streams.
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);

// The n-th value of the stream `key`, uniform in [0, 1).
double stream_uniform(uint64_t key, uint64_t n);

}  // namespace tessera::exec

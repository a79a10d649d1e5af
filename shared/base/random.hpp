// Deterministic random numbers. std:: distributions differ between standard libraries, so the
// workload draws through these, and a (seed, iteration) pair gives the same batch everywhere.
#pragma once

#include <cstdint>

namespace tessera {

// SplitMix64 finaliser: a good 64-bit mix of `x`, used to derive independent streams.
uint64_t mix64(uint64_t x);

// xoshiro256** seeded through SplitMix64.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Standard normal (Box-Muller; no cached second value, so draws stay independent of order).
  double normal();
  // Uniform integer in [lo, hi]. REQUIRES: lo <= hi.
  int64_t uniform_int(int64_t lo, int64_t hi);

 private:
  uint64_t s_[4];
};

}  // namespace tessera

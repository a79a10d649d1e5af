#include "shared/context_split.hpp"

#include "shared/check.hpp"

namespace tessera {

std::vector<std::vector<int64_t>> context_split(CpSplit policy, int64_t tokens, int64_t cp) {
  TESSERA_CHECK(cp >= 1 && tokens >= 0);
  std::vector<std::vector<int64_t>> out(static_cast<std::size_t>(cp));
  auto take = [&](int64_t rank, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) out[static_cast<std::size_t>(rank)].push_back(t);
  };
  if (policy == CpSplit::kZigzag) {
    const int64_t chunks = 2 * cp;
    auto bound = [&](int64_t c) { return c * tokens / chunks; };
    for (int64_t r = 0; r < cp; ++r) {
      take(r, bound(r), bound(r + 1));
      take(r, bound(chunks - 1 - r), bound(chunks - r));
    }
    return out;
  }
  for (int64_t r = 0; r < cp; ++r) take(r, r * tokens / cp, (r + 1) * tokens / cp);
  return out;
}

}  // namespace tessera

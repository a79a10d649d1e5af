#include "shared/layout/schedule.hpp"

#include <algorithm>

#include "shared/base/check.hpp"

namespace tessera {

std::vector<ScheduleItem> gpipe_order(int32_t m) {
  std::vector<ScheduleItem> order;
  for (int32_t i = 0; i < m; ++i) order.push_back({i, 0, false});
  for (int32_t i = m - 1; i >= 0; --i) order.push_back({i, 0, true});
  return order;
}

std::vector<ScheduleItem> one_f_one_b_order(int32_t m, int32_t warmup) {
  warmup = std::clamp(warmup, 0, m);
  std::vector<ScheduleItem> order;
  int32_t next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) order.push_back({next_f, 0, false});
  while (next_f < m) {
    order.push_back({next_f++, 0, false});
    order.push_back({next_b++, 0, true});
  }
  while (next_b < m) order.push_back({next_b++, 0, true});
  return order;
}

std::vector<ScheduleItem> interleaved_order(int32_t m, int32_t p, int32_t stage, int32_t v) {
  TESSERA_CHECK(m % p == 0, "interleaved 1F1B needs micro-batches divisible by stages");
  const int32_t total = m * v;
  auto item = [&](int32_t k, bool backward) {
    const int32_t in_group = k % (p * v);
    int32_t chunk = in_group / p;
    if (backward) chunk = v - 1 - chunk;
    return ScheduleItem{(k / (p * v)) * p + k % p, chunk, backward};
  };
  const int32_t warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  std::vector<ScheduleItem> order;
  int32_t next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) order.push_back(item(next_f, false));
  while (next_f < total) {
    order.push_back(item(next_f++, false));
    order.push_back(item(next_b++, true));
  }
  while (next_b < total) order.push_back(item(next_b++, true));
  return order;
}

std::vector<ScheduleItem> forward_only_order(int32_t m) {
  std::vector<ScheduleItem> order;
  for (int32_t i = 0; i < m; ++i) order.push_back({i, 0, false});
  return order;
}

}  // namespace tessera

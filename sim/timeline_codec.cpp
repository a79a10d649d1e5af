#include "sim/timeline_codec.hpp"

#include <cstring>

namespace tessera::sim {

// Counters, then every op's start and finish, then each rank's nested slices (count first),
// then the error text.
std::string serialize_timeline(const Timeline& t) {
  std::string out;
  out.append(reinterpret_cast<const char*>(&t.activities), sizeof t.activities);
  out.append(reinterpret_cast<const char*>(&t.actors), sizeof t.actors);
  out.append(reinterpret_cast<const char*>(&t.folded_flows), sizeof t.folded_flows);
  const int64_t shared = t.nested_shared_links ? 1 : 0;
  out.append(reinterpret_cast<const char*>(&shared), sizeof shared);
  for (const auto& ops : t.ops)
    for (const OpTime& o : ops) out.append(reinterpret_cast<const char*>(&o), sizeof o);
  for (std::size_t r = 0; r < t.ops.size(); ++r) {
    const int64_t n = r < t.nested.size() ? static_cast<int64_t>(t.nested[r].size()) : 0;
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    for (int64_t k = 0; k < n; ++k)
      out.append(reinterpret_cast<const char*>(&t.nested[r][static_cast<std::size_t>(k)]),
                 sizeof(NestedSlice));
  }
  return out + t.error;
}

Timeline deserialize_timeline(const std::string& bytes, const Program& p) {
  Timeline t;
  std::size_t at = 4 * sizeof(int64_t);
  if (bytes.size() < at) {
    t.error = "simulation returned no timeline";
    return t;
  }
  std::memcpy(&t.activities, bytes.data(), sizeof t.activities);
  std::memcpy(&t.actors, bytes.data() + sizeof t.activities, sizeof t.actors);
  std::memcpy(&t.folded_flows, bytes.data() + 2 * sizeof(int64_t), sizeof t.folded_flows);
  int64_t shared = 0;
  std::memcpy(&shared, bytes.data() + 3 * sizeof(int64_t), sizeof shared);
  t.nested_shared_links = shared != 0;
  t.ops.resize(p.ranks.size());
  t.compute_busy_s.assign(p.ranks.size(), 0);
  t.peak_activation_bytes.assign(p.ranks.size(), 0);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    t.ops[r].resize(p.ranks[r].size());
    for (std::size_t i = 0; i < p.ranks[r].size(); ++i) {
      if (at + sizeof(OpTime) > bytes.size()) {
        t.error = "simulation returned a truncated timeline";
        return t;
      }
      std::memcpy(&t.ops[r][i], bytes.data() + at, sizeof(OpTime));
      at += sizeof(OpTime);
      const OpTime& o = t.ops[r][i];
      t.step_s = std::max(t.step_s, o.finish_s);
      if (p.ranks[r][i].stream == StreamKind::kCompute && p.ranks[r][i].kind != OpKind::kRecv)
        t.compute_busy_s[r] += o.finish_s - o.start_s;
    }
  }
  for (std::size_t r = 0; r < p.ranks.size(); ++r)  // a folded Program's represented ranks
    t.compute_busy_s[r] =
        t.compute_busy_s[static_cast<std::size_t>(representative(p, static_cast<int64_t>(r)))];
  t.nested.resize(p.ranks.size());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    int64_t n = 0;
    if (at + sizeof n > bytes.size()) {
      t.error = "simulation returned a truncated timeline";
      return t;
    }
    std::memcpy(&n, bytes.data() + at, sizeof n);
    at += sizeof n;
    if (n < 0 || at + static_cast<std::size_t>(n) * sizeof(NestedSlice) > bytes.size()) {
      t.error = "simulation returned a truncated timeline";
      return t;
    }
    t.nested[r].resize(static_cast<std::size_t>(n));
    if (n > 0)
      std::memcpy(t.nested[r].data(), bytes.data() + at,
                  static_cast<std::size_t>(n) * sizeof(NestedSlice));
    at += static_cast<std::size_t>(n) * sizeof(NestedSlice);
  }
  t.error = bytes.substr(at);
  return t;
}

}  // namespace tessera::sim

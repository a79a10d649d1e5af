#include "sim/twins.hpp"

#include <map>

namespace tessera::sim {

namespace {

bool same_ops(const Op& a, const Op& b) {
  if (a.kind != b.kind || a.stream != b.stream || a.phase != b.phase ||
      a.collective != b.collective || a.purpose != b.purpose || a.module != b.module ||
      a.stage != b.stage || a.chunk != b.chunk || a.microbatch != b.microbatch ||
      a.sub_microbatch != b.sub_microbatch || a.layers != b.layers || a.tokens != b.tokens ||
      a.flops != b.flops || a.memory_bytes != b.memory_bytes ||
      a.message_bytes != b.message_bytes || a.stash_bytes != b.stash_bytes ||
      a.release_bytes != b.release_bytes || a.tag != b.tag || a.deps != b.deps ||
      a.nested.size() != b.nested.size())
    return false;
  for (std::size_t n = 0; n < a.nested.size(); ++n) {
    const NestedCollective& x = a.nested[n];
    const NestedCollective& y = b.nested[n];
    if (x.kind != y.kind || x.purpose != y.purpose || x.count != y.count || x.bytes != y.bytes)
      return false;
  }
  return true;
}

// Group `b` is `a` itself or `a` with every member moved by `delta`.
bool same_or_translated(const Program& p, int32_t a, int32_t b, int32_t delta) {
  if (a == b) return true;
  const RankList& ga = p.groups[static_cast<std::size_t>(a)];
  const RankList& gb = p.groups[static_cast<std::size_t>(b)];
  if (ga.size() != gb.size()) return false;
  for (std::size_t i = 0; i < ga.size(); ++i)
    if (gb[i] != ga[i] + delta) return false;
  return true;
}

bool translated(const Program& p, int32_t l, int32_t delta) {
  const auto& a = p.ranks[static_cast<std::size_t>(l)];
  const auto& b = p.ranks[static_cast<std::size_t>(l + delta)];
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!same_ops(a[i], b[i])) return false;
    if ((a[i].kind == OpKind::kSend || a[i].kind == OpKind::kRecv) &&
        b[i].peer != a[i].peer + delta)
      return false;
    if (a[i].kind == OpKind::kCollective && !same_or_translated(p, a[i].group, b[i].group, delta))
      return false;
    for (std::size_t n = 0; n < a[i].nested.size(); ++n)
      if (!same_or_translated(p, a[i].nested[n].group, b[i].nested[n].group, delta)) return false;
  }
  return true;
}

uint64_t signature(const std::vector<Op>& ops) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](uint64_t x) { h = (h ^ x) * 1099511628211ULL; };
  for (const Op& op : ops) {
    mix(static_cast<uint64_t>(op.kind) | static_cast<uint64_t>(op.phase) << 8 |
        static_cast<uint64_t>(op.stream) << 16);
    mix(static_cast<uint64_t>(op.module) << 32 |
        static_cast<uint64_t>(static_cast<uint32_t>(op.microbatch)));
    mix(static_cast<uint64_t>(op.tokens));
    mix(static_cast<uint64_t>(op.memory_bytes + op.message_bytes));
    mix(op.deps.size() | op.nested.size() << 16);
  }
  return h ^ ops.size();
}

}  // namespace

Twins find_twins(const Program& p) {
  const auto world = static_cast<int32_t>(p.ranks.size());
  Twins t;
  t.leader.resize(static_cast<std::size_t>(world));
  for (int32_t r = 0; r < world; ++r) t.leader[static_cast<std::size_t>(r)] = r;
  std::map<uint64_t, std::vector<int32_t>> buckets;
  for (int32_t r = 0; r < world; ++r)
    buckets[signature(p.ranks[static_cast<std::size_t>(r)])].push_back(r);
  for (const auto& [sig, ranks] : buckets)
    for (std::size_t k = 1; k < ranks.size(); ++k)
      if (translated(p, ranks.front(), ranks[k] - ranks.front()))
        t.leader[static_cast<std::size_t>(ranks[k])] = ranks.front();

  // Closure: a twin whose peers or fellow group members are not twins with the same offset may
  // see different arrival times; it runs on its own.
  auto twin = [&](int64_t a, int64_t b) {
    return t.leader[static_cast<std::size_t>(a)] == t.leader[static_cast<std::size_t>(b)];
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < world; ++r) {
      const int32_t l = t.leader[static_cast<std::size_t>(r)];
      if (l == r) continue;
      const int32_t delta = r - l;
      bool ok = true;
      const auto& ops = p.ranks[static_cast<std::size_t>(l)];
      for (std::size_t i = 0; i < ops.size() && ok; ++i) {
        const Op& op = ops[i];
        if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv)
          ok = twin(op.peer, op.peer + delta);
        auto members_ok = [&](int32_t group, int32_t twin_group) {
          if (group == twin_group) return true;
          for (int64_t m : p.groups[static_cast<std::size_t>(group)])
            if (!twin(m, m + delta)) return false;
          return true;
        };
        const auto& mine = p.ranks[static_cast<std::size_t>(r)][i];
        if (op.kind == OpKind::kCollective) ok = ok && members_ok(op.group, mine.group);
        for (std::size_t n = 0; n < op.nested.size() && ok; ++n)
          ok = members_ok(op.nested[n].group, mine.nested[n].group);
      }
      if (!ok) {
        t.leader[static_cast<std::size_t>(r)] = r;
        changed = true;
      }
    }
  }
  t.offsets.resize(static_cast<std::size_t>(world));
  for (int32_t r = 0; r < world; ++r) {
    const int32_t l = t.leader[static_cast<std::size_t>(r)];
    t.offsets[static_cast<std::size_t>(l)].push_back(r - l);
  }
  for (int32_t r = 0; r < world; ++r)
    if (t.leader[static_cast<std::size_t>(r)] == r) ++t.classes;
  return t;
}

}  // namespace tessera::sim

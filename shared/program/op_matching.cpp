#include "shared/program/op_matching.hpp"

#include <algorithm>
#include <iterator>
#include <unordered_map>

namespace tessera {

namespace {

// A receive posted on a rank, found by the (source, tag) of the send it pairs with.
struct Receive {
  int64_t from, tag;
  int32_t op;
  bool operator<(const Receive& o) const { return from != o.from ? from < o.from : tag < o.tag; }
};

}  // namespace

OpMatching match_ops(const Program& p) {
  const std::size_t world = p.ranks.size();
  OpMatching m;
  m.instance_of.resize(world);
  m.peer_op.resize(world);
  // Hash maps: at 8192 ranks there are millions of ops. An instance's key packs (group,
  // sequence, nested) into 64 bits.
  std::unordered_map<uint64_t, int32_t> ids;
  auto instance = [&](int32_t group, int32_t sequence, bool nested) {
    const uint64_t key = static_cast<uint64_t>(group) << 33 | static_cast<uint64_t>(sequence) << 1 |
                         static_cast<uint64_t>(nested);
    const auto [it, added] = ids.emplace(key, static_cast<int32_t>(m.instance_group.size()));
    if (added) {
      m.instance_group.push_back(group);
      m.instance_sequence.push_back(sequence);
      m.instance_nested.push_back(static_cast<char>(nested));
    }
    return it->second;
  };
  // Per rank, its receives sorted by (source, tag): millions at 8192 ranks, searched by
  // bisection in contiguous memory rather than through a hash table's chains.
  std::vector<std::vector<Receive>> receives(world);
  // Per group, how many of its collectives (stream, nested) this rank has entered so far.
  std::vector<int32_t> seen(p.groups.size(), 0), seen_nested(p.groups.size(), 0);
  std::vector<int32_t> touched;
  for (std::size_t r = 0; r < world; ++r) {
    const auto& ops = p.ranks[r];
    m.instance_of[r].assign(ops.size(), -1);
    m.peer_op[r].assign(ops.size(), -1);
    for (int32_t g : touched)
      seen[static_cast<std::size_t>(g)] = seen_nested[static_cast<std::size_t>(g)] = 0;
    touched.clear();
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      if (op.kind == OpKind::kRecv) receives[r].push_back({op.peer, op.tag, i});
      if (op.kind == OpKind::kCollective) {
        touched.push_back(op.group);
        m.instance_of[r][static_cast<std::size_t>(i)] =
            instance(op.group, seen[static_cast<std::size_t>(op.group)]++, false);
      }
      for (std::size_t n = 0; n < op.nested.size(); ++n) {
        const int32_t g = op.nested[n].group;
        touched.push_back(g);
        if (n == 0)
          m.instance_of[r][static_cast<std::size_t>(i)] =
              static_cast<int32_t>(m.nested_instance.size());
        m.nested_instance.push_back(instance(g, seen_nested[static_cast<std::size_t>(g)]++, true));
      }
    }
  }
  // Of equal keys the last posted receive pairs (stable order), as a map overwritten would.
  for (auto& posted : receives) std::stable_sort(posted.begin(), posted.end());
  for (std::size_t r = 0; r < world; ++r) {
    const auto& ops = p.ranks[r];
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      if (op.kind != OpKind::kSend || op.peer < 0 || op.peer >= static_cast<int64_t>(world))
        continue;
      const std::vector<Receive>& posted = receives[static_cast<std::size_t>(op.peer)];
      const Receive key{static_cast<int64_t>(r), op.tag, 0};
      const auto after = std::upper_bound(posted.begin(), posted.end(), key);
      if (after == posted.begin()) continue;
      const Receive& found = *std::prev(after);
      if (found.from != key.from || found.tag != key.tag) continue;
      m.peer_op[r][static_cast<std::size_t>(i)] = found.op;
      m.peer_op[static_cast<std::size_t>(op.peer)][static_cast<std::size_t>(found.op)] = i;
    }
  }
  return m;
}

}  // namespace tessera

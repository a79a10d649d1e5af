#include "shared/program/op_matching.hpp"

#include <unordered_map>

namespace tessera {

namespace {

struct MessageKey {
  int64_t from, to, tag;
  bool operator==(const MessageKey&) const = default;
};
struct MessageKeyHash {
  std::size_t operator()(const MessageKey& k) const {
    return std::hash<int64_t>{}(k.from * 1000003 ^ k.to * 10007 ^ k.tag * 31);
  }
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
    if (added) m.instance_group.push_back(group);
    return it->second;
  };
  std::unordered_map<MessageKey, int32_t, MessageKeyHash> receives;
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
      if (op.kind == OpKind::kRecv) receives[{op.peer, static_cast<int64_t>(r), op.tag}] = i;
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
  for (std::size_t r = 0; r < world; ++r) {
    const auto& ops = p.ranks[r];
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      if (op.kind != OpKind::kSend || op.peer < 0 || op.peer >= static_cast<int64_t>(world))
        continue;
      const auto it = receives.find({static_cast<int64_t>(r), op.peer, op.tag});
      if (it == receives.end()) continue;
      m.peer_op[r][static_cast<std::size_t>(i)] = it->second;
      m.peer_op[static_cast<std::size_t>(op.peer)][static_cast<std::size_t>(it->second)] = i;
    }
  }
  return m;
}

}  // namespace tessera

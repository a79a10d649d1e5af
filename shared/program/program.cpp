#include "shared/program/program.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace tessera {

const EnumTable<Phase> kPhases = {
    {"F", Phase::kF}, {"B", Phase::kB}, {"W", Phase::kW}, {"R", Phase::kR}};
const EnumTable<CollectiveKind> kCollectiveKinds = {
    {"allreduce", CollectiveKind::kAllReduce},
    {"allgather", CollectiveKind::kAllGather},
    {"reducescatter", CollectiveKind::kReduceScatter},
    {"alltoall", CollectiveKind::kAllToAll},
    {"broadcast", CollectiveKind::kBroadcast}};

std::string phase_name(Phase phase) {
  return enum_name(phase, kPhases);
}

std::string collective_name(CollectiveKind kind) {
  return enum_name(kind, kCollectiveKinds);
}

std::string purpose_name(Purpose purpose) {
  switch (purpose) {
    case Purpose::kTp:
      return "tp";
    case Purpose::kCp:
      return "cp";
    case Purpose::kDp:
      return "dp";
    case Purpose::kEp:
      return "ep";
    case Purpose::kBoundary:
      return "boundary";
    case Purpose::kPp:
      return "pp";
    case Purpose::kNorm:
      return "norm";
    case Purpose::kAmax:
      return "amax";
  }
  return "?";
}

namespace {

std::string where(const Program& p, const Op& op) {
  std::string s =
      op.module >= 0 ? p.modules[static_cast<std::size_t>(op.module)] : std::string("model");
  s += ".s" + std::to_string(op.stage);
  if (op.chunk > 0) s += ".c" + std::to_string(op.chunk);
  if (op.microbatch >= 0) s += ".mb" + std::to_string(op.microbatch);
  if (op.sub_microbatch > 0) s += ".sub" + std::to_string(op.sub_microbatch);
  return s;
}

std::string bucket(const Op& op) {
  if ((op.flags & kOpGradientBucket) == 0) return "";
  return ".L" + std::to_string(op.first_layer) + "-" + std::to_string(op.first_layer + op.layers);
}

}  // namespace

std::string op_name(const Program& p, const Op& op) {
  switch (op.kind) {
    case OpKind::kCompute:
      return where(p, op) + "." + phase_name(op.phase) + bucket(op);
    case OpKind::kSend:
      return "send:" + where(p, op) + "." + phase_name(op.phase) + ">r" + std::to_string(op.peer);
    case OpKind::kRecv:
      return "recv:" + where(p, op) + "." + phase_name(op.phase) + "<r" + std::to_string(op.peer);
    case OpKind::kCollective:
      return purpose_name(op.purpose) + ":" + collective_name(op.collective) + ":" + where(p, op) +
             (op.purpose == Purpose::kBoundary || op.purpose == Purpose::kPp ||
                      (op.flags & kOpFullySharded) != 0
                  ? "." + phase_name(op.phase)
                  : "") +
             bucket(op) + ((op.flags & kOpRoutedExperts) != 0 ? ".experts" : "") +
             ((op.flags & kOpKvReplicas) != 0 ? ".kv" : "") +
             ((op.flags & kOpSequencePartial) != 0 ? ".sp" : "");
    case OpKind::kOptimizerStep:
      return "optimizer:" + where(p, op);
  }
  return "?";
}

bool fused_with_backward(const std::vector<Op>& ops, std::size_t i) {
  if (i == 0 || i >= ops.size()) return false;
  const Op& w = ops[i];
  const Op& b = ops[i - 1];
  return w.kind == OpKind::kCompute && w.phase == Phase::kW && b.kind == OpKind::kCompute &&
         b.phase == Phase::kB && b.module == w.module && b.chunk == w.chunk &&
         b.microbatch == w.microbatch && b.first_layer == w.first_layer && b.layers == w.layers;
}

std::string op_id(const Program& p, int32_t rank, int32_t index) {
  return "it" + std::to_string(p.iteration) + ".r" + std::to_string(rank) + "." +
         std::to_string(index);
}

const ChunkLayers* find_chunk_layers(const Program& p, int module, int stage, int chunk) {
  const auto key = std::make_tuple(module, stage, chunk);
  const auto it = std::lower_bound(
      p.chunk_layers.begin(), p.chunk_layers.end(), key, [](const ChunkLayers& c, const auto& k) {
        return std::make_tuple(int{c.module}, int{c.stage}, int{c.chunk}) < k;
      });
  return it != p.chunk_layers.end() && it->module == module && it->stage == stage &&
                 it->chunk == chunk
             ? &*it
             : nullptr;
}

int64_t active_members(const Program& p, const RankList& group) {
  if (p.represented_by.empty()) return static_cast<int64_t>(group.size());
  return std::count_if(group.begin(), group.end(),
                       [&](int64_t r) { return representative(p, r) == r; });
}

int64_t op_count(const Program& p) {
  int64_t ops = 0;
  for (const auto& rank_ops : p.ranks) ops += static_cast<int64_t>(rank_ops.size());
  return ops;
}

int64_t lowered_ranks(const Program& p) {
  int64_t ranks = 0;
  for (std::size_t r = 0; r < p.ranks.size(); ++r)
    ranks += representative(p, static_cast<int64_t>(r)) == static_cast<int32_t>(r);
  return ranks;
}

std::vector<std::string> check_program(const Program& p) {
  std::vector<std::string> problems;
  auto complain = [&](int32_t rank, int32_t index, const std::string& what) {
    if (problems.size() < 100)
      problems.push_back(
          op_id(p, rank, index) + " (" +
          op_name(p, p.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)]) +
          "): " + what);
  };
  // (src, dst, tag) -> count, bytes and boundary link of sends and receives.
  struct Posted {
    int count = 0;
    double bytes = 0;
    int32_t link = -1;
  };
  std::map<std::tuple<int32_t, int32_t, int64_t>, Posted> sends, recvs;
  // group -> per member, the sequence of (kind, bytes) it enters.
  std::map<int32_t, std::map<int32_t, std::vector<std::pair<int, double>>>> entered;
  const auto groups = static_cast<int32_t>(p.groups.size());
  if (!p.represented_by.empty()) {
    if (p.represented_by.size() != p.ranks.size()) {
      problems.push_back("represented_by names " + std::to_string(p.represented_by.size()) +
                         " ranks of " + std::to_string(p.ranks.size()));
      return problems;
    }
    for (int32_t r = 0; r < static_cast<int32_t>(p.ranks.size()); ++r) {
      const int32_t by = p.represented_by[static_cast<std::size_t>(r)];
      if (by < 0 || by > r || representative(p, by) != by)
        problems.push_back("rank " + std::to_string(r) + " is represented by " +
                           std::to_string(by) + ", not a lower rank that represents itself");
      else if (by != r && !p.ranks[static_cast<std::size_t>(r)].empty())
        problems.push_back("rank " + std::to_string(r) + " is represented by rank " +
                           std::to_string(by) + " but has ops of its own");
    }
    if (p.member_groups.size() != p.groups.size())
      problems.push_back("member_groups names " + std::to_string(p.member_groups.size()) +
                         " groups of " + std::to_string(p.groups.size()));
    for (std::size_t g = 0; g < p.member_groups.size() && problems.empty(); ++g) {
      const auto& used = p.member_groups[g];
      const bool valid = std::all_of(used.begin(), used.end(), [&](int32_t id) {
        return id >= 0 && id < static_cast<int32_t>(p.groups.size());
      });
      if (!valid || (!used.empty() && used.front() != static_cast<int32_t>(g)))
        problems.push_back("member_groups of group " + std::to_string(g) +
                           " names no group or does not start with the group itself");
    }
    if (!problems.empty()) return problems;
  }
  for (int32_t r = 0; r < static_cast<int32_t>(p.ranks.size()); ++r) {
    const auto& ops = p.ranks[static_cast<std::size_t>(r)];
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      for (int32_t d : op.deps)
        if (d < 0 || d >= i)
          complain(r, i, "depends on op " + std::to_string(d) + ", not an earlier op of this rank");
      for (const NestedCollective& n : op.nested)
        if (n.group < 0 || n.group >= groups) complain(r, i, "nested collective names no group");
      switch (op.kind) {
        case OpKind::kSend:
        case OpKind::kRecv: {
          if (op.peer < 0 || op.peer >= p.world || op.peer == r) {
            complain(r, i, "invalid peer " + std::to_string(op.peer));
            break;
          }
          if (representative(p, op.peer) != op.peer) {
            complain(r, i, "peer " + std::to_string(op.peer) + " has no ops of its own (folded)");
            break;
          }
          auto key = op.kind == OpKind::kSend ? std::make_tuple(r, op.peer, op.tag)
                                              : std::make_tuple(op.peer, r, op.tag);
          auto& entry = (op.kind == OpKind::kSend ? sends : recvs)[key];
          ++entry.count;
          entry.bytes = op.message_bytes;
          entry.link = op.link;
          if (op.link >= 0 && (op.link >= static_cast<int32_t>(p.links.size()) ||
                               p.links[static_cast<std::size_t>(op.link)].producer != op.module))
            complain(r, i, "boundary message names no link of its module");
          break;
        }
        case OpKind::kCompute: {
          const ChunkLayers* held = find_chunk_layers(p, op.module, op.stage, op.chunk);
          if (held == nullptr || op.first_layer < held->first_layer ||
              op.first_layer + op.layers > held->end_layer)
            complain(r, i, "runs layers its chunk does not hold");
          break;
        }
        case OpKind::kCollective: {
          if (op.group < 0 || op.group >= groups) {
            complain(r, i, "collective names no group");
            break;
          }
          const RankList& members = p.groups[static_cast<std::size_t>(op.group)];
          if (std::find(members.begin(), members.end(), r) == members.end())
            complain(r, i, "rank is not a member of its collective's group");
          entered[op.group][r].emplace_back(static_cast<int>(op.collective), op.message_bytes);
          break;
        }
        default:
          break;
      }
    }
  }
  for (const auto& [key, s] : sends) {
    const auto it = recvs.find(key);
    const auto [src, dst, tag] = key;
    const std::string pair =
        "r" + std::to_string(src) + "->r" + std::to_string(dst) + " tag " + std::to_string(tag);
    if (it == recvs.end())
      problems.push_back("send " + pair + " has no receive");
    else if (it->second.count != s.count)
      problems.push_back("send " + pair + " posted " + std::to_string(s.count) +
                         " times, received " + std::to_string(it->second.count));
    else if (it->second.bytes != s.bytes)
      problems.push_back("send " + pair + " sends " + std::to_string(s.bytes) +
                         " bytes, the receive expects " + std::to_string(it->second.bytes));
    else if (it->second.link != s.link)
      problems.push_back("send " + pair + " carries link " + std::to_string(s.link) +
                         ", the receive expects link " + std::to_string(it->second.link));
  }
  for (const auto& [key, r] : recvs)
    if (!sends.contains(key)) {
      const auto [src, dst, tag] = key;
      problems.push_back("receive r" + std::to_string(src) + "->r" + std::to_string(dst) + " tag " +
                         std::to_string(tag) + " has no send");
    }
  for (const auto& [group, members] : entered) {
    const auto expected = active_members(p, p.groups[static_cast<std::size_t>(group)]);
    if (static_cast<int64_t>(members.size()) != expected) {
      problems.push_back("group " + std::to_string(group) + ": " + std::to_string(members.size()) +
                         " of " + std::to_string(expected) + " members enter its collectives");
      continue;
    }
    const auto& first = members.begin()->second;
    for (const auto& [rank, sequence] : members)
      if (sequence != first) {
        problems.push_back("group " + std::to_string(group) + ": rank " + std::to_string(rank) +
                           " enters its collectives in another order or size than rank " +
                           std::to_string(members.begin()->first));
        break;
      }
  }
  return problems;
}

Json program_to_json(const Program& p, int32_t rank) {
  Json out;
  out["iteration"] = p.iteration;
  out["world"] = p.world;
  Json ranks = Json::array();
  for (int32_t r = 0; r < static_cast<int32_t>(p.ranks.size()); ++r) {
    if (rank >= 0 && r != rank) continue;
    Json ops = Json::array();
    const auto& list = p.ranks[static_cast<std::size_t>(r)];
    for (int32_t i = 0; i < static_cast<int32_t>(list.size()); ++i) {
      const Op& op = list[static_cast<std::size_t>(i)];
      Json j;
      j["id"] = op_id(p, r, i);
      j["name"] = op_name(p, op);
      j["stream"] = op.stream == StreamKind::kCompute      ? "compute"
                    : op.stream == StreamKind::kCollective ? "collective"
                                                           : "p2p";
      if (op.kind == OpKind::kCompute) {
        j["layers"] = op.layers;
        j["tokens"] = op.tokens;
        j["flops"] = op.flops;
        if (op.expert_wait_flops != 0) j["expert_wait_flops"] = op.expert_wait_flops;
        if (op.padded_flops != 0) j["padded_flops"] = op.padded_flops;
        if (op.ep != 1) j["ep"] = op.ep;
        if (op.logits > 0) j["logits"] = op.logits;
        j["bytes"] = op.memory_bytes;
        if (!op.nested.empty()) {
          Json nested = Json::array();
          for (const NestedCollective& n : op.nested) {
            nested.push_back({{"kind", collective_name(n.kind)},
                              {"purpose", purpose_name(n.purpose)},
                              {"group", p.groups[static_cast<std::size_t>(n.group)]},
                              {"count", n.count},
                              {"bytes", n.bytes}});
            if (n.transport == Transport::kDeepEp) nested.back()["transport"] = "deepep";
            if (n.transport == Transport::kHybridEp) nested.back()["transport"] = "hybridep";
          }
          j["nested"] = nested;
        }
      } else if (op.kind == OpKind::kCollective) {
        j["group"] = p.groups[static_cast<std::size_t>(op.group)];
        j["bytes"] = op.message_bytes;
      } else if (op.kind == OpKind::kSend || op.kind == OpKind::kRecv) {
        j["peer"] = op.peer;
        j["bytes"] = op.message_bytes;
        j["tag"] = op.tag;
      } else {
        j["bytes"] = op.memory_bytes;
      }
      if (!op.deps.empty()) j["deps"] = op.deps;
      ops.push_back(j);
    }
    ranks.push_back(Json{{"rank", r}, {"ops", ops}});
  }
  out["ranks"] = ranks;
  return out;
}

}  // namespace tessera

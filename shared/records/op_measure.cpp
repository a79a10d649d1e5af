#include "shared/records/op_measure.hpp"

#include <algorithm>
#include <map>

namespace tessera {

std::string class_name(const OpClass& c) {
  const std::string where = c.local ? "intra_node" : "inter_node";
  switch (c.type) {
    case OpClass::Type::kCompute:
      return enum_name(c.role, kModuleRoles) + " " + phase_name(c.phase) + " " +
             size_class_name(c.size);
    case OpClass::Type::kCollective:
      return collective_name(c.kind) + " x" + std::to_string(c.group_size) + " " + where;
    case OpClass::Type::kP2p:
      return "p2p " + where;
    case OpClass::Type::kOptimizer:
      return "optimizer";
  }
  return "?";
}

OpClass collective_class(const CostModel& cost, CollectiveKind kind, const RankList& group) {
  OpClass c;
  c.type = OpClass::Type::kCollective;
  c.kind = kind;
  c.group_size = static_cast<int64_t>(group.size());
  c.local = cost.same_node(group);
  return c;
}

namespace {

struct Interval {
  double from = 0, to = 0;
};

// Pieces of [start, finish] outside the (sorted) nested slices.
std::vector<Interval> pure_pieces(double start, double finish, const std::vector<Interval>& holes) {
  std::vector<Interval> out;
  double at = start;
  for (const Interval& h : holes) {
    if (h.from > at) out.push_back({at, std::min(h.from, finish)});
    at = std::max(at, h.to);
  }
  if (finish > at) out.push_back({at, finish});
  return out;
}

// ∫ min(1, cores / n(t)) dt where n(t) counts the ranks computing: a cpu-local machine's cores
// shared fairly among the ranks that compute (what the simulator's multicore host does).
class CoreShare {
 public:
  CoreShare(const std::vector<Interval>& busy, int64_t cores) {
    std::vector<std::pair<double, int>> edges;
    for (const Interval& b : busy) {
      edges.push_back({b.from, +1});
      edges.push_back({b.to, -1});
    }
    std::sort(edges.begin(), edges.end());
    int running = 0;
    double integral = 0;
    for (std::size_t k = 0; k < edges.size(); ++k) {
      if (!at_.empty()) {
        const double share = running <= cores ? 1.0 : static_cast<double>(cores) / running;
        integral += share * (edges[k].first - at_.back());
      }
      running += edges[k].second;
      at_.push_back(edges[k].first);
      integral_.push_back(integral);
      running_.push_back(running);
    }
    cores_ = cores;
  }
  double dedicated(const Interval& i) const { return value(i.to) - value(i.from); }

 private:
  double value(double t) const {
    if (at_.empty() || t <= at_.front()) return 0;
    const auto k =
        static_cast<std::size_t>(std::upper_bound(at_.begin(), at_.end(), t) - at_.begin()) - 1;
    const int n = running_[k];
    const double share = n <= cores_ ? 1.0 : static_cast<double>(cores_) / n;
    return integral_[k] + share * (t - at_[k]);
  }
  std::vector<double> at_, integral_;
  std::vector<int> running_;
  int64_t cores_ = 0;
};

double overlap_length(const Interval& a, const std::vector<Interval>& others) {
  double total = 0;
  for (const Interval& o : others)
    total += std::max(0.0, std::min(a.to, o.to) - std::max(a.from, o.from));
  return total;
}

}  // namespace

std::vector<OpMeasure> measure_ops(const Program& p, const Timeline& t, const ModelSpec& model,
                                   const ClusterSpec& cluster) {
  const CostModel cost(cluster, model.dtype, CostParams{}, model);
  const std::size_t world = p.ranks.size();
  // Per rank: nested slices by op, pure compute pieces, collective-stream intervals.
  std::vector<std::map<int32_t, std::vector<Interval>>> holes(world);
  for (std::size_t r = 0; r < world && r < t.nested.size(); ++r)
    for (const NestedSlice& n : t.nested[r]) holes[r][n.op].push_back({n.start_s, n.finish_s});
  std::vector<Interval> busy;
  std::vector<std::vector<Interval>> collective_busy(world);
  for (std::size_t r = 0; r < world; ++r)
    for (std::size_t i = 0; i < p.ranks[r].size(); ++i) {
      const Op& op = p.ranks[r][i];
      const OpTime& o = t.ops[r][i];
      if (op.kind == OpKind::kCompute || op.kind == OpKind::kOptimizerStep) {
        auto& h = holes[r][static_cast<int32_t>(i)];
        std::sort(h.begin(), h.end(),
                  [](const Interval& a, const Interval& b) { return a.from < b.from; });
        for (const Interval& piece : pure_pieces(o.start_s, o.finish_s, h)) busy.push_back(piece);
      } else if (op.kind == OpKind::kCollective) {
        collective_busy[r].push_back({o.start_s, o.finish_s});
      }
    }
  const bool shared = cluster.kind == ClusterKind::kCpuLocal && cluster.cores > 0;
  const CoreShare share(busy, shared ? cluster.cores : 1 << 30);

  std::vector<OpMeasure> out;
  auto compute_time = [&](std::size_t r, std::size_t i, double& dedicated, double& pure,
                          double& overlapped) {
    const OpTime& o = t.ops[r][i];
    for (const Interval& piece :
         pure_pieces(o.start_s, o.finish_s, holes[r][static_cast<int32_t>(i)])) {
      dedicated += share.dedicated(piece);
      pure += piece.to - piece.from;
      overlapped += overlap_length(piece, collective_busy[r]);
    }
  };
  // Collective instances: each member's entries on a group, in order.
  std::map<std::pair<int32_t, int64_t>,
           std::vector<std::pair<Interval, std::pair<CollectiveKind, double>>>>
      entries;
  for (std::size_t r = 0; r < world; ++r) {
    const auto& ops = p.ranks[r];
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const OpTime& o = t.ops[r][i];
      const std::string where = "r" + std::to_string(r) + ":" + op_name(p, op);
      if (op.kind == OpKind::kCompute) {
        if (fused_with_backward(ops, i)) continue;  // measured with its B
        OpMeasure m;
        m.cls.type = OpClass::Type::kCompute;
        m.cls.role = model.modules[static_cast<std::size_t>(op.module)].role;
        m.cls.size = size_class(model.modules[static_cast<std::size_t>(op.module)]);
        m.cls.phase = op.phase;
        m.op = where;
        m.x = op.flops;
        m.token_layers = static_cast<double>(op.tokens * op.layers);
        m.logits = op.logits;
        m.calls = nested_calls(op);
        m.layers = static_cast<double>(op.layers);
        double pure = 0, overlapped = 0;
        compute_time(r, i, m.seconds, pure, overlapped);
        m.wall_s = o.finish_s - o.start_s;
        if (fused_with_backward(ops, i + 1)) {  // the executor ran the W inside this B
          m.x += ops[i + 1].flops;
          compute_time(r, i + 1, m.seconds, pure, overlapped);
          m.wall_s += t.ops[r][i + 1].finish_s - t.ops[r][i + 1].start_s;
        }
        m.overlap = pure > 0 ? overlapped / pure : 0;
        out.push_back(m);
      } else if (op.kind == OpKind::kOptimizerStep) {
        OpMeasure m;
        m.cls.type = OpClass::Type::kOptimizer;
        m.op = where;
        m.x = op.memory_bytes;
        double pure = 0, overlapped = 0;
        compute_time(r, i, m.seconds, pure, overlapped);
        m.wall_s = o.finish_s - o.start_s;
        out.push_back(m);
      } else if (op.kind == OpKind::kSend) {
        OpMeasure m;
        m.cls.type = OpClass::Type::kP2p;
        m.cls.local = cost.same_node({static_cast<int64_t>(r), op.peer});
        m.op = where;
        m.x = op.message_bytes;
        m.seconds = m.wall_s = o.finish_s - o.start_s;
        out.push_back(m);
      } else if (op.kind == OpKind::kCollective) {
        entries[{op.group, static_cast<int64_t>(r)}].push_back(
            {{o.start_s, o.finish_s}, {op.collective, op.message_bytes}});
      }
    }
    if (r < t.nested.size())
      for (const NestedSlice& n : t.nested[r]) {
        const Op& op = ops[static_cast<std::size_t>(n.op)];
        for (const NestedCollective& nc : op.nested)
          if (nc.kind == n.kind && std::abs(nc.bytes - n.bytes) <= 1e-6 * std::max(1.0, nc.bytes)) {
            entries[{nc.group, static_cast<int64_t>(r)}].push_back(
                {{n.start_s, n.finish_s}, {n.kind, n.bytes}});
            break;
          }
      }
  }
  for (auto& [key, list] : entries)
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first.from < b.first.from; });
  for (std::size_t g = 0; g < p.groups.size(); ++g) {
    const RankList& members = p.groups[g];
    if (members.size() < 2) continue;
    const auto first = entries.find({static_cast<int32_t>(g), members.front()});
    if (first == entries.end()) continue;
    const std::size_t count = first->second.size();
    bool aligned = true;
    for (int64_t m : members) {
      const auto e = entries.find({static_cast<int32_t>(g), m});
      aligned = aligned && e != entries.end() && e->second.size() == count;
    }
    if (!aligned) continue;  // a member's slices are missing: no instance can be matched
    for (std::size_t j = 0; j < count; ++j) {
      // The last member to arrive waits for nobody: its duration is the collective's.
      const Interval* last = nullptr;
      for (int64_t m : members) {
        const Interval& iv = entries[{static_cast<int32_t>(g), m}][j].first;
        if (last == nullptr || iv.from > last->from) last = &iv;
      }
      const auto& [kind, bytes] = first->second[j].second;
      OpMeasure m;
      m.cls = collective_class(cost, kind, members);
      m.op = "g" + std::to_string(g) + "#" + std::to_string(j);
      m.x = bytes;
      m.seconds = m.wall_s = std::max(0.0, last->to - last->from);
      out.push_back(m);
    }
  }
  return out;
}

}  // namespace tessera

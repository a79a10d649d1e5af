#include "shared/cost/evaluator.hpp"

#include <algorithm>
#include <array>

#include "shared/cost/overlap_slowdown.hpp"
#include "shared/program/op_matching.hpp"

namespace tessera {

namespace {

constexpr int kStreams = 3;

int stream_index(const Op& op) {
  switch (op.stream) {
    case StreamKind::kCompute:
      return 0;
    case StreamKind::kCollective:
      return 1;
    case StreamKind::kP2p:
      return 2;
  }
  return 0;
}

// Per rank and op, the cost model's seconds for it (a compute op's own part, a send, a stream
// collective), kept from one pass for the next; negative: not priced yet.
using OpSeconds = std::vector<std::vector<double>>;

Timeline evaluate_pass(const Program& p, const CostModel& cost, const ComputeExtras& extra,
                       OpSeconds& priced);

}  // namespace

Timeline evaluate(const Program& p, const CostModel& cost) {
  OpSeconds priced;
  Timeline quiet = evaluate_pass(p, cost, {}, priced);
  const ComputeExtras extra = overlap_slowdown_s(p, cost, quiet);
  return extra.empty() ? quiet : evaluate_pass(p, cost, extra, priced);
}

Timeline evaluate_with(const Program& p, const CostModel& cost, const ComputeExtras& extra) {
  OpSeconds priced;
  return evaluate_pass(p, cost, extra, priced);
}

namespace {

Timeline evaluate_pass(const Program& p, const CostModel& cost, const ComputeExtras& extra,
                       OpSeconds& priced) {
  const std::size_t world = p.ranks.size();
  if (priced.size() != world) {
    priced.resize(world);
    for (std::size_t r = 0; r < world; ++r) priced[r].assign(p.ranks[r].size(), -1);
  }
  // The op's seconds by `price`, computed once over the passes.
  const auto seconds = [&](std::size_t r, int32_t i, auto&& price) {
    double& s = priced[r][static_cast<std::size_t>(i)];
    if (s < 0) s = price();
    return s;
  };
  // Seconds a compute op runs beyond the cost model's own time.
  const auto extra_s = [&](std::size_t r, int32_t i) {
    return extra.empty() ? 0.0 : extra[r][static_cast<std::size_t>(i)];
  };
  Timeline t;
  t.ops.resize(world);
  t.compute_busy_s.assign(world, 0);
  t.peak_activation_bytes.assign(world, 0);

  // Per rank and stream: the ops in order (receives are on no stream).
  std::vector<std::array<std::vector<int32_t>, kStreams>> lists(world);
  // Which ops meet across ranks: a send's finish completes its receive; a collective instance
  // starts when its last member arrives.
  const OpMatching match = match_ops(p);
  const auto& instance = match.instance_of;  // stream collectives; nested: first index
  const auto& nested_ids = match.nested_instance;
  std::vector<std::vector<std::pair<int64_t, int32_t>>> members(match.instances());  // (rank, op)
  std::size_t total = 0;
  for (std::size_t r = 0; r < world; ++r) {
    const auto& ops = p.ranks[r];
    t.ops[r].assign(ops.size(), OpTime{});
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      if (op.kind != OpKind::kRecv)
        lists[r][static_cast<std::size_t>(stream_index(op))].push_back(i);
      if (op.kind == OpKind::kCollective)
        members[static_cast<std::size_t>(instance[r][static_cast<std::size_t>(i)])].emplace_back(
            static_cast<int64_t>(r), i);
    }
    total += ops.size();
  }
  // How many members arrive at each group's collectives: those that run their own ops.
  std::vector<int32_t> arrivals(p.groups.size());
  for (std::size_t g = 0; g < p.groups.size(); ++g)
    arrivals[g] = static_cast<int32_t>(active_members(p, p.groups[g]));
  std::vector<int32_t> arrived(members.size(), 0);
  std::vector<double> ready_at(members.size(), 0);
  std::vector<std::array<std::size_t, kStreams>> cursor(world, {0, 0, 0});
  std::vector<std::array<double, kStreams>> free_at(world, {0, 0, 0});
  std::vector<std::vector<char>> arrived_here(world);
  for (std::size_t r = 0; r < world; ++r) arrived_here[r].assign(p.ranks[r].size(), 0);
  // A compute op with nested collectives runs in phases: its compute part, then each nested
  // collective once all of that collective's members reached it.
  std::vector<std::vector<int32_t>> phase(world);  // next nested index; -1 = not started
  std::vector<std::vector<double>> phase_end(world);
  std::vector<char> nested_arrived(nested_ids.size(), 0);
  std::vector<char> nested_woken(members.size(), 0);
  for (std::size_t r = 0; r < world; ++r) {
    phase[r].assign(p.ranks[r].size(), -1);
    phase_end[r].assign(p.ranks[r].size(), 0);
  }
  std::size_t done = 0;

  auto deps_ready = [&](std::size_t r, const Op& op, double& when) {
    for (int32_t d : op.deps) {
      const double f = t.ops[r][static_cast<std::size_t>(d)].finish_s;
      if (f < 0) return false;
      when = std::max(when, f);
    }
    return true;
  };

  // Worklist: a rank is visited again only when something it may wait for completes on another
  // rank (a send to it, a collective it is in), so evaluation is linear in the ops.
  std::vector<std::size_t> work(world);
  std::vector<char> queued(world, 1);
  for (std::size_t r = 0; r < world; ++r)
    work[r] = world - 1 - r;  // pop from the back: rank 0 first
  auto enqueue = [&](std::size_t r) {
    if (!queued[r]) {
      queued[r] = 1;
      work.push_back(r);
    }
  };
  while (!work.empty()) {
    const std::size_t r = work.back();
    work.pop_back();
    queued[r] = 0;
    {
      bool advanced = true;
      while (advanced) {
        advanced = false;
        for (int s = 0; s < kStreams; ++s) {
          auto& list = lists[r][static_cast<std::size_t>(s)];
          std::size_t& c = cursor[r][static_cast<std::size_t>(s)];
          while (c < list.size()) {
            const int32_t i = list[c];
            const Op& op = p.ranks[r][static_cast<std::size_t>(i)];
            OpTime& time = t.ops[r][static_cast<std::size_t>(i)];
            if (time.finish_s >= 0) {  // completed by its collective's last member
              free_at[r][static_cast<std::size_t>(s)] =
                  std::max(free_at[r][static_cast<std::size_t>(s)], time.finish_s);
              ++c;
              advanced = true;
              continue;
            }
            double start = free_at[r][static_cast<std::size_t>(s)];
            if (!deps_ready(r, op, start)) break;
            if (op.kind == OpKind::kCollective) {
              const int32_t inst = instance[r][static_cast<std::size_t>(i)];
              if (!arrived_here[r][static_cast<std::size_t>(i)]) {
                arrived_here[r][static_cast<std::size_t>(i)] = 1;
                ++arrived[static_cast<std::size_t>(inst)];
                ready_at[static_cast<std::size_t>(inst)] =
                    std::max(ready_at[static_cast<std::size_t>(inst)], start);
              }
              const auto& who = members[static_cast<std::size_t>(inst)];
              // Every member of the group must arrive, not just those whose programs enter it.
              if (arrived[static_cast<std::size_t>(inst)] <
                  arrivals[static_cast<std::size_t>(op.group)])
                break;
              const double begin = ready_at[static_cast<std::size_t>(inst)];
              const double end = begin + seconds(r, i, [&] {
                                   return cost.collective_s(
                                       op.collective, p.groups[static_cast<std::size_t>(op.group)],
                                       op.message_bytes);
                                 });
              for (const auto& [mr, mi] : who) {
                t.ops[static_cast<std::size_t>(mr)][static_cast<std::size_t>(mi)] = {begin, end};
                ++done;
                enqueue(static_cast<std::size_t>(mr));
              }
              advanced = true;
              continue;  // this member's cursor moves on at the top of the loop
            }
            double duration = 0;
            if (op.kind == OpKind::kSend) {
              duration = seconds(r, i, [&] {
                return cost.p2p_s(static_cast<int64_t>(r), op.peer, op.message_bytes);
              });
            } else if (op.nested.empty()) {
              duration = seconds(r, i, [&] {
                return cost.compute_s(p, static_cast<int32_t>(r), static_cast<std::size_t>(i));
              });
              if (op.kind == OpKind::kCompute) duration += extra_s(r, i);
            } else {
              auto& next = phase[r][static_cast<std::size_t>(i)];
              double& at = phase_end[r][static_cast<std::size_t>(i)];
              if (next < 0) {
                time.start_s = start;  // provisional; finish_s stays < 0 until done
                at = start +
                     seconds(r, i,
                             [&] {
                               return cost.compute_only_s(p, static_cast<int32_t>(r),
                                                          static_cast<std::size_t>(i));
                             }) +
                     extra_s(r, i);
                next = 0;
              }
              bool blocked = false;
              while (next < static_cast<int32_t>(op.nested.size())) {
                const auto slot =
                    static_cast<std::size_t>(instance[r][static_cast<std::size_t>(i)] + next);
                const int32_t inst = nested_ids[slot];
                const NestedCollective& nc = op.nested[static_cast<std::size_t>(next)];
                const RankList& group = p.groups[static_cast<std::size_t>(nc.group)];
                if (!nested_arrived[slot]) {
                  nested_arrived[slot] = 1;
                  ++arrived[static_cast<std::size_t>(inst)];
                  ready_at[static_cast<std::size_t>(inst)] =
                      std::max(ready_at[static_cast<std::size_t>(inst)], at);
                }
                const int32_t expected = arrivals[static_cast<std::size_t>(nc.group)];
                if (arrived[static_cast<std::size_t>(inst)] < expected) {
                  blocked = true;
                  break;
                }
                if (arrived[static_cast<std::size_t>(inst)] == expected &&
                    !nested_woken[static_cast<std::size_t>(inst)]) {
                  nested_woken[static_cast<std::size_t>(inst)] =
                      1;  // the last arrival wakes the others
                  for (int64_t m : group) enqueue(static_cast<std::size_t>(m));
                }
                at = ready_at[static_cast<std::size_t>(inst)] + nc.count * cost.collective_s(p, nc);
                ++next;
              }
              if (blocked) break;
              start = time.start_s;
              duration = at - start;
            }
            time = {start, start + duration};
            ++done;
            free_at[r][static_cast<std::size_t>(s)] = time.finish_s;
            if (s == 0) t.compute_busy_s[r] += duration;
            if (op.kind == OpKind::kSend) {
              if (const int32_t receive = match.peer_op[r][static_cast<std::size_t>(i)];
                  receive >= 0) {
                t.ops[static_cast<std::size_t>(op.peer)][static_cast<std::size_t>(receive)] = {
                    start, time.finish_s};
                ++done;
                enqueue(static_cast<std::size_t>(op.peer));  // the receiver may now go on
              }
            }
            ++c;
            advanced = true;
          }
        }
      }
    }
  }
  if (done < total) {
    std::string stuck;
    int shown = 0;
    for (std::size_t r = 0; r < world && shown < 5; ++r)
      for (int s = 0; s < kStreams; ++s) {
        const auto& list = lists[r][static_cast<std::size_t>(s)];
        const std::size_t c = cursor[r][static_cast<std::size_t>(s)];
        if (c < list.size() && shown < 5) {
          stuck += (shown ? "; " : "") + op_id(p, static_cast<int32_t>(r), list[c]) + " " +
                   op_name(p, p.ranks[r][static_cast<std::size_t>(list[c])]);
          ++shown;
        }
      }
    t.error = "the program cannot finish: " + std::to_string(total - done) +
              " ops never run; stuck at " + stuck;
    return t;
  }
  for (std::size_t r = 0; r < world; ++r) {
    double live = 0, peak = 0;
    for (int32_t i : lists[r][0]) {
      const Op& op = p.ranks[r][static_cast<std::size_t>(i)];
      live += op.stash_bytes;
      peak = std::max(peak, live);
      live -= op.release_bytes;
    }
    t.peak_activation_bytes[r] = peak;
    for (const OpTime& o : t.ops[r]) t.step_s = std::max(t.step_s, o.finish_s);
  }
  // A folded Program's represented ranks ran as their representative did.
  for (std::size_t r = 0; r < world; ++r) {
    const auto by = static_cast<std::size_t>(representative(p, static_cast<int64_t>(r)));
    t.compute_busy_s[r] = t.compute_busy_s[by];
    t.peak_activation_bytes[r] = t.peak_activation_bytes[by];
  }
  return t;
}

}  // namespace

}  // namespace tessera

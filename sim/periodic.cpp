#include "sim/periodic.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <unordered_map>

namespace tessera::sim {

namespace {

// What tells an op from the other ops of its rank, besides its micro-batch: a micro-batch's F,
// its sends, its gradient bucket pieces and so on each have their own type.
struct OpType {
  OpKind kind = OpKind::kCompute;
  StreamKind stream = StreamKind::kCompute;
  Phase phase = Phase::kF;
  CollectiveKind collective = CollectiveKind::kAllReduce;
  Purpose purpose = Purpose::kPp;
  int16_t module = -1, stage = 0, chunk = 0;
  uint32_t flags = 0;
  int32_t sub_microbatch = 0, first_layer = 0, peer = -1, group = -1, link = -1;
  bool operator==(const OpType&) const = default;
};

struct OpTypeHash {
  std::size_t operator()(const OpType& t) const {
    std::size_t h = 0;
    const auto mix = [&h](int64_t v) {
      h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    };
    for (int64_t v :
         {int64_t{static_cast<uint8_t>(t.kind)}, int64_t{static_cast<uint8_t>(t.stream)},
          int64_t{static_cast<uint8_t>(t.phase)}, int64_t{static_cast<uint8_t>(t.collective)},
          int64_t{static_cast<uint8_t>(t.purpose)}, int64_t{t.module}, int64_t{t.stage},
          int64_t{t.chunk}, int64_t{t.flags}, int64_t{t.sub_microbatch}, int64_t{t.first_layer},
          int64_t{t.peer}, int64_t{t.group}, int64_t{t.link}})
      mix(v);
    return h;
  }
};

OpType type_of(const Op& op) {
  return {op.kind,  op.stream, op.phase,          op.collective,  op.purpose, op.module, op.stage,
          op.chunk, op.flags,  op.sub_microbatch, op.first_layer, op.peer,    op.group,  op.link};
}

// Whether two ops of one type do the same work (their micro-batches, tags and dependency
// indices aside).
bool same_work(const Op& a, const Op& b) {
  const auto same_nested = [](const NestedCollective& x, const NestedCollective& y) {
    return x.kind == y.kind && x.purpose == y.purpose && x.group == y.group && x.count == y.count &&
           x.bytes == y.bytes;
  };
  return a.tp == b.tp && a.layers == b.layers && a.tokens == b.tokens && a.flops == b.flops &&
         a.expert_wait_flops == b.expert_wait_flops && a.padded_flops == b.padded_flops &&
         a.ep == b.ep && a.logits == b.logits && a.attention_pairs == b.attention_pairs &&
         a.memory_bytes == b.memory_bytes && a.message_bytes == b.message_bytes &&
         a.stash_bytes == b.stash_bytes && a.release_bytes == b.release_bytes &&
         a.deps.size() == b.deps.size() &&
         std::equal(a.nested.begin(), a.nested.end(), b.nested.begin(), b.nested.end(),
                    same_nested);
}

// One rank's ops of the short run by type, micro-batch (slot m + 1; 0 for the whole batch's)
// and occurrence.
class ShortIndex {
 public:
  ShortIndex(const std::vector<Op>& ops, int32_t microbatches) : slots_count_(microbatches + 1) {
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      auto& slots = ops_by_type_[type_id(type_of(op), true)];
      slots[static_cast<std::size_t>(op.microbatch + 1)].push_back(i);
    }
  }
  // -1: a type the short run does not have.
  int32_t type_id(const OpType& type, bool add = false) {
    const auto it = ids_.find(type);
    if (it != ids_.end()) return it->second;
    if (!add) return -1;
    ops_by_type_.emplace_back(static_cast<std::size_t>(slots_count_));
    return ids_[type] = static_cast<int32_t>(ops_by_type_.size() - 1);
  }
  int32_t types() const { return static_cast<int32_t>(ops_by_type_.size()); }
  // The op of `type` in micro-batch m, occurrence `occurrence`; -1 when there is none.
  int32_t find(int32_t type, int32_t m, int32_t occurrence) const {
    if (m + 1 >= slots_count_ || m < -1) return -1;
    const auto& slot =
        ops_by_type_[static_cast<std::size_t>(type)][static_cast<std::size_t>(m + 1)];
    return occurrence < static_cast<int32_t>(slot.size())
               ? slot[static_cast<std::size_t>(occurrence)]
               : -1;
  }
  int32_t occurrence(int32_t type, int32_t m, int32_t op) const {
    const auto& slot =
        ops_by_type_[static_cast<std::size_t>(type)][static_cast<std::size_t>(m + 1)];
    return static_cast<int32_t>(std::find(slot.begin(), slot.end(), op) - slot.begin());
  }

 private:
  int32_t slots_count_;
  std::unordered_map<OpType, int32_t, OpTypeHash> ids_;
  std::vector<std::vector<std::vector<int32_t>>> ops_by_type_;
};

std::string describe(const Program& p, int32_t rank, int32_t i) {
  return op_id(p, rank, i) + " " +
         op_name(p, p.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)]);
}

}  // namespace

std::optional<PeriodicShortening> periodic_shortening(const Scenario& s, const ParallelPlan& plan,
                                                      const Batch& batch, const Program& full) {
  if (plan.placement != Placement::kHomogeneous ||
      (plan.schedule != Schedule::k1F1B && plan.schedule != Schedule::kInterleaved1F1B) ||
      batch.samples.empty() || full.llm_microbatches.empty())
    return std::nullopt;
  if (std::any_of(batch.samples.begin(), batch.samples.end(),
                  [&](const Sample& x) { return !(x == batch.samples.front()); }))
    return std::nullopt;
  const auto& replicas = full.llm_microbatches;
  const std::size_t microbatches = replicas.front().size();
  for (const auto& replica : replicas) {
    if (replica.size() != microbatches) return std::nullopt;
    for (const auto& mb : replica)
      if (static_cast<int64_t>(mb.size()) != plan.micro_batch_size) return std::nullopt;
  }
  const auto dp = static_cast<int64_t>(replicas.size());
  if (dp * plan.micro_batch_size * static_cast<int64_t>(microbatches) !=
      static_cast<int64_t>(batch.samples.size()))
    return std::nullopt;
  PeriodicShortening out;
  out.full_microbatches = static_cast<int32_t>(microbatches);
  const int32_t stages = static_cast<int32_t>(plan.layout.pp);
  const bool interleaved = plan.schedule == Schedule::kInterleaved1F1B;
  out.period = interleaved ? stages : 1;
  out.multiples = interleaved ? 2 : 4;
  // Warm-up and cool-down take up to a micro-batch per stage each (interleaved: up to a group of
  // `stages` per chunk and one more); the steady phase between them holds three periods of the
  // longest kind tried, and more: a whole number of 1..multiples periods is inserted.
  const int32_t fill = interleaved ? 4 * stages : 2 * stages;
  const int32_t least = fill + (3 * out.multiples + 2) * out.period;
  const int32_t step = out.period * (interleaved ? 2 : 12);  // divisible by each multiple
  const auto full_count = static_cast<int32_t>(microbatches);
  if (full_count <= least) return std::nullopt;
  out.microbatches = least + (full_count - least) % step;
  if (4 * out.microbatches > 3 * full_count) return std::nullopt;  // too little to gain
  out.plan = plan;
  out.plan.num_micro_batches = out.microbatches;
  out.workload = s.workload;
  out.workload.global_batch = dp * plan.micro_batch_size * out.microbatches;
  out.batch.iteration = batch.iteration;
  out.batch.samples.assign(
      batch.samples.begin(),
      batch.samples.begin() + static_cast<std::ptrdiff_t>(out.workload.global_batch));
  return out;
}

namespace {

// Where the short run's steady phase repeats with a period of `p` micro-batches: a cut time in
// its middle, the period in seconds, and for each rank, op type, occurrence and residue of the
// micro-batch modulo p, the micro-batch whose op starts within the period before the cut.
struct SteadyPhase {
  int32_t p = 1;
  double cut = -1, period_s = 0;
  std::vector<std::vector<std::vector<int32_t>>> base;  // [rank][type][occurrence·p + m % p]
  std::string failure;
};

SteadyPhase find_steady_phase(const Program& shortened, const Timeline& st,
                              std::vector<ShortIndex>& index, int32_t p) {
  SteadyPhase out;
  out.p = p;
  const std::size_t world = shortened.ranks.size();
  const auto& first = shortened.ranks[0];
  const auto start_of = [&](std::size_t r, int32_t q) {
    return st.ops[r][static_cast<std::size_t>(q)].start_s;
  };
  // Rank 0's steady phase runs from its first backward to its last forward; the forward nearest
  // its middle, and its counterpart a period later, give the period.
  double first_backward = -1, last_forward = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(first.size()); ++i) {
    const Op& op = first[static_cast<std::size_t>(i)];
    if (op.kind != OpKind::kCompute) continue;
    if (op.phase == Phase::kB && first_backward < 0) first_backward = start_of(0, i);
    if (op.phase == Phase::kF) last_forward = std::max(last_forward, start_of(0, i));
  }
  const double middle = (first_backward + last_forward) / 2;
  double nearest = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(first.size()); ++i) {
    const Op& op = first[static_cast<std::size_t>(i)];
    if (op.kind != OpKind::kCompute || op.phase != Phase::kF || op.microbatch < 0) continue;
    const int32_t type = index[0].type_id(type_of(op));
    const int32_t next =
        index[0].find(type, op.microbatch + p, index[0].occurrence(type, op.microbatch, i));
    if (next < 0 || (nearest >= 0 && std::fabs(start_of(0, i) - middle) >= nearest)) continue;
    nearest = std::fabs(start_of(0, i) - middle);
    out.cut = start_of(0, i);
    out.period_s = start_of(0, next) - out.cut;
  }
  if (first_backward < 0 || out.cut < 0 || !(out.period_s > 0)) {
    out.failure =
        "rank 0 has no forward that repeats " + std::to_string(p) + " micro-batches later";
    return out;
  }
  const double period = out.period_s;
  // The cut goes where no op starts, in the widest gap between the ops' starts within a period,
  // so that no op sits on the edge of a window below.
  std::vector<double> phases;
  for (std::size_t r = 0; r < world; ++r)
    for (const OpTime& o : st.ops[r])
      if (o.start_s >= out.cut - 2 * period && o.start_s < out.cut + period)
        phases.push_back(std::fmod(o.start_s - (out.cut - 2 * period), period));
  std::sort(phases.begin(), phases.end());
  double widest = phases.empty() ? period : phases.front() + period - phases.back();
  double middle_of_gap = phases.empty() ? 0 : std::fmod(phases.back() + widest / 2, period);
  for (std::size_t k = 1; k < phases.size(); ++k)
    if (phases[k] - phases[k - 1] > widest) {
      widest = phases[k] - phases[k - 1];
      middle_of_gap = phases[k - 1] + widest / 2;
    }
  out.cut += middle_of_gap - period;  // within the period before that forward
  const double cut = out.cut;
  const double tolerance = 1e-9 * std::max(1.0, st.step_s);
  const auto near = [&](double a, double b) { return std::fabs(a - b) <= tolerance; };

  // The steady phase repeats around the cut: every op that starts within a period before it or
  // after it has a counterpart p micro-batches later doing the same work one period later. Ops
  // starting in the period before the cut are those the inserted periods repeat.
  out.base.resize(world);
  for (std::size_t r = 0; r < world; ++r) {
    ShortIndex& at = index[r];
    out.base[r].resize(static_cast<std::size_t>(at.types()));
    const auto& ops = shortened.ranks[r];
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const double start = start_of(r, i);
      if (start < cut - period || start >= cut + period) continue;
      const Op& op = ops[static_cast<std::size_t>(i)];
      const auto rank = static_cast<int32_t>(r);
      if (op.microbatch < 0) {
        out.failure = describe(shortened, rank, i) + " runs once per step, in the steady phase";
        return out;
      }
      const int32_t type = at.type_id(type_of(op));
      const int32_t occurrence = at.occurrence(type, op.microbatch, i);
      const int32_t next = at.find(type, op.microbatch + p, occurrence);
      if (next < 0 || !same_work(op, ops[static_cast<std::size_t>(next)]) ||
          !near(start_of(r, next), start + period) ||
          !near(st.ops[r][static_cast<std::size_t>(next)].finish_s,
                st.ops[r][static_cast<std::size_t>(i)].finish_s + period)) {
        out.failure = describe(shortened, rank, i) + " does not repeat " + std::to_string(p) +
                      " micro-batches later";
        return out;
      }
      if (start < cut) {
        auto& slots = out.base[r][static_cast<std::size_t>(type)];
        const auto slot = static_cast<std::size_t>(occurrence * p + op.microbatch % p);
        if (slots.size() <= slot) slots.resize(slot + 1, -1);
        slots[slot] = op.microbatch;
      }
    }
  }
  return out;
}

}  // namespace

PeriodicExtension extend_periodic(const Program& full, const Program& shortened, const Timeline& st,
                                  const PeriodicShortening& how) {
  PeriodicExtension out;
  if (full.world != shortened.world || full.groups != shortened.groups ||
      full.represented_by != shortened.represented_by ||
      full.member_groups != shortened.member_groups) {
    out.failure = "the short run's ranks or groups differ from the full run's";
    return out;
  }
  const std::size_t world = full.ranks.size();
  std::vector<ShortIndex> index;
  index.reserve(world);
  for (std::size_t r = 0; r < world; ++r) index.emplace_back(shortened.ranks[r], how.microbatches);
  const auto start_of = [&](std::size_t r, int32_t q) {
    return st.ops[r][static_cast<std::size_t>(q)].start_s;
  };
  // The shortest period that repeats: a pipeline's steady phase may take turns between two or
  // more patterns (arrivals alternating between early and late).
  SteadyPhase steady;
  for (int32_t k = 1; k <= how.multiples; ++k) {
    steady = find_steady_phase(shortened, st, index, k * how.period);
    if (steady.failure.empty()) break;
  }
  if (!steady.failure.empty()) {
    out.failure = steady.failure;
    return out;
  }
  const int32_t p = steady.p;
  const double cut = steady.cut, period = steady.period_s;
  const auto& base = steady.base;
  out.period_s = period;
  out.period_microbatches = p;
  const int32_t extra = how.full_microbatches - how.microbatches;  // micro-batches inserted
  const int32_t inserted = extra / p;                              // periods inserted

  // Each op of the full run: its counterpart in the short run and the periods inserted before it
  // (0 before the cut, all of them after the inserted stretch).
  Timeline& t = out.timeline;
  t.ops.resize(world);
  t.compute_busy_s.assign(world, 0);
  t.peak_activation_bytes.assign(world, 0);
  t.nested.resize(world);
  for (std::size_t r = 0; r < world; ++r) {
    const auto& ops = full.ranks[r];
    const auto& short_ops = shortened.ranks[r];
    const auto rank = static_cast<int32_t>(r);
    ShortIndex& at = index[r];
    t.ops[r].resize(ops.size());
    std::vector<char> before(short_ops.size(), 0), after(short_ops.size(), 0);
    // Occurrences so far of each (type, micro-batch) in the full run.
    std::vector<std::unordered_map<int32_t, int32_t>> seen(static_cast<std::size_t>(at.types()));
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      const int32_t type = at.type_id(type_of(op));
      if (type < 0) {
        out.failure = describe(full, rank, i) + " has no counterpart in the short run";
        return out;
      }
      const int32_t m = op.microbatch;
      const int32_t occurrence = seen[static_cast<std::size_t>(type)][m]++;
      int32_t periods = -1, q = at.find(type, m, occurrence);
      if (q >= 0 && start_of(r, q) < cut) {
        periods = 0;
      } else if (m >= 0) {
        const auto& slots = base[r][static_cast<std::size_t>(type)];
        const auto slot = static_cast<std::size_t>(occurrence * p + m % p);
        if (slot < slots.size() && slots[slot] >= 0 && (m - slots[slot]) / p < inserted) {
          periods = (m - slots[slot]) / p;
          q = at.find(type, slots[slot], occurrence);
        }
      }
      if (periods < 0) {
        periods = inserted;
        q = at.find(type, m < 0 ? m : m - extra, occurrence);
        if (q >= 0 && start_of(r, q) < cut - (m < 0 ? 0 : period)) q = -1;
      }
      if (q < 0) {
        out.failure = describe(full, rank, i) + " has no counterpart in the short run";
        return out;
      }
      const Op& counterpart = short_ops[static_cast<std::size_t>(q)];
      if (!same_work(op, counterpart)) {
        out.failure = describe(full, rank, i) + " differs from its counterpart " +
                      describe(shortened, rank, q);
        return out;
      }
      if (periods == 0) before[static_cast<std::size_t>(q)] = 1;
      if (periods == inserted) after[static_cast<std::size_t>(q)] = 1;
      const OpTime& time = st.ops[r][static_cast<std::size_t>(q)];
      const double shift = periods * period;
      t.ops[r][static_cast<std::size_t>(i)] = {time.start_s + shift, time.finish_s + shift};
    }
    // The full run holds the whole short run: its ops before the cut as they are, those after
    // it moved by the inserted periods.
    for (int32_t q = 0; q < static_cast<int32_t>(short_ops.size()); ++q)
      if (!(start_of(r, q) < cut ? before : after)[static_cast<std::size_t>(q)]) {
        out.failure = describe(shortened, rank, q) + " has no counterpart in the full run";
        return out;
      }
  }
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < full.ranks[r].size(); ++i) {
      const OpTime& o = t.ops[r][i];
      t.step_s = std::max(t.step_s, o.finish_s);
      const Op& op = full.ranks[r][i];
      if (op.stream == StreamKind::kCompute && op.kind != OpKind::kRecv)
        t.compute_busy_s[r] += o.finish_s - o.start_s;
    }
  }
  for (std::size_t r = 0; r < world; ++r)
    t.compute_busy_s[r] =
        t.compute_busy_s[static_cast<std::size_t>(representative(full, static_cast<int64_t>(r)))];
  t.activities = st.activities;
  t.actors = st.actors;
  t.folded_flows = st.folded_flows;
  t.nested_shared_links = st.nested_shared_links;
  return out;
}

}  // namespace tessera::sim

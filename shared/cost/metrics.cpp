#include "shared/cost/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "shared/program/op_matching.hpp"

namespace tessera {

namespace {

std::string kind_of(const Program& p, const Op& op) {
  const std::string module =
      op.module >= 0 ? p.modules[static_cast<std::size_t>(op.module)] : "model";
  switch (op.kind) {
    case OpKind::kCompute:
      return module + " " + phase_name(op.phase);
    case OpKind::kSend:
    case OpKind::kRecv:
      return purpose_name(op.purpose) + " send/recv";
    case OpKind::kCollective:
      return purpose_name(op.purpose) + " " + collective_name(op.collective);
    case OpKind::kOptimizerStep:
      return "optimizer";
  }
  return "?";
}

bool is_comm(const Op& op) {
  return op.kind == OpKind::kRecv || op.kind == OpKind::kCollective || op.kind == OpKind::kSend;
}

struct Interval {
  double start = 0, finish = 0;
};

// Sorted, overlapping intervals joined.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::vector<Interval> out;
  for (const Interval& x : v) {
    if (x.finish <= x.start) continue;
    if (!out.empty() && x.start <= out.back().finish)
      out.back().finish = std::max(out.back().finish, x.finish);
    else
      out.push_back(x);
  }
  return out;
}

// Seconds of `a` (merged) that `b` (merged) does not cover.
double uncovered_s(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double total = 0;
  std::size_t j = 0;
  for (const Interval& x : a) {
    double covered = 0;
    while (j < b.size() && b[j].finish <= x.start) ++j;
    for (std::size_t k = j; k < b.size() && b[k].start < x.finish; ++k)
      covered += std::min(x.finish, b[k].finish) - std::max(x.start, b[k].start);
    total += x.finish - x.start - covered;
  }
  return total;
}

// What one rank's ops did, from their times.
struct RankFigures {
  bool pipelined = false;     // some op runs on a pipeline stage after the first
  double hardware_flops = 0;  // recomputation included
  double busy_s = 0;          // computing: compute ops and optimizer steps, not transfers
  // The time some transfer runs while the rank computes nothing (pipeline sends and receives,
  // data-parallel reductions and gathers, boundary transfers, the gradient norm; nested
  // TP/CP/EP collectives are part of their compute op), and the boundary transfers' part.
  double exposed_s = 0, exposed_boundary_s = 0;
  std::vector<double> module_busy;                        // per module
  std::vector<std::map<int32_t, double>> per_microbatch;  // per module: micro-batch -> seconds
};

RankFigures rank_figures(const Program& p, const std::vector<Op>& ops,
                         const std::vector<OpTime>& times) {
  RankFigures f;
  f.module_busy.assign(p.modules.size(), 0);
  f.per_microbatch.resize(p.modules.size());
  std::vector<Interval> compute, comm, boundary;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const OpTime& time = times[i];
    f.pipelined = f.pipelined || op.stage > 0;
    if (is_comm(op)) {
      comm.push_back({time.start_s, time.finish_s});
      if (op.purpose == Purpose::kBoundary) boundary.push_back({time.start_s, time.finish_s});
      continue;
    }
    compute.push_back({time.start_s, time.finish_s});
    if (op.kind != OpKind::kCompute) continue;
    f.hardware_flops += op.flops;
    if (op.module >= 0) {
      const double duration = time.finish_s - time.start_s;
      f.module_busy[static_cast<std::size_t>(op.module)] += duration;
      if (op.microbatch >= 0)
        f.per_microbatch[static_cast<std::size_t>(op.module)][op.microbatch] += duration;
    }
  }
  const std::vector<Interval> computing = merged(std::move(compute));
  for (const Interval& x : computing) f.busy_s += x.finish - x.start;
  f.exposed_s = uncovered_s(merged(std::move(comm)), computing);
  f.exposed_boundary_s = uncovered_s(merged(std::move(boundary)), computing);
  return f;
}

}  // namespace

std::vector<RankMemory> memory_per_rank(const Program& p) {
  std::vector<RankMemory> memory = p.memory;
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    if (const auto by = static_cast<std::size_t>(representative(p, static_cast<int64_t>(r)));
        by != r) {
      memory[r].activation_bytes = memory[by].activation_bytes;
      continue;
    }
    double live = 0, peak = 0;
    for (const Op& op : p.ranks[r]) {
      if (op.stream != StreamKind::kCompute || op.kind == OpKind::kRecv) continue;
      live += op.stash_bytes;
      peak = std::max(peak, live);
      live -= op.release_bytes;
    }
    memory[r].activation_bytes = peak;
  }
  return memory;
}

std::vector<Contributor> critical_path(const Program& p, const Timeline& t) {
  // Previous op on the same stream, per rank.
  std::map<std::string, double> by_kind;
  const OpMatching match = match_ops(p);
  std::vector<std::vector<int32_t>> previous(p.ranks.size());
  // Stream collectives: instance -> its members' (rank, op).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> instance_members(match.instances());
  for (std::size_t r = 0; r < p.ranks.size(); ++r) {
    const auto& ops = p.ranks[r];
    previous[r].assign(ops.size(), -1);
    int32_t last[3] = {-1, -1, -1};
    for (int32_t i = 0; i < static_cast<int32_t>(ops.size()); ++i) {
      const Op& op = ops[static_cast<std::size_t>(i)];
      if (op.kind == OpKind::kRecv) continue;
      const int s = static_cast<int>(op.stream);
      previous[r][static_cast<std::size_t>(i)] = last[s];
      last[s] = i;
      if (op.kind == OpKind::kCollective)
        instance_members[static_cast<std::size_t>(
                             match.instance_of[r][static_cast<std::size_t>(i)])]
            .emplace_back(static_cast<int32_t>(r), i);
    }
  }
  // Start at the op that finished last.
  int32_t rank = 0, index = -1;
  double latest = -1;
  for (std::size_t r = 0; r < t.ops.size(); ++r)
    for (std::size_t i = 0; i < t.ops[r].size(); ++i)
      if (t.ops[r][i].finish_s > latest) {
        latest = t.ops[r][i].finish_s;
        rank = static_cast<int32_t>(r);
        index = static_cast<int32_t>(i);
      }
  const double eps = 1e-12;
  std::size_t steps = 0;
  while (index >= 0 && steps++ < 10'000'000) {
    const Op& op = p.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)];
    const OpTime& time = t.ops[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)];
    by_kind[kind_of(p, op)] += time.finish_s - time.start_s;
    // What it waited for: the candidate that finished exactly at (or latest before) its start.
    int32_t next_rank = -1, next_index = -1;
    double best = -1;
    auto consider = [&](int32_t r, int32_t i) {
      if (i < 0) return;
      const double f = t.ops[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)].finish_s;
      if (f <= time.start_s + eps && f > best) {
        best = f;
        next_rank = r;
        next_index = i;
      }
    };
    for (int32_t d : op.deps) consider(rank, d);
    consider(rank, previous[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)]);
    if (op.kind == OpKind::kRecv) {
      const int32_t send =
          match.peer_op[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)];
      if (send >= 0) {
        // The receive spans the transfer: continue from whatever the send waited for.
        next_rank = static_cast<int32_t>(op.peer);
        next_index = send;
        by_kind[kind_of(p, op)] -= time.finish_s - time.start_s;  // counted at the send
      }
    }
    if (op.kind == OpKind::kCollective) {
      const auto& members = instance_members[static_cast<std::size_t>(
          match.instance_of[static_cast<std::size_t>(rank)][static_cast<std::size_t>(index)])];
      for (const auto& [mr, mi] : members) {
        for (int32_t d : p.ranks[static_cast<std::size_t>(mr)][static_cast<std::size_t>(mi)].deps)
          consider(mr, d);
        consider(mr, previous[static_cast<std::size_t>(mr)][static_cast<std::size_t>(mi)]);
      }
    }
    if (next_index < 0 || (next_rank == rank && next_index == index)) break;
    rank = next_rank;
    index = next_index;
  }
  std::vector<Contributor> out;
  for (const auto& [what, seconds] : by_kind)
    if (seconds > 0) out.push_back({what, seconds});
  std::sort(out.begin(), out.end(),
            [](const Contributor& a, const Contributor& b) { return a.seconds > b.seconds; });
  return out;
}

IterationMetrics compute_metrics(const Program& p, const Timeline& t, const ModelSpec& model,
                                 const ClusterSpec& cluster, const Batch& batch) {
  IterationMetrics m;
  m.step_s = t.step_s;
  m.samples_per_s = static_cast<double>(p.samples) / m.step_s;
  m.tokens_per_s = static_cast<double>(p.llm_tokens) / m.step_s;
  double text = 0, image = 0, audio = 0, video = 0;
  for (const Sample& s : batch.samples) {
    const SampleTokens st = sample_tokens(model, s);
    text += static_cast<double>(st.text);
    image += static_cast<double>(st.image_llm);
    audio += static_cast<double>(st.audio_llm);
    video += static_cast<double>(st.video_llm);
  }
  m.text_tokens_per_s = text / m.step_s;
  m.image_tokens_per_s = image / m.step_s;
  m.audio_tokens_per_s = audio / m.step_s;
  m.video_tokens_per_s = video / m.step_s;
  m.tflops_per_device = p.model_flops / m.step_s / static_cast<double>(p.world) / 1e12;
  m.mfu = m.tflops_per_device * 1e12 / peak_flops(cluster, model.dtype);

  const std::size_t world = p.ranks.size();
  m.bubble.assign(world, 0);
  m.exposed_comm_s.assign(world, 0);
  m.memory = memory_per_rank(p);
  // Each rank's figures, from its representative's ops (its own unless the Program is folded),
  // summed over ranks in rank order.
  std::vector<RankFigures> figures(world);
  std::vector<double> module_busy(p.modules.size(), 0);
  double worst = -1, hardware_flops = 0;
  for (std::size_t r = 0; r < world; ++r) {
    const auto by = static_cast<std::size_t>(representative(p, static_cast<int64_t>(r)));
    if (by == r) figures[r] = rank_figures(p, p.ranks[r], t.ops[r]);
    const RankFigures& f = figures[by];
    m.pipelined = m.pipelined || f.pipelined;
    hardware_flops += f.hardware_flops;
    for (std::size_t i = 0; i < p.modules.size(); ++i) module_busy[i] += f.module_busy[i];
    m.exposed_comm_s[r] = f.exposed_s;
    m.exposed_boundary_mean_s += f.exposed_boundary_s / static_cast<double>(world);
    m.bubble[r] = f.busy_s > 0 ? (m.step_s - f.busy_s) / f.busy_s : 0;
    if (m.memory[r].total() > worst) {
      worst = m.memory[r].total();
      m.peak_rank = static_cast<int64_t>(r);
    }
  }
  m.hardware_tflops_per_device = hardware_flops / m.step_s / static_cast<double>(p.world) / 1e12;
  m.hfu = m.hardware_tflops_per_device * 1e12 / peak_flops(cluster, model.dtype);
  for (std::size_t r = 0; r < world; ++r) {
    m.bubble_mean += m.bubble[r] / static_cast<double>(world);
    m.exposed_comm_mean_s += m.exposed_comm_s[r] / static_cast<double>(world);
  }
  for (std::size_t i = 0; i < p.modules.size(); ++i) {
    m.module_busy_s.emplace_back(p.modules[i], module_busy[i]);
    MicrobatchVariability v{p.modules[i], 0, 0, 0};
    int64_t ranks = 0;
    for (std::size_t r = 0; r < world; ++r) {
      const auto& times =
          figures[static_cast<std::size_t>(representative(p, static_cast<int64_t>(r)))]
              .per_microbatch[i];
      if (times.size() < 2) continue;
      double sum = 0, most = 0;
      for (const auto& [mb, seconds] : times) {
        sum += seconds;
        most = std::max(most, seconds);
      }
      const double n = static_cast<double>(times.size()), mean = sum / n;
      if (mean <= 0) continue;
      double var = 0;
      for (const auto& [mb, seconds] : times) var += (seconds - mean) * (seconds - mean) / n;
      v.cv += std::sqrt(var) / mean;
      v.max_over_mean += most / mean;
      v.microbatches = std::max<int64_t>(v.microbatches, static_cast<int64_t>(times.size()));
      ++ranks;
    }
    if (ranks == 0) continue;
    v.cv /= static_cast<double>(ranks);
    v.max_over_mean /= static_cast<double>(ranks);
    m.microbatch_variability.push_back(v);
  }
  m.critical_path = critical_path(p, t);
  return m;
}

}  // namespace tessera

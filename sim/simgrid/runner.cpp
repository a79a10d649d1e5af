#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <simgrid/s4u.hpp>

#include "shared/base/check.hpp"
#include "shared/cost/collective_cost.hpp"
#include "shared/cost/overlap_slowdown.hpp"
#include "shared/program/op_matching.hpp"
#include "sim/flow_lanes.hpp"
#include "sim/simgrid/adapter.hpp"
#include "sim/simgrid/platform.hpp"
#include "sim/twins.hpp"

namespace sg4 = simgrid::s4u;

namespace tessera::sim {

namespace {

constexpr double kHostSpeed = 1e9;  // platform.cpp sizes hosts in these units

// Everything the actors share. SimGrid actors are cooperative threads of one process, so plain
// data is safe; an actor that waits for an op suspends itself and the op's finisher resumes it.
//
// Twins (twins.hpp): ranks that provably run the same ops at the same times — TP and uniform-CP
// shards. One actor runs a whole class; every twin's transfers still become flows, so links
// carry all of the traffic. A folded Program (Program::represented_by) names its classes
// itself: only representatives have ops and times, and a member's transfers are its
// representative's moved to the member's peers and groups (Program::member_groups).
class Run {
 public:
  // Pure preparation, no SimGrid call: it runs on a thread while the platform is built.
  Run(const Program& p, const CostModel& cost, const RunOptions& options)
      : p_(p),
        cost_(cost),
        options_(options),
        folded_(!p.represented_by.empty()),
        twins_(folded_ ? folded_classes(p) : find_twins(p)) {
    const std::size_t world = p.ranks.size();
    times_.resize(world);
    nested_.resize(world);
    // A serial host runs nothing beside its collectives.
    if (!options.serial_host) extra_ = overlap_slowdown_s(p, cost);
    for (std::size_t r = 0; r < world; ++r) times_[r].assign(p.ranks[r].size(), OpTime{});
    OpMatching match = match_ops(p);
    instance_of_ = std::move(match.instance_of);
    nested_ids_ = std::move(match.nested_instance);
    receive_index_ = std::move(match.peer_op);
    instances_.resize(match.instances());
    for (std::size_t k = 0; k < instances_.size(); ++k) {
      instances_[k].group = match.instance_group[k];
      instances_[k].sequence = match.instance_sequence[k];
    }
    if (folded_) add_member_instances(match);
    // An instance completes when every class that owns one of its members has arrived.
    for (Instance& in : instances_) {
      std::vector<int32_t> classes;
      for (int64_t m : p.groups[static_cast<std::size_t>(in.group)])
        classes.push_back(twins_.leader[static_cast<std::size_t>(m)]);
      std::sort(classes.begin(), classes.end());
      in.needed =
          static_cast<int32_t>(std::unique(classes.begin(), classes.end()) - classes.begin());
    }
    done_.assign(instances_.size(), -1);
    // Ops that an op on another stream depends on.
    watched_.resize(world);
    for (std::size_t r = 0; r < world; ++r) {
      const auto& ops = p.ranks[r];
      watched_[r].assign(ops.size(), 0);
      for (const Op& op : ops)
        for (int32_t d : op.deps)
          if (ops[static_cast<std::size_t>(d)].stream != op.stream || op.kind == OpKind::kRecv)
            watched_[r][static_cast<std::size_t>(d)] = 1;
    }
    leave_out_ = flows_to_leave_out();
    watch_nvlink_ = options_.contention && !options_.nested_flows &&
                    cost_.cluster().kind != ClusterKind::kCpuLocal;
    if (watch_nvlink_) {
      nvlink_busy_.resize(world);
      // Every group a nested collective runs on (a folded class's members' groups too), once.
      std::vector<char> nested_group(p.groups.size(), 0);
      for (const auto& ops : p.ranks)
        for (const Op& op : ops)
          for (const NestedCollective& nc : op.nested) {
            const auto g = static_cast<std::size_t>(nc.group);
            nested_group[g] = 1;
            if (folded_)
              for (const int32_t m : p.member_groups[g])
                nested_group[static_cast<std::size_t>(m)] = 1;
          }
      for (std::size_t g = 0; g < p.groups.size(); ++g)
        nested_spans_nodes_ =
            nested_spans_nodes_ || (nested_group[g] && !cost_.same_node(p.groups[g]));
    }
  }

  // Flows the run may leave out because a simulated flow stands for each (flow_lanes.hpp): on
  // platforms whose limiting links are per rank — not cpu-local, no oversubscribed uplink.
  std::vector<char> flows_to_leave_out() const {
    const ClusterSpec& c = cost_.cluster();
    if (!options_.fold_twin_flows || !options_.contention || c.kind == ClusterKind::kCpuLocal ||
        twins_.classes == p_.world || (c.nodes > 1 && c.inter_node.oversubscription > 1))
      return std::vector<char>(p_.ranks.size(), 0);
    return flows_stood_for(
        p_.world, twins_.leader, c.devices_per_node,
        [this](const std::function<void(const FlowUnit&)>& visit) { flow_units(visit); });
  }

  // Every flow the run may start, by the class op that starts it. A collective's rings are
  // listed wherever it may run as flows (a calibrated one runs timed instead: listing it only
  // joins components, never splits them); the gradient norm's and, unless nested collectives
  // run as flows, theirs never do.
  void flow_units(const std::function<void(const FlowUnit&)>& visit) const {
    FlowUnit u;
    std::vector<int32_t> mine;
    for (std::size_t l = 0; l < p_.ranks.size(); ++l) {
      const auto leader = static_cast<int32_t>(l);
      if (twins_.leader[l] != leader) continue;
      for (std::size_t i = 0; i < p_.ranks[l].size(); ++i) {
        const Op& op = p_.ranks[l][i];
        const auto index = static_cast<int32_t>(i);
        auto rings = [&](int32_t n, CollectiveKind kind, double bytes, Transport transport) {
          u.clear();
          mine.clear();
          for (std::size_t k = 0; k < offsets(leader).size(); ++k)
            mine.push_back(instance(leader, k, index, n));
          std::sort(mine.begin(), mine.end());
          mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
          for (const int32_t inst : mine) {
            const Instance& in = instances_[static_cast<std::size_t>(inst)];
            const RankList& group = p_.groups[static_cast<std::size_t>(in.group)];
            if (group.size() >= 2)
              u.ring(group, in.sequence, cost_.collective_s(kind, group, bytes, transport));
          }
          if (!u.items.empty()) visit(u);
        };
        if (op.kind == OpKind::kSend) {
          u.clear();
          for (const int32_t d : offsets(leader)) {
            const Op& twin = folded_ ? op : p_.ranks[l + static_cast<std::size_t>(d)][i];
            u.send(leader + d, folded_ ? op.peer + d : twin.peer, twin.message_bytes);
          }
          visit(u);
        } else if (op.kind == OpKind::kCollective && op.purpose != Purpose::kNorm) {
          rings(-1, op.collective, op.message_bytes, Transport::kNccl);
        }
        if (options_.nested_flows)
          for (std::size_t n = 0; n < op.nested.size(); ++n)
            rings(static_cast<int32_t>(n), op.nested[n].kind, op.nested[n].bytes,
                  op.nested[n].transport);
      }
    }
  }

  // A folded Program's classes: each representative with its members, in rank order.
  static Twins folded_classes(const Program& p) {
    Twins t;
    t.leader = p.represented_by;
    t.offsets.resize(p.ranks.size());
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      const int32_t l = t.leader[r];
      t.offsets[static_cast<std::size_t>(l)].push_back(static_cast<int32_t>(r) - l);
      if (l == static_cast<int32_t>(r)) ++t.classes;
    }
    return t;
  }

  // A folded Program: the instances the members of each class enter in place of their
  // representative's — the same place in the sequence of the member's group.
  void add_member_instances(const OpMatching& match) {
    std::unordered_map<uint64_t, int32_t> ids;
    member_instance_.resize(match.instances());
    for (std::size_t k = 0; k < match.instances(); ++k) {
      const auto& groups = p_.member_groups[static_cast<std::size_t>(match.instance_group[k])];
      if (groups.empty()) continue;  // every member uses the group itself
      for (const int32_t g : groups) {
        if (g == match.instance_group[k]) {
          member_instance_[k].push_back(static_cast<int32_t>(k));
          continue;
        }
        const uint64_t key = static_cast<uint64_t>(g) << 33 |
                             static_cast<uint64_t>(match.instance_sequence[k]) << 1 |
                             static_cast<uint64_t>(match.instance_nested[k]);
        const auto [it, added] = ids.emplace(key, static_cast<int32_t>(instances_.size()));
        if (added) {
          Instance& in = instances_.emplace_back();
          in.group = g;
          in.sequence = match.instance_sequence[k];
        }
        member_instance_[k].push_back(it->second);
      }
    }
  }

  // The instance that the member `k` of `leader`'s class (its offsets' index) enters at op `i`
  // (nested index `n`, or -1 for a stream collective).
  int32_t instance(int32_t leader, std::size_t k, int32_t i, int32_t n) const {
    const int32_t rank = folded_ ? leader : leader + offsets(leader)[k];
    const int32_t base = instance_of_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)];
    const int32_t inst = n < 0 ? base : nested_ids_[static_cast<std::size_t>(base + n)];
    if (!folded_) return inst;
    const auto& members = member_instance_[static_cast<std::size_t>(inst)];
    return members.empty() ? inst : members[k];
  }

  void start(std::vector<sg4::Host*> hosts) {
    hosts_ = std::move(hosts);
    waiters_.resize(p_.ranks.size());
    for (std::size_t r = 0; r < p_.ranks.size(); ++r) {
      if (twins_.leader[r] != static_cast<int32_t>(r)) continue;
      for (StreamKind s : {StreamKind::kCompute, StreamKind::kCollective, StreamKind::kP2p}) {
        std::vector<int32_t> ops;
        for (int32_t i = 0; i < static_cast<int32_t>(p_.ranks[r].size()); ++i) {
          const Op& op = p_.ranks[r][static_cast<std::size_t>(i)];
          const StreamKind runs_on = options_.serial_host ? StreamKind::kCompute : op.stream;
          if (runs_on == s && (op.kind != OpKind::kRecv || options_.serial_host)) ops.push_back(i);
        }
        if (ops.empty()) continue;
        const auto rank = static_cast<int32_t>(r);
        sg4::Actor::create("r" + std::to_string(r) + "-" + std::to_string(static_cast<int>(s)),
                           hosts_[r], [this, rank, ops] { stream(rank, ops); });
      }
    }
  }

  Timeline timeline() {
    Timeline t;
    t.ops = times_;
    t.compute_busy_s.assign(p_.ranks.size(), 0);
    t.peak_activation_bytes.assign(p_.ranks.size(), 0);
    std::string stuck;
    int shown = 0;
    for (std::size_t r = 0; r < p_.ranks.size(); ++r)
      for (std::size_t i = 0; i < p_.ranks[r].size(); ++i) {
        const OpTime& o = times_[r][i];
        if (o.finish_s < 0) {
          if (shown++ < 5)
            stuck += (stuck.empty() ? "" : "; ") +
                     op_id(p_, static_cast<int32_t>(r), static_cast<int32_t>(i)) + " " +
                     op_name(p_, p_.ranks[r][i]);
          continue;
        }
        t.step_s = std::max(t.step_s, o.finish_s);
        if (p_.ranks[r][i].stream == StreamKind::kCompute && p_.ranks[r][i].kind != OpKind::kRecv)
          t.compute_busy_s[r] += o.finish_s - o.start_s;
      }
    if (shown > 0) t.error = "the program cannot finish: ops never ran, e.g. " + stuck;
    for (std::size_t r = 0; r < p_.ranks.size(); ++r)
      t.compute_busy_s[r] = t.compute_busy_s[static_cast<std::size_t>(twins_.leader[r])];
    t.activities = activities_;
    t.actors = actors_;
    t.folded_flows = folded_flows_;
    t.nested_shared_links = watch_nvlink_ && (nested_spans_nodes_ || nested_met_transfers());
    t.nested = nested_;
    return t;
  }

 private:
  struct Instance {
    int32_t group = -1;
    int32_t sequence = 0;  // its place among its group's collectives
    int32_t arrived = 0;
    int32_t needed = 0;  // distinct twin classes among the members
    std::vector<std::tuple<int32_t, int32_t, int32_t, double>>
        members;  // (class leader, op, nested index or -1, arrival time)
  };

  const std::vector<int32_t>& offsets(int32_t leader) const {
    return twins_.offsets[static_cast<std::size_t>(leader)];
  }
  // The members of `leader`'s class that have ops and times: all of them, or in a folded
  // Program the representative alone.
  const std::vector<int32_t>& timed(int32_t leader) const {
    static const std::vector<int32_t> alone{0};
    return folded_ ? alone : offsets(leader);
  }

  // The factor by which this instance of compute op `i` of `rank` varies around its fitted
  // cost (the profile's measured spread; 1 without one).
  double compute_variation(int32_t rank, int32_t i) const {
    const auto* spread =
        cost_.compute_spread(p_.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)]);
    if (spread == nullptr) return 1;
    return spread_factor(
        *spread, spread_draw(static_cast<uint64_t>(p_.iteration), static_cast<uint64_t>(rank),
                             static_cast<uint64_t>(i), 1));
  }

  // Seconds compute op `i` of class `leader` runs longer beside its rank's collectives
  // (overlap_slowdown.hpp: taken from the analytic timeline, as the evaluator takes them).
  double extra_s(int32_t leader, int32_t i) const {
    return extra_.empty() ? 0.0
                          : extra_[static_cast<std::size_t>(leader)][static_cast<std::size_t>(i)];
  }

  // A nested collective of `count` calls as the executor records it: one slice per call, the
  // first from the class's arrival (it waits for the last member), the rest back to back.
  void record_nested(int32_t leader, int32_t i, int32_t n, double arrived, double last,
                     double end) {
    const Op& op = p_.ranks[static_cast<std::size_t>(leader)][static_cast<std::size_t>(i)];
    const NestedCollective& nc = op.nested[static_cast<std::size_t>(n)];
    const double each = (end - last) / std::max(1, nc.count);
    for (int32_t d : timed(leader))
      for (int32_t c = 0; c < nc.count; ++c)
        nested_[static_cast<std::size_t>(leader + d)].push_back(
            {i, nc.kind, c == 0 ? arrived : last + c * each, last + (c + 1) * each, nc.bytes});
  }

  // Resumes the actors of `rank`'s class that wait for one of its ops; each checks again.
  void wake(int32_t rank) {
    auto& waiting =
        waiters_[static_cast<std::size_t>(twins_.leader[static_cast<std::size_t>(rank)])];
    if (waiting.empty()) return;
    std::vector<sg4::Actor*> resumed;
    resumed.swap(waiting);
    for (sg4::Actor* a : resumed) a->resume();
  }

  // Sets the times of op `i` on `rank` and on all of its twins.
  void finish_class(int32_t leader, int32_t i, double start, double end) {
    for (int32_t d : timed(leader))
      times_[static_cast<std::size_t>(leader + d)][static_cast<std::size_t>(i)] = {start, end};
    wake(leader);
  }

  // Waits until `ready()`. Actors are cooperative threads: nothing runs between the check and
  // the suspension, so a plain suspend/resume cannot lose a wake-up.
  template <class Ready>
  void block(int32_t leader, Ready ready) {
    while (!ready()) {
      waiters_[static_cast<std::size_t>(leader)].push_back(sg4::Actor::self());
      sg4::this_actor::suspend();
    }
  }

  // NVLink links carry transfers between ranks of one node. With nested collectives timed,
  // each rank's transfers over them are remembered, to check afterwards that none ran while the
  // rank was in a compute op with nested collectives (whose ring flows would have used them).
  void used_nvlink(int32_t a, int32_t b, double start, double end) {
    if (!watch_nvlink_ || !cost_.same_node({a, b})) return;
    nvlink_busy_[static_cast<std::size_t>(a)].emplace_back(start, end);
    nvlink_busy_[static_cast<std::size_t>(b)].emplace_back(start, end);
  }
  bool nested_met_transfers() {
    for (std::size_t l = 0; l < p_.ranks.size(); ++l) {
      if (twins_.leader[l] != static_cast<int32_t>(l)) continue;
      // The class's compute ops with nested collectives, in stream order; its members ran them
      // at the same times.
      std::vector<std::pair<double, double>> nested;
      for (std::size_t i = 0; i < p_.ranks[l].size(); ++i)
        if (!p_.ranks[l][i].nested.empty())
          nested.emplace_back(times_[l][i].start_s, times_[l][i].finish_s);
      if (nested.empty()) continue;
      for (const int32_t d : offsets(static_cast<int32_t>(l))) {
        auto& busy = nvlink_busy_[l + static_cast<std::size_t>(d)];
        std::sort(busy.begin(), busy.end());
        std::size_t j = 0;
        for (const auto& [start, finish] : nested) {
          while (j < busy.size() && busy[j].second <= start) ++j;
          for (std::size_t k = j; k < busy.size() && busy[k].first < finish; ++k)
            if (busy[k].second > start) return true;
        }
      }
    }
    return false;
  }

  void sleep(double seconds) {
    if (seconds <= 0) return;
    ++activities_;
    sg4::this_actor::sleep_for(seconds);
  }

  struct Flow {
    sg4::Host* from;
    sg4::Host* to;
    uint64_t bytes;
  };

  // Runs `flows` concurrently and returns when all arrived. SimGrid 3.32 keeps an actor's
  // activities in a list that it searches linearly on every completion, so one actor waiting on
  // thousands of flows costs quadratic time: large batches go to helper actors of <= 64 flows.
  void run_flows(const std::vector<Flow>& flows) {
    activities_ += static_cast<int64_t>(flows.size());
    constexpr std::size_t kBatch = 64;
    auto run_batch = [](const Flow* begin, const Flow* end) {
      std::vector<sg4::CommPtr> comms;
      for (const Flow* f = begin; f != end; ++f)
        comms.push_back(sg4::Comm::sendto_async(f->from, f->to, f->bytes));
      sg4::Comm::wait_all(comms);
    };
    if (flows.size() <= kBatch) {
      run_batch(flows.data(), flows.data() + flows.size());
      return;
    }
    const std::size_t batches = (flows.size() + kBatch - 1) / kBatch;
    auto barrier = sg4::Barrier::create(static_cast<unsigned>(batches + 1));
    for (std::size_t b = 0; b < batches; ++b) {
      const Flow* begin = flows.data() + b * kBatch;
      const Flow* end = flows.data() + std::min(flows.size(), (b + 1) * kBatch);
      sg4::Actor::create("flows", begin->from, [run_batch, begin, end, barrier] {
        run_batch(begin, end);
        barrier->wait();
      });
    }
    barrier->wait();
  }

  // The ring flows of one collective over `group`, `count` calls back to back. Returns the
  // extra time to wait after the flows (beyond each flow's own route latency). Alone on their
  // links the flows and that wait take exactly the cost model's collective_s, whatever curve
  // priced it: each flow carries the bandwidth part of that time at its ring's slowest link.
  double launch_ring(CollectiveKind kind, const RankList& group, double bytes, int32_t count,
                     Transport transport, std::vector<Flow>& flows) {
    const ClusterSpec& cluster = cost_.cluster();
    const bool local = cost_.same_node(group);
    const double alpha = local ? cluster.intra_node.latency_s : cluster.inter_node.link.latency_s;
    const double efficiency = cost_.params().bandwidth_efficiency;
    const double nvlink = cluster.intra_node.bandwidth_bytes_per_s * efficiency;
    const double slowest =
        local ? nvlink
              : std::min(nvlink, cluster.inter_node.link.bandwidth_bytes_per_s * efficiency);
    const auto n = static_cast<int64_t>(group.size());
    double latency = latency_steps(kind, n) * alpha;
    // α–β links: the bus volume itself (the flows meet the fabric's oversubscription on the
    // uplinks), an all-to-all across nodes at its own rate; NCCL curves: the curve's time at the
    // slowest link of the ring.
    double rate = slowest;
    if (kind == CollectiveKind::kAllToAll && !local) {
      const AllToAllRate a2a = all_to_all_rate(cluster.inter_node, transport, efficiency, latency,
                                               group_span(cluster, group).nodes);
      rate *= a2a.efficiency / efficiency;
      latency = a2a.latency_s;
    }
    double bandwidth_part = bus_factor(kind, n) * bytes / rate;
    double each = latency + bandwidth_part;
    if (!cluster.intra_node_collectives.empty()) {
      each = cost_.collective_s(kind, group, bytes, transport);
      bandwidth_part = std::max(0.0, each - latency);
    }
    launch(group, count * bandwidth_part * slowest, flows);
    return count * (each - bandwidth_part) - alpha;
  }
  // One flow of `volume` bytes from each member to the next around the ring.
  void launch(const RankList& group, double volume, std::vector<Flow>& flows) {
    for (std::size_t i = 0; i < group.size(); ++i)
      flows.push_back({hosts_[static_cast<std::size_t>(group[i])],
                       hosts_[static_cast<std::size_t>(group[(i + 1) % group.size()])],
                       static_cast<uint64_t>(volume)});
  }

  // The class of `leader` reaches collective op `i` (nested index `n`, or -1 for a stream
  // collective): it arrives at the instance of every twin, and the class that completes an
  // instance runs it. Returns when all of this class's instances are done.
  void collective(int32_t leader, int32_t i, int32_t n) {
    const Op& op = p_.ranks[static_cast<std::size_t>(leader)][static_cast<std::size_t>(i)];
    std::vector<int32_t> mine;  // distinct instances of this class's ranks
    for (std::size_t k = 0; k < offsets(leader).size(); ++k) {
      const int32_t inst = instance(leader, k, i, n);
      if (std::find(mine.begin(), mine.end(), inst) == mine.end()) mine.push_back(inst);
    }
    const double now = sg4::Engine::get_clock();
    std::vector<int32_t> complete;
    for (int32_t inst : mine) {
      Instance& in = instances_[static_cast<std::size_t>(inst)];
      in.members.emplace_back(leader, i, n, now);
      if (++in.arrived == in.needed) complete.push_back(inst);
    }
    if (!complete.empty()) {
      // This class is the last to arrive at these instances: run them together.
      const auto kind = n < 0 ? op.collective : op.nested[static_cast<std::size_t>(n)].kind;
      const double bytes = n < 0 ? op.message_bytes : op.nested[static_cast<std::size_t>(n)].bytes;
      const int32_t count = n < 0 ? 1 : op.nested[static_cast<std::size_t>(n)].count;
      const Transport transport =
          n < 0 ? Transport::kNccl : op.nested[static_cast<std::size_t>(n)].transport;
      const RankList& first_group = p_.groups[static_cast<std::size_t>(
          instances_[static_cast<std::size_t>(complete.front())].group)];
      // A collective class the cost model was calibrated on runs at its measured cost.
      // The gradient norm's 16 bytes are all latency: a timed activity, never flows.
      const bool flows_wanted = options_.contention && (n < 0 || options_.nested_flows) &&
                                !cost_.calibrated_collective(kind, first_group) &&
                                !(n < 0 && op.purpose == Purpose::kNorm);
      if (!flows_wanted || first_group.size() < 2 || bytes <= 0) {
        const double each = cost_.collective_s(kind, first_group, bytes, transport);
        if (const auto* spread = cost_.collective_spread(kind, first_group)) {
          // Every call varies on its own (the profile's measured spread).
          double total = 0;
          for (int32_t c = 0; c < count; ++c)
            total +=
                each * spread_factor(*spread, spread_draw(static_cast<uint64_t>(p_.iteration),
                                                          static_cast<uint64_t>(complete.front()),
                                                          static_cast<uint64_t>(n + 1),
                                                          static_cast<uint64_t>(c)));
          sleep(total);
        } else {
          sleep(count * each);
        }
      } else {
        std::vector<Flow> flows;
        double extra = 0;
        for (int32_t inst : complete) {
          const RankList& group =
              p_.groups[static_cast<std::size_t>(instances_[static_cast<std::size_t>(inst)].group)];
          // Another instance's flows stand for this one's (flow_lanes.hpp): not simulated.
          if (leave_out_[static_cast<std::size_t>(group.front())]) {
            folded_flows_ += static_cast<int64_t>(group.size());
            continue;
          }
          extra = std::max(extra, launch_ring(kind, group, bytes, count, transport, flows));
        }
        run_flows(flows);
        sleep(extra);
        for (int32_t inst : complete) {
          const RankList& group =
              p_.groups[static_cast<std::size_t>(instances_[static_cast<std::size_t>(inst)].group)];
          for (std::size_t m = 0; m < group.size(); ++m)
            used_nvlink(static_cast<int32_t>(group[m]),
                        static_cast<int32_t>(group[(m + 1) % group.size()]), now,
                        sg4::Engine::get_clock());
        }
      }
      const double end = sg4::Engine::get_clock();
      for (int32_t inst : complete) {
        done_[static_cast<std::size_t>(inst)] = end;
        for (const auto& [ml, mi, mn, arrived] :
             instances_[static_cast<std::size_t>(inst)].members) {
          if (mn < 0) {
            finish_class(ml, mi, now, end);
          } else {
            record_nested(ml, mi, mn, arrived, now, end);
            wake(ml);
          }
        }
      }
    }
    block(leader, [&] {
      return std::all_of(mine.begin(), mine.end(),
                         [&](int32_t inst) { return done_[static_cast<std::size_t>(inst)] >= 0; });
    });
  }

  // Seconds op `i` of class `leader` takes when it can run without waiting for anyone: its
  // compute part plus the nested collectives its class runs alone (every member of their
  // groups is a twin) as timed activities. Negative when the op must go through the general
  // path (nested flows, or nested collectives shared with other classes, or shared cores).
  double solo_seconds(int32_t leader, int32_t i) const {
    const Op& op = p_.ranks[static_cast<std::size_t>(leader)][static_cast<std::size_t>(i)];
    if (op.kind != OpKind::kCompute && op.kind != OpKind::kOptimizerStep) return -1;
    if (options_.contention && cost_.cluster().kind == ClusterKind::kCpuLocal) return -1;
    double seconds = cost_.compute_only_s(p_, leader, static_cast<std::size_t>(i)) *
                         compute_variation(leader, i) +
                     extra_s(leader, i);
    if (op.nested.empty()) return seconds;
    if (options_.contention && options_.nested_flows) return -1;
    for (std::size_t n = 0; n < op.nested.size(); ++n) {
      for (std::size_t k = 0; k < offsets(leader).size(); ++k)
        if (instances_[static_cast<std::size_t>(instance(leader, k, i, static_cast<int32_t>(n)))]
                .needed != 1)
          return -1;
      const NestedCollective& nc = op.nested[n];
      seconds += nc.count * cost_.collective_s(p_, nc);
    }
    return seconds;
  }

  void stream(int32_t leader, const std::vector<int32_t>& ops) {
    ++actors_;
    const auto& list = p_.ranks[static_cast<std::size_t>(leader)];
    const auto& t = times_[static_cast<std::size_t>(leader)];
    for (std::size_t k = 0; k < ops.size(); ++k) {
      const int32_t i = ops[k];
      const Op& op = list[static_cast<std::size_t>(i)];
      for (int32_t d : op.deps)
        block(leader, [&] { return t[static_cast<std::size_t>(d)].finish_s >= 0; });
      const double start = sg4::Engine::get_clock();
      // A run of compute ops that need nobody else, each of whose inputs is complete (or inside
      // the run), is one timed activity; every op still gets its own start and finish.
      if (const double first = solo_seconds(leader, i); first >= 0) {
        std::vector<std::pair<int32_t, double>> run{{i, first}};
        double total = first;
        // A run ends at an op another stream waits for: that stream must see it finish on time.
        while (k + 1 < ops.size() && !watched_[static_cast<std::size_t>(leader)]
                                              [static_cast<std::size_t>(run.back().first)]) {
          const int32_t next = ops[k + 1];
          const double seconds = solo_seconds(leader, next);
          if (seconds < 0) break;
          const auto& deps = list[static_cast<std::size_t>(next)].deps;
          const bool ready = std::all_of(deps.begin(), deps.end(), [&](int32_t d) {
            return t[static_cast<std::size_t>(d)].finish_s >= 0 ||
                   std::any_of(run.begin(), run.end(), [d](const auto& e) { return e.first == d; });
          });
          if (!ready) break;
          run.emplace_back(next, seconds);
          total += seconds;
          ++k;
        }
        sleep(total);
        double at = start;
        for (const auto& [index, seconds] : run) {
          for (int32_t d : timed(leader))
            times_[static_cast<std::size_t>(leader + d)][static_cast<std::size_t>(index)] = {
                at, at + seconds};
          at += seconds;
        }
        wake(leader);
        continue;
      }
      switch (op.kind) {
        case OpKind::kCompute:
        case OpKind::kOptimizerStep: {
          if (options_.contention && cost_.cluster().kind == ClusterKind::kCpuLocal) {
            // Ranks share the machine's cores: the host runs min(1, cores / running) of each
            // execution, one per twin of the class.
            std::vector<sg4::ExecPtr> running;
            for (std::size_t d = 0; d < offsets(leader).size(); ++d)
              running.push_back(sg4::this_actor::exec_async(
                  (cost_.dedicated_compute_s(p_.ranks[static_cast<std::size_t>(leader)],
                                             static_cast<std::size_t>(i)) *
                       compute_variation(leader + offsets(leader)[d], i) +
                   extra_s(leader, i)) *
                  kHostSpeed));
            activities_ += static_cast<int64_t>(running.size());
            for (const sg4::ExecPtr& e : running) e->wait();
          } else {
            sleep(cost_.compute_only_s(p_, leader, static_cast<std::size_t>(i)) *
                      compute_variation(leader, i) +
                  extra_s(leader, i));
          }
          for (std::size_t n = 0; n < op.nested.size(); ++n)
            collective(leader, i, static_cast<int32_t>(n));
          finish_class(leader, i, start, sg4::Engine::get_clock());
          break;
        }
        case OpKind::kSend: {
          // Every twin sends its own message to its own peer.
          if (options_.contention && !cost_.calibrated_p2p(leader, op.peer)) {
            std::vector<Flow> flows;
            std::vector<std::pair<int32_t, int32_t>> ends;  // (sender, receiver) of each twin
            for (int32_t d : offsets(leader)) {
              // A folded member's message: its representative's, moved by the same offset.
              const Op& twin =
                  folded_
                      ? op
                      : p_.ranks[static_cast<std::size_t>(leader + d)][static_cast<std::size_t>(i)];
              const int32_t peer = folded_ ? op.peer + d : twin.peer;
              ends.emplace_back(leader + d, peer);
              if (leave_out_[static_cast<std::size_t>(leader + d)]) {
                ++folded_flows_;
                continue;
              }
              flows.push_back({hosts_[static_cast<std::size_t>(leader + d)],
                               hosts_[static_cast<std::size_t>(peer)],
                               static_cast<uint64_t>(twin.message_bytes)});
            }
            run_flows(flows);
            for (const auto& [from, to] : ends)
              used_nvlink(from, to, start, sg4::Engine::get_clock());
          } else {
            const auto* spread = cost_.p2p_spread(leader, op.peer);
            sleep(cost_.p2p_s(leader, op.peer, op.message_bytes) *
                  (spread == nullptr
                       ? 1.0
                       : spread_factor(*spread, spread_draw(static_cast<uint64_t>(p_.iteration),
                                                            static_cast<uint64_t>(leader),
                                                            static_cast<uint64_t>(i), 2))));
          }
          const double end = sg4::Engine::get_clock();
          for (int32_t d : timed(leader)) {
            const int32_t rank = leader + d;
            const Op& twin = p_.ranks[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)];
            const int32_t receive =
                receive_index_[static_cast<std::size_t>(rank)][static_cast<std::size_t>(i)];
            if (receive >= 0) {
              times_[static_cast<std::size_t>(twin.peer)][static_cast<std::size_t>(receive)] = {
                  start, end};
              wake(twin.peer);
            }
          }
          finish_class(leader, i, start, end);
          break;
        }
        case OpKind::kCollective:
          collective(leader, i, -1);
          break;
        case OpKind::kRecv:  // serial host: it waits here for the message
          block(leader, [&] { return t[static_cast<std::size_t>(i)].finish_s >= 0; });
          break;
      }
    }
  }

  const Program& p_;
  const CostModel& cost_;
  RunOptions options_;
  std::vector<sg4::Host*> hosts_;
  bool folded_ = false;  // a folded Program (Program::represented_by)
  Twins twins_;
  // A folded Program: [representative's instance] -> the instance each member of its class
  // enters in its place (empty: the same one).
  std::vector<std::vector<int32_t>> member_instance_;
  std::vector<std::vector<OpTime>> times_;
  std::vector<std::vector<NestedSlice>> nested_;     // [rank]: nested collectives as they ran
  ComputeExtras extra_;                              // [rank][op]: overlap_slowdown_s
  std::vector<std::vector<sg4::Actor*>> waiters_;    // per class leader: suspended actors
  std::vector<std::vector<int32_t>> receive_index_;  // [rank][send op] -> receive op on the peer
                                                     // (op_matching.hpp: peer_op)
  std::vector<Instance> instances_;
  std::vector<double> done_;
  // [rank][op]: a collective's instance, or a compute op's first index into nested_ids_.
  std::vector<std::vector<int32_t>> instance_of_;
  std::vector<int32_t> nested_ids_;
  std::vector<std::vector<char>> watched_;  // [rank][op]: another stream depends on it
  int64_t activities_ = 0;
  int64_t actors_ = 0;
  std::vector<char> leave_out_;  // [rank]: flows it starts are stood for (flows_to_leave_out)
  int64_t folded_flows_ = 0;     // flows left out: others stood for them
  // Nested collectives timed: [rank] -> intervals of its transfers over NVLink links, and
  // whether some nested group spans nodes (its ring flows would cross NICs).
  bool watch_nvlink_ = false, nested_spans_nodes_ = false;
  std::vector<std::vector<std::pair<double, double>>> nvlink_busy_;
};

}  // namespace

Timeline run_program(const Program& program, const CostModel& cost, const RunOptions& options) {
  auto engine = make_engine();
  // Preparing the run (op matching, twins) and building the platform are independent: overlap
  // them on the machine's second core.
  std::optional<Run> run;
  std::exception_ptr failed;
  std::thread prepare([&] {
    try {
      run.emplace(program, cost, options);
    } catch (...) {
      failed = std::current_exception();
    }
  });
  std::vector<sg4::Host*> hosts;
  try {
    hosts = build_platform(cost.cluster(), cost.params().bandwidth_efficiency, program.world);
  } catch (...) {
    prepare.join();
    throw;
  }
  prepare.join();
  if (failed) std::rethrow_exception(failed);
  run->start(std::move(hosts));
  engine->run();
  return run->timeline();
}

}  // namespace tessera::sim

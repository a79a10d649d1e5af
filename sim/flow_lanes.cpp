#include "sim/flow_lanes.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

namespace tessera::sim {

void FlowUnit::send(int32_t from, int32_t to, double bytes) {
  Item item;
  item.first = static_cast<int32_t>(ranks.size());
  item.count = 2;
  item.key[0] = bytes;
  ranks.push_back(from);
  ranks.push_back(to);
  items.push_back(item);
}

void FlowUnit::ring(const RankList& group, int32_t sequence, double seconds) {
  Item item;
  item.first = static_cast<int32_t>(ranks.size());
  item.count = static_cast<int32_t>(group.size());
  item.ring = true;
  item.key[0] = sequence;
  item.key[1] = seconds;
  for (const int64_t r : group) ranks.push_back(static_cast<int32_t>(r));
  items.push_back(item);
}

void FlowUnit::clear() {
  ranks.clear();
  items.clear();
}

namespace {

struct Components {
  std::vector<int32_t> parent;
  explicit Components(int64_t n) : parent(static_cast<std::size_t>(n)) {
    std::iota(parent.begin(), parent.end(), 0);
  }
  int32_t find(int32_t r) {
    while (parent[static_cast<std::size_t>(r)] != r) {
      auto& p = parent[static_cast<std::size_t>(r)];
      p = parent[static_cast<std::size_t>(p)];
      r = p;
    }
    return r;
  }
  void join(int32_t a, int32_t b) {
    a = find(a);
    b = find(b);
    if (a != b) parent[static_cast<std::size_t>(std::max(a, b))] = std::min(a, b);
  }
};

}  // namespace

std::vector<char> flows_stood_for(int64_t world, const std::vector<int32_t>& leader,
                                  int64_t devices_per_node, const FlowUnits& units) {
  const auto n = static_cast<std::size_t>(world);
  // Components of ranks joined by flows; the root of each is its smallest rank.
  Components c(world);
  std::vector<char> flows(n, 0);
  units([&](const FlowUnit& u) {
    for (const FlowUnit::Item& item : u.items)
      for (int32_t k = 0; k < item.count; ++k) {
        const int32_t r = u.ranks[static_cast<std::size_t>(item.first + k)];
        flows[static_cast<std::size_t>(r)] = 1;
        c.join(u.ranks[static_cast<std::size_t>(item.first)], r);
      }
  });
  std::vector<int32_t> root(n), size(n, 0);
  std::vector<char> has_leader(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    root[r] = c.find(static_cast<int32_t>(r));
    ++size[static_cast<std::size_t>(root[r])];
    if (leader[r] == static_cast<int32_t>(r)) has_leader[static_cast<std::size_t>(root[r])] = 1;
  }
  // A candidate: a component with flows and no leader, whose smallest rank m lies δ = m − L
  // from its class leader L, where L is the smallest rank of a component of the same size.
  std::vector<int32_t> delta(n, 0), items(n, 0);
  std::vector<char> candidate(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    if (root[r] != static_cast<int32_t>(r) || has_leader[r] || !flows[r]) continue;
    const int32_t l = leader[r];
    if (root[static_cast<std::size_t>(l)] != l || size[static_cast<std::size_t>(l)] != size[r])
      continue;
    candidate[r] = 1;
    delta[r] = static_cast<int32_t>(r) - l;
  }
  // Every item of a candidate must have its stand-in in the same unit: the item moved by −δ,
  // in the leader's component, with the same keys, crossing nodes where it crosses them. The
  // map is one to one (a move is), so equal item counts make it a bijection.
  auto node = [&](int32_t r) { return r / devices_per_node; };
  auto same_node = [&](const FlowUnit& u, const FlowUnit::Item& item, int32_t a, int32_t b) {
    return node(u.ranks[static_cast<std::size_t>(item.first + a)]) ==
           node(u.ranks[static_cast<std::size_t>(item.first + b)]);
  };
  auto first_of = [](const FlowUnit& u, const FlowUnit::Item& item) {
    return u.ranks[static_cast<std::size_t>(item.first)];
  };
  auto component = [&](int32_t r) {
    return static_cast<std::size_t>(root[static_cast<std::size_t>(r)]);
  };
  std::vector<std::pair<int32_t, int32_t>> standing;  // (first rank, item) outside candidates
  std::vector<int32_t> moved;                         // first ranks of the candidates' items
  units([&](const FlowUnit& u) {
    standing.clear();
    for (std::size_t i = 0; i < u.items.size(); ++i) {
      const int32_t first = first_of(u, u.items[i]);
      const std::size_t comp = component(first);
      ++items[comp];
      if (!candidate[comp]) standing.emplace_back(first, static_cast<int32_t>(i));
    }
    std::sort(standing.begin(), standing.end());
    // Two items of a candidate that start at one rank would share a stand-in: not one to one.
    moved.clear();
    for (const FlowUnit::Item& item : u.items)
      if (candidate[component(first_of(u, item))]) moved.push_back(first_of(u, item));
    std::sort(moved.begin(), moved.end());
    for (std::size_t k = 1; k < moved.size(); ++k)
      if (moved[k] == moved[k - 1]) candidate[component(moved[k])] = 0;
    for (const FlowUnit::Item& item : u.items) {
      const int32_t first = first_of(u, item);
      const std::size_t comp = component(first);
      if (!candidate[comp]) continue;
      const int32_t d = delta[comp];
      auto at = std::lower_bound(standing.begin(), standing.end(),
                                 std::make_pair(first - d, int32_t{-1}));
      bool ok = at != standing.end() && at->first == first - d &&
                (at + 1 == standing.end() || (at + 1)->first != first - d);
      if (ok) {
        const FlowUnit::Item& other = u.items[static_cast<std::size_t>(at->second)];
        ok = other.ring == item.ring && other.count == item.count && other.key[0] == item.key[0] &&
             other.key[1] == item.key[1] &&
             root[static_cast<std::size_t>(first - d)] == static_cast<int32_t>(comp) - d;
        for (int32_t k = 0; ok && k < item.count; ++k) {
          const int32_t next = item.ring ? (k + 1) % item.count : 1;
          ok = u.ranks[static_cast<std::size_t>(other.first + k)] ==
                   u.ranks[static_cast<std::size_t>(item.first + k)] - d &&
               same_node(u, other, k, next) == same_node(u, item, k, next);
        }
      }
      if (!ok) candidate[comp] = 0;  // simulated after all
    }
  });
  std::vector<char> dropped(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    const auto comp = static_cast<std::size_t>(root[r]);
    dropped[r] =
        candidate[comp] && items[comp] == items[comp - static_cast<std::size_t>(delta[comp])];
  }
  return dropped;
}

}  // namespace tessera::sim

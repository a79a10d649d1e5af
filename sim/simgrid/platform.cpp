#include "sim/simgrid/platform.hpp"

#include <string>

#include "shared/base/check.hpp"
#include "sim/simgrid/adapter.hpp"

namespace sg4 = simgrid::s4u;

namespace tessera::sim {

namespace {

// Unit host speed: executions are sized in seconds (the cost model owns efficiency).
constexpr double kHostSpeed = 1e9;

const sg4::Link* make_link(sg4::NetZone* zone, const std::string& name, double bandwidth,
                           double latency) {
  return zone->create_link(name, bandwidth)->set_latency(latency)->seal();
}

}  // namespace

std::unique_ptr<sg4::Engine> make_engine() {
  static char program[] = "tessera";
  static char quiet[] = "--log=root.thres:critical";
  static char* argv[] = {program, quiet, nullptr};
  int argc = 2;
  auto engine = std::make_unique<sg4::Engine>(&argc, argv);
  engine->set_config("network/model:CM02");
  engine->set_config("network/crosstraffic:0");
  engine->set_config("network/TCP-gamma:0");
  return engine;
}

std::vector<sg4::Host*> build_platform(const ClusterSpec& cluster, double efficiency,
                                       int64_t world) {
  std::vector<sg4::Host*> hosts;
  if (cluster.kind == ClusterKind::kCpuLocal) {
    auto* zone = sg4::create_full_zone("cpu-local");
    sg4::Host* host = zone->create_host("cpu", kHostSpeed)
                          ->set_core_count(static_cast<int>(cluster.cores))
                          ->seal();
    const sg4::Link* loopback =
        make_link(zone, "loopback", cluster.intra_node.bandwidth_bytes_per_s * efficiency,
                  cluster.intra_node.latency_s);
    zone->add_route(host->get_netpoint(), host->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(loopback)}, false);
    zone->seal();
    hosts.assign(static_cast<std::size_t>(world), host);
    return hosts;
  }
  const int64_t per_node = cluster.devices_per_node;
  if (cluster.nodes == 1) {
    // One node: NVLink routes only.
    auto* zone = sg4::create_full_zone("node0");
    std::vector<const sg4::Link*> up, down;
    for (int64_t d = 0; d < per_node; ++d) {
      const std::string name = "node0-gpu" + std::to_string(d);
      hosts.push_back(zone->create_host(name, kHostSpeed)->seal());
      up.push_back(make_link(zone, name + "-nv-up",
                             cluster.intra_node.bandwidth_bytes_per_s * efficiency,
                             cluster.intra_node.latency_s / 2));
      down.push_back(make_link(zone, name + "-nv-down",
                               cluster.intra_node.bandwidth_bytes_per_s * efficiency,
                               cluster.intra_node.latency_s / 2));
    }
    for (std::size_t a = 0; a < hosts.size(); ++a)
      for (std::size_t b = 0; b < hosts.size(); ++b)
        if (a != b)
          zone->add_route(hosts[a]->get_netpoint(), hosts[b]->get_netpoint(), nullptr, nullptr,
                          {sg4::LinkInRoute(up[a]), sg4::LinkInRoute(down[b])}, false);
    zone->seal();
    TESSERA_CHECK(static_cast<int64_t>(hosts.size()) >= world,
                  "the plan has more ranks than the cluster has devices");
    hosts.resize(static_cast<std::size_t>(world));
    return hosts;
  }
  const double nvlink = cluster.intra_node.bandwidth_bytes_per_s * efficiency;
  const double nic = cluster.inter_node.link.bandwidth_bytes_per_s * efficiency;
  const double uplink =
      nic * static_cast<double>(per_node) / std::max(1.0, cluster.inter_node.oversubscription);
  auto* root = sg4::create_star_zone("cluster");
  // SimGrid 3.32 checks a new link's name against every zone of the tree, so links created
  // inside 1024 node zones cost quadratic time. All links go to the root first, while it has no
  // children; a route may use links of any zone.
  struct NodeLinks {
    std::vector<const sg4::Link*> nv_up, nv_down, nic_up, nic_down;
  };
  std::vector<NodeLinks> links(static_cast<std::size_t>(cluster.nodes));
  for (int64_t n = 0; n < cluster.nodes; ++n)
    for (int64_t d = 0; d < per_node; ++d) {
      const std::string name = "node" + std::to_string(n) + "-gpu" + std::to_string(d);
      NodeLinks& l = links[static_cast<std::size_t>(n)];
      l.nv_up.push_back(make_link(root, name + "-nv-up", nvlink, cluster.intra_node.latency_s / 2));
      l.nv_down.push_back(
          make_link(root, name + "-nv-down", nvlink, cluster.intra_node.latency_s / 2));
      l.nic_up.push_back(
          make_link(root, name + "-nic-up", nic, cluster.inter_node.link.latency_s / 2));
      l.nic_down.push_back(
          make_link(root, name + "-nic-down", nic, cluster.inter_node.link.latency_s / 2));
    }
  for (int64_t n = 0; n < cluster.nodes; ++n) {
    const std::string node = "node" + std::to_string(n);
    auto* zone = sg4::create_full_zone(node);
    zone->set_parent(root);
    auto* gateway = zone->create_router(node + "-gw");
    std::vector<sg4::Host*> local;
    const auto& [nv_up, nv_down, nic_up, nic_down] = links[static_cast<std::size_t>(n)];
    for (int64_t d = 0; d < per_node; ++d)
      local.push_back(zone->create_host(node + "-gpu" + std::to_string(d), kHostSpeed)->seal());
    for (std::size_t a = 0; a < local.size(); ++a) {
      for (std::size_t b = 0; b < local.size(); ++b)
        if (a != b)
          zone->add_route(local[a]->get_netpoint(), local[b]->get_netpoint(), nullptr, nullptr,
                          {sg4::LinkInRoute(nv_up[a]), sg4::LinkInRoute(nv_down[b])}, false);
      zone->add_route(local[a]->get_netpoint(), gateway, nullptr, nullptr,
                      {sg4::LinkInRoute(nic_up[a])}, false);
      zone->add_route(gateway, local[a]->get_netpoint(), nullptr, nullptr,
                      {sg4::LinkInRoute(nic_down[a])}, false);
    }
    zone->seal();
    // The node's uplink into the fabric, one split-duplex link (star zone: UP leaves, DOWN enters).
    auto* up = root->create_split_duplex_link(node + "-uplink", uplink)->set_latency(0)->seal();
    root->add_route(zone->get_netpoint(), nullptr, gateway, nullptr,
                    {sg4::LinkInRoute(up, sg4::LinkInRoute::Direction::UP)}, true);
    hosts.insert(hosts.end(), local.begin(), local.end());
  }
  root->seal();
  TESSERA_CHECK(static_cast<int64_t>(hosts.size()) >= world,
                "the plan has more ranks than the cluster has devices");
  hosts.resize(static_cast<std::size_t>(world));
  return hosts;
}

double simulate_lone_transfer_s(double bandwidth_bytes_per_s, double latency_s, double bytes) {
  TESSERA_CHECK(bandwidth_bytes_per_s > 0 && latency_s >= 0 && bytes >= 0);
  auto engine = make_engine();
  auto* zone = sg4::create_full_zone("world");
  sg4::Host* a = zone->create_host("a", kHostSpeed);
  sg4::Host* b = zone->create_host("b", kHostSpeed);
  const sg4::Link* link = make_link(zone, "link", bandwidth_bytes_per_s, latency_s);
  zone->add_route(a->get_netpoint(), b->get_netpoint(), nullptr, nullptr, {sg4::LinkInRoute(link)},
                  true);
  zone->seal();
  double arrived_s = -1;
  sg4::Actor::create("sender", a, [&arrived_s, a, b, bytes] {
    sg4::Comm::sendto(a, b, static_cast<uint64_t>(bytes));
    arrived_s = sg4::Engine::get_clock();
  });
  engine->run();
  TESSERA_CHECK(arrived_s >= 0, "the transfer never arrived");
  return arrived_s;
}

}  // namespace tessera::sim

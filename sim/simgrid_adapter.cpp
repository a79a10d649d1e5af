#include "sim/simgrid_adapter.hpp"

#include <memory>
#include <string>
#include <vector>

#include <simgrid/s4u.hpp>

#include "shared/check.hpp"

namespace sg4 = simgrid::s4u;

namespace tessera::sim {

namespace {

// A fresh engine with the network model the simulator uses everywhere: CM02 (latency plus
// size over bandwidth), no reverse-direction cross-traffic, no TCP window bound.
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

}  // namespace

double simulate_lone_transfer_s(double bandwidth_bytes_per_s, double latency_s, double bytes) {
  TESSERA_CHECK(bandwidth_bytes_per_s > 0 && latency_s >= 0 && bytes >= 0);
  auto engine = make_engine();
  auto* zone = sg4::create_full_zone("world");
  sg4::Host* a = zone->create_host("a", 1e9);
  sg4::Host* b = zone->create_host("b", 1e9);
  const sg4::Link* link = zone->create_link("link", bandwidth_bytes_per_s)->set_latency(latency_s)->seal();
  zone->add_route(a->get_netpoint(), b->get_netpoint(), nullptr, nullptr, {sg4::LinkInRoute(link)}, true);
  zone->seal();

  double arrived_s = -1;
  sg4::Actor::create("sender", a, [bytes] {
    static int payload = 0;
    sg4::Mailbox::by_name("transfer")->put(&payload, static_cast<uint64_t>(bytes));
  });
  sg4::Actor::create("receiver", b, [&arrived_s] {
    sg4::Mailbox::by_name("transfer")->get<int>();
    arrived_s = sg4::Engine::get_clock();
  });
  engine->run();
  TESSERA_CHECK(arrived_s >= 0, "the transfer never arrived");
  return arrived_s;
}

}  // namespace tessera::sim

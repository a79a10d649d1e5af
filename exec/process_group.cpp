#include "exec/process_group.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace tessera::exec {

c10::intrusive_ptr<c10d::Store> connect_store(const WorkerEnv& env, const GroupOptions& options) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.numWorkers = env.world_size;
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
}

c10::intrusive_ptr<CollectiveGroup> connect_gloo(const WorkerEnv& env,
                                                 const GroupOptions& options) {
  auto store = connect_store(env, options);

  auto gloo = c10d::ProcessGroupGloo::Options::create();
  gloo->timeout = options.timeout;
  // Loopback for a single host; a multi-node job binds the interface that reaches the master.
  gloo->devices.push_back(env.master_addr == "127.0.0.1" || env.master_addr == "localhost"
                              ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                              : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, gloo);
}

}  // namespace tessera::exec

// Rendezvous and process groups: a c10d TCPStore at the master address and a Gloo (CPU) process
// group over it. NCCL groups for CUDA devices join here with the GPU build.
#pragma once

#include <chrono>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "exec/launcher.hpp"
#include "exec/torch_compat.hpp"

namespace tessera::exec {

struct GroupOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  // rendezvous and every collective
};

// The job's TCPStore at the master address; rank 0 hosts it.
c10::intrusive_ptr<c10d::Store> connect_store(const WorkerEnv& env, const GroupOptions& options);

// Joins the job described by `env`: rank 0 hosts the TCPStore. Every collective of the
// returned group fails with an exception after `timeout` instead of hanging.
c10::intrusive_ptr<CollectiveGroup> connect_gloo(const WorkerEnv& env, const GroupOptions& options);

}  // namespace tessera::exec

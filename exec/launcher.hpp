// The process launcher of tessera-train: one worker process per rank, rendezvous on loopback
// (or a given master), and fail-fast supervision — if a worker fails or dies, the others are
// stopped and the failing rank's message is returned; the launcher never hangs.
// No torch here: workers do their torch work after the fork.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace tessera::exec {

// What a worker knows about its place in the job (torchrun's environment variables).
struct WorkerEnv {
  int rank = 0;                           // RANK
  int local_rank = 0;                     // LOCAL_RANK
  int world_size = 1;                     // WORLD_SIZE
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR
  int master_port = 0;                    // MASTER_PORT
};

// A worker started by an external launcher: torchrun's RANK, WORLD_SIZE and LOCAL_RANK, or,
// when those are not set, an srun step's SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_LOCALID
// (a step of two tasks or more); MASTER_ADDR and MASTER_PORT either way. nullopt when neither is
// there; an error message in `problem` when they are set but malformed.
std::optional<WorkerEnv> worker_env_from_environment(std::string& problem);

struct LaunchOptions {
  int nproc = 1;      // workers on this node
  int nnodes = 1;     // nodes in the job
  int node_rank = 0;  // this node's index: its workers are ranks node_rank*nproc ...
  std::string master_addr = "127.0.0.1";
  int master_port = 0;      // 0: pick a free port (single node only)
  double timeout_s = 600;   // whole job; the launcher kills everything past it
  double stop_grace_s = 5;  // SIGTERM, then SIGKILL after this long
};

struct LaunchResult {
  bool ok = false;
  int failed_rank = -1;  // the first rank that failed
  std::string message;   // "rank 1: <its error>" or "timed out after ..."
};

// Runs `worker` in one child process per local rank; a worker's return value is its exit
// status, and an exception becomes a failure carrying its message.
LaunchResult launch(const LaunchOptions& options,
                    const std::function<int(const WorkerEnv&)>& worker);

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

}  // namespace tessera::exec

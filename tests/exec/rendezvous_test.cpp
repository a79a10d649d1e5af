// Executor smoke tests: processes form a Gloo group over a TCPStore on loopback and all-reduce;
// a failing worker makes the launcher stop the others and report it — no hang.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <sys/wait.h>
#include "exec/torch_api.hpp"

#include "exec/launcher.hpp"
#include "exec/process_group.hpp"
#include "tests/exec/run_train.hpp"

using namespace tessera::exec;

TEST_CASE("two processes form a Gloo group over a TCPStore on loopback and all-reduce a tensor") {
  LaunchOptions options;
  options.nproc = 2;
  options.timeout_s = 120;
  const LaunchResult result = launch(options, [](const WorkerEnv& env) {
    auto group = connect_gloo(env, GroupOptions{});
    std::vector<at::Tensor> t{torch::arange(4, torch::kFloat32) * (env.rank + 1)};
    group->allreduce(t)->wait();
    // ranks contribute x and 2x: the sum is 3x
    if (!torch::equal(t[0], torch::arange(4, torch::kFloat32) * 3))
      throw std::runtime_error("wrong sum");
    return 0;
  });
  INFO(result.message);
  CHECK(result.ok);
}

TEST_CASE("a failing worker stops the job quickly and is named") {
  LaunchOptions options;
  options.nproc = 3;
  options.timeout_s = 120;
  const auto start = std::chrono::steady_clock::now();
  const LaunchResult result = launch(options, [](const WorkerEnv& env) {
    if (env.rank == 1) throw std::runtime_error("out of memory on purpose");
    // The others block in the rendezvous waiting for rank 1, until the launcher stops them.
    GroupOptions slow;
    slow.timeout = std::chrono::seconds(100);
    auto group = connect_gloo(env, slow);
    std::vector<at::Tensor> t{torch::ones({2})};
    group->allreduce(t)->wait();
    return 0;
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_FALSE(result.ok);
  CHECK(result.failed_rank == 1);
  CHECK(result.message == "rank 1: out of memory on purpose");
  CHECK(seconds < 30);
}

TEST_CASE("a worker killed by a signal is reported with the signal") {
  LaunchOptions options;
  options.nproc = 2;
  const LaunchResult result = launch(options, [](const WorkerEnv& env) {
    if (env.rank == 0) std::abort();
    ::sleep(60);
    return 0;
  });
  CHECK_FALSE(result.ok);
  CHECK(result.message.find("rank 0: killed by signal 6") == 0);
}

TEST_CASE("tessera-train comm-check: launcher, torchrun-style workers and two nodes on loopback") {
  const Run ok = run("comm-check --nproc 2 --bytes 65536 --iters 3");
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK(ok.output.find("over 2 ranks (gloo)") != std::string::npos);

  const Run failed = run("comm-check --nproc 2 --fail-rank 1 --timeout 20");
  CHECK(failed.code == 1);
  CHECK(failed.output.find("rank 1: injected failure") != std::string::npos);

  // Two "nodes" of two workers each, as torchrun's --nnodes/--node-rank would start them.
  const int port = free_port();
  const std::string common =
      "comm-check --nproc 2 --nnodes 2 --bytes 4096 --iters 2 --master 127.0.0.1:" +
      std::to_string(port);
  FILE* node1 = start(common + " --node-rank 1");
  const Run node0 = run(common + " --node-rank 0");
  const Run second = finish(node1);
  INFO(node0.output << second.output);
  CHECK(node0.code == 0);
  CHECK(second.code == 0);
  CHECK(node0.output.find("over 4 ranks") != std::string::npos);

  // A worker started by an external launcher reads RANK/WORLD_SIZE/MASTER_*.
  const Run bad_env = run("comm-check");  // no env: launches itself, fine
  CHECK(bad_env.code == 0);
  const Run broken = run("comm-check --bytes 2");
  CHECK(broken.code == 2);
}

TEST_CASE("torchrun environment variables") {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("MASTER_ADDR", "10.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  std::string problem;
  auto env = worker_env_from_environment(problem);
  REQUIRE(env.has_value());
  CHECK(problem.empty());
  CHECK(env->rank == 3);
  CHECK(env->local_rank == 1);
  CHECK(env->master_addr == "10.0.0.1");
  CHECK(env->master_port == 29500);
  ::setenv("RANK", "4", 1);
  worker_env_from_environment(problem);
  CHECK(problem == "RANK must be < WORLD_SIZE");
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})
    ::unsetenv(v);
  CHECK_FALSE(worker_env_from_environment(problem).has_value());
}

TEST_CASE("Slurm step environment variables, when torchrun's are not set") {
  // A batch script: the job's task count, but no step: not a worker.
  ::setenv("SLURM_PROCID", "0", 1);
  ::setenv("SLURM_NTASKS", "4", 1);
  std::string problem;
  CHECK_FALSE(worker_env_from_environment(problem).has_value());
  // A step of one task launches its own workers.
  ::setenv("SLURM_STEP_NUM_TASKS", "1", 1);
  CHECK_FALSE(worker_env_from_environment(problem).has_value());
  // A task of a 4-task step.
  ::setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  ::setenv("SLURM_PROCID", "2", 1);
  ::setenv("SLURM_LOCALID", "0", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  auto env = worker_env_from_environment(problem);
  REQUIRE(env.has_value());
  CHECK(problem.empty());
  CHECK(env->rank == 2);
  CHECK(env->world_size == 4);
  CHECK(env->local_rank == 0);
  ::setenv("SLURM_PROCID", "5", 1);
  worker_env_from_environment(problem);
  CHECK(problem == "SLURM_PROCID must be < SLURM_STEP_NUM_TASKS");
  // torchrun's variables win.
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  problem.clear();
  env = worker_env_from_environment(problem);
  REQUIRE(env.has_value());
  CHECK(problem.empty());
  CHECK(env->rank == 1);
  CHECK(env->world_size == 2);
  for (const char* v : {"RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                        "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "MASTER_PORT"})
    ::unsetenv(v);
}

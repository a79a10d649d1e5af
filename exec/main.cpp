// tessera-train: runs plans for real with LibTorch. Today: `comm-check`, which launches one
// worker per rank, forms the process group and verifies and times an all-reduce.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <cxxopts.hpp>

#include "exec/comm_check.hpp"
#include "exec/launcher.hpp"
#include "exec/process_group.hpp"

namespace {

using namespace tessera::exec;

int comm_check(int argc, char** argv) {
  cxxopts::Options options(
      "tessera-train comm-check",
      "Starts one worker per rank (or joins as one, when RANK/WORLD_SIZE/MASTER_ADDR/"
      "MASTER_PORT are set by an external launcher), forms a Gloo process group "
      "over a TCPStore and verifies and times an all-reduce.");
  options.add_options()("nproc", "workers on this node", cxxopts::value<int>()->default_value("2"))(
      "nnodes", "nodes in the job", cxxopts::value<int>()->default_value("1"))(
      "node-rank", "this node's index", cxxopts::value<int>()->default_value("0"))(
      "master", "ADDR:PORT of rank 0 (default: a free port on loopback)",
      cxxopts::value<std::string>())("bytes", "all-reduce size in bytes",
                                     cxxopts::value<int64_t>()->default_value("4194304"))(
      "iters", "timed all-reduces", cxxopts::value<int>()->default_value("10"))(
      "timeout", "seconds before a collective (and the job) gives up",
      cxxopts::value<double>()->default_value("60"))(
      "fail-rank", "make this rank fail (tests the launcher)",
      cxxopts::value<int>()->default_value("-1"))("h,help", "show this help");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << options.program() << ": " << e.what() << "\n";
    return 2;
  }
  if (args.count("help")) {
    std::cout << options.help() << "\n";
    return 0;
  }
  const int64_t bytes = args["bytes"].as<int64_t>();
  const int iters = args["iters"].as<int>();
  const double timeout_s = args["timeout"].as<double>();
  const int fail_rank = args["fail-rank"].as<int>();
  if (bytes < 4 || iters < 1 || timeout_s <= 0) {
    std::cerr << options.program() << ": --bytes >= 4, --iters >= 1 and --timeout > 0 required\n";
    return 2;
  }
  GroupOptions group_options;
  group_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));

  auto worker = [&](const WorkerEnv& env) {
    if (env.rank == fail_rank) throw std::runtime_error("injected failure (--fail-rank)");
    auto group = connect_gloo(env, group_options);
    const CommCheckResult r = run_comm_check(*group, bytes, iters);
    if (!r.correct) throw std::runtime_error(r.problem);
    if (env.rank == 0)
      std::printf(
          "all-reduce of %lld bytes over %d ranks (gloo): %.3f ms, algbw %.3f GB/s, busbw %.3f "
          "GB/s\n",
          static_cast<long long>(bytes), env.world_size, r.seconds * 1e3,
          r.algorithm_bandwidth_bytes_per_s / 1e9, r.bus_bandwidth_bytes_per_s / 1e9);
    std::fflush(stdout);
    return 0;
  };

  std::string problem;
  if (const auto env = worker_env_from_environment(problem); env || !problem.empty()) {
    if (!problem.empty()) {
      std::cerr << options.program() << ": " << problem << "\n";
      return 2;
    }
    try {
      return worker(*env);
    } catch (const std::exception& e) {
      std::cerr << "rank " << env->rank << ": " << e.what() << "\n";
      return 1;
    }
  }
  LaunchOptions launch_options;
  launch_options.nproc = args["nproc"].as<int>();
  launch_options.nnodes = args["nnodes"].as<int>();
  launch_options.node_rank = args["node-rank"].as<int>();
  launch_options.timeout_s = timeout_s + 30;
  if (args.count("master")) {
    const std::string master = args["master"].as<std::string>();
    const auto colon = master.rfind(':');
    try {
      if (colon == std::string::npos) throw std::invalid_argument("no port");
      launch_options.master_addr = master.substr(0, colon);
      launch_options.master_port = std::stoi(master.substr(colon + 1));
    } catch (const std::exception&) {
      std::cerr << options.program() << ": --master must be ADDR:PORT, got '" << master << "'\n";
      return 2;
    }
  }
  const LaunchResult result = launch(launch_options, worker);
  if (!result.ok) {
    std::cerr << "tessera-train: " << result.message << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  if (command == "comm-check") return comm_check(argc - 1, argv + 1);
  std::ostream& out = command == "-h" || command == "--help" ? std::cout : std::cerr;
  out << "usage: tessera-train <command> [options]\n\ncommands:\n"
         "  comm-check  form the process group and verify and time an all-reduce\n";
  return command == "-h" || command == "--help" ? 0 : 2;
}

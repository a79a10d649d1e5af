// tessera-train: runs plans for real with LibTorch. `tessera-train <scenario> --plan ...` trains;
// `comm-check` forms the process group and verifies and times an all-reduce.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <torch/version.h>
#include <cxxopts.hpp>

#include "exec/comm_check.hpp"
#include "exec/cuda.hpp"
#include "exec/device.hpp"
#include "exec/kernel_profile.hpp"
#include "exec/launcher.hpp"
#include "exec/matmul_rate.hpp"
#include "exec/plain_loop.hpp"
#include "exec/process_group.hpp"
#include "exec/train.hpp"
#include "shared/layout/plan_source.hpp"
#include "shared/layout/scenario_set.hpp"

namespace {

using namespace tessera::exec;

// Splits --master ADDR:PORT; false when malformed.
bool parse_master(const std::string& master, LaunchOptions& launch_options) {
  const auto colon = master.rfind(':');
  try {
    if (colon == std::string::npos) return false;
    launch_options.master_addr = master.substr(0, colon);
    launch_options.master_port = std::stoi(master.substr(colon + 1));
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// A worker started by an external launcher (RANK and WORLD_SIZE set, as torchrun and Slurm
// do) runs here and returns its exit code; nullopt: no such environment, launch the workers.
// `world` >= 0 is the world size the job needs.
std::optional<int> run_external_worker(const std::function<int(const WorkerEnv&)>& worker,
                                       int64_t world, const std::string& program) {
  std::string problem;
  const auto env = worker_env_from_environment(problem);
  if (!env && problem.empty()) return std::nullopt;
  if (problem.empty() && world >= 0 && env->world_size != world)
    problem = "WORLD_SIZE " + std::to_string(env->world_size) + " but the plan has " +
              std::to_string(world) + " ranks";
  if (!problem.empty()) {
    std::cerr << program << ": " << problem << "\n";
    return 2;
  }
  try {
    return worker(*env);
  } catch (const std::exception& e) {
    std::cerr << "rank " << env->rank << ": " << e.what() << "\n";
    return 1;
  }
}

// Starts this node's workers and waits for them; the failing rank's message on failure.
int launch_and_report(const LaunchOptions& options,
                      const std::function<int(const WorkerEnv&)>& worker) {
  const LaunchResult result = launch(options, worker);
  if (result.ok) return 0;
  std::cerr << "tessera-train: " << result.message << "\n";
  return 1;
}

// Parses a subcommand's arguments; the exit code where the command stops there (2: bad
// arguments, said on stderr; 0: --help, printed).
std::optional<int> parse_arguments(cxxopts::Options& options, int argc, char** argv,
                                   cxxopts::ParseResult& args) {
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
  return std::nullopt;
}

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
  if (const auto code = parse_arguments(options, argc, argv, args)) return *code;
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

  if (const auto code = run_external_worker(worker, -1, options.program())) return *code;
  LaunchOptions launch_options;
  launch_options.nproc = args["nproc"].as<int>();
  launch_options.nnodes = args["nnodes"].as<int>();
  launch_options.node_rank = args["node-rank"].as<int>();
  launch_options.timeout_s = timeout_s + 30;
  if (args.count("master") && !parse_master(args["master"].as<std::string>(), launch_options)) {
    std::cerr << options.program() << ": --master must be ADDR:PORT, got '"
              << args["master"].as<std::string>() << "'\n";
    return 2;
  }
  return launch_and_report(launch_options, worker);
}

int train(int argc, char** argv) {
  cxxopts::Options options(
      "tessera-train",
      "Trains a scenario's model with a plan for real: one worker process per rank, on CPUs "
      "(Gloo) or GPUs (NCCL). Each worker lowers the plan's Program and executes its own ops; "
      "rank 0 prints step, loss, step time and tokens/s.");
  options.add_options()("plan", "plan replacing the scenario's: plan.json or results.jsonl#R",
                        cxxopts::value<std::string>())(
      "set",
      "change a scenario field first, after --plan: json.path=value (repeatable; e.g. "
      "plan.sequence_parallel=false)",
      cxxopts::value<std::vector<std::string>>())(
      "nproc", "workers on this node (default: the plan's ranks / --nnodes)",
      cxxopts::value<int>())("nnodes", "nodes in the job",
                             cxxopts::value<int>()->default_value("1"))(
      "node-rank", "this node's index", cxxopts::value<int>()->default_value("0"))(
      "master", "ADDR:PORT of rank 0 (default: a free port on loopback)",
      cxxopts::value<std::string>())(
      "device",
      "cpu, or cuda: each rank on a GPU (local rank mod the GPUs; builds against a "
      "CUDA torch only)",
      cxxopts::value<std::string>()->default_value("cpu"))(
      "transport", "gloo, nccl, or auto: NCCL when every rank of a node has a GPU of its own",
      cxxopts::value<std::string>()->default_value("auto"))(
      "steps", "training steps", cxxopts::value<int64_t>()->default_value("10"))(
      "dataset", "synthetic (the workload's draws) or shapes (learnable captions)",
      cxxopts::value<std::string>()->default_value("synthetic"))(
      "out", "record loss.jsonl, run.json, trace/ and checkpoint/ here",
      cxxopts::value<std::string>())("resume", "continue from the checkpoint in --out")(
      "checkpoint-every", "also checkpoint every N steps",
      cxxopts::value<int64_t>()->default_value("0"))(
      "no-checkpoint", "record no checkpoint (traces and losses only)")(
      "trace-steps", "steps recorded in the traces",
      cxxopts::value<int64_t>()->default_value("20"))(
      "profile-step",
      "record step N's operators and GPU kernels with torch's profiler into "
      "<out>/profile/rank<R>.json (torch 2 builds)",
      cxxopts::value<int64_t>()->default_value("-1"))(
      "seed", "weight seed", cxxopts::value<uint64_t>()->default_value("1234"))(
      "lr", "AdamW learning rate", cxxopts::value<double>()->default_value("0.001"))(
      "weight-decay", "AdamW weight decay", cxxopts::value<double>()->default_value("0"))(
      "clip", "global gradient-norm clip (0: off)", cxxopts::value<double>()->default_value("1"))(
      "no-working-copies",
      "bf16: cast each weight at every use instead of once per step (to measure the copies)")(
      "timeout", "seconds before a collective (and rendezvous) gives up",
      cxxopts::value<double>()->default_value("120"))(
      "input", "scenario", cxxopts::value<std::string>())("h,help", "show this help");
  options.parse_positional({"input"});
  options.positional_help("<scenario.json>");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "tessera-train: " << e.what() << "\n";
    return 2;
  }
  if (args.count("help")) {
    std::cout << options.help() << "\n";
    return 0;
  }
  if (!args.count("input")) {
    std::cerr << "tessera-train: missing scenario\ntry 'tessera-train --help'\n";
    return 2;
  }
  TrainJob job;
  job.scenario_file = args["input"].as<std::string>();
  tessera::Diagnostics diag;
  const std::optional<tessera::Json> point = tessera::parse_set_point(
      args.count("set") ? args["set"].as<std::vector<std::string>>() : std::vector<std::string>{},
      diag);
  std::optional<tessera::Scenario> scenario;
  if (point)
    scenario = tessera::load_scenario_at(
        job.scenario_file, args.count("plan") ? args["plan"].as<std::string>() : "", *point, diag);
  if (!scenario) {
    std::cerr << diag.format();
    return 2;
  }
  if (const std::string problem = executor_support(scenario->model); !problem.empty()) {
    std::cerr << job.scenario_file << ": model: " << problem << "\n";
    return 2;
  }
  if (const std::string problem = executor_plan_support(*scenario->plan, scenario->model);
      !problem.empty()) {
    std::cerr << (scenario->plan_ref.empty() ? job.scenario_file : scenario->plan_ref) << ": "
              << problem << "\n";
    return 2;
  }
  job.scenario = std::move(*scenario);
  std::string problem;
  const torch::Device device = parse_device(args["device"].as<std::string>(), problem);
  job.transport = args["transport"].as<std::string>();
  if (problem.empty() && job.transport != "auto" && job.transport != "gloo" &&
      job.transport != "nccl")
    problem = "--transport " + job.transport + ": expected gloo, nccl or auto";
  if (problem.empty() && device.is_cuda() && !cuda_built())
    problem =
        "--device cuda: this build of tessera-train has no CUDA (it was built against a "
        "CPU-only torch; scripts/setup.sh --torch2 installs a CUDA one)";
  if (problem.empty() && !device.is_cuda() && job.transport == "nccl")
    problem = "--transport nccl needs --device cuda";
  if (!problem.empty()) {
    std::cerr << "tessera-train: " << problem << "\n";
    return 2;
  }
  job.device = device.type();
  // The model's dtype says the precision: bf16 trains with fp32 master weights (device.hpp).
  job.precision =
      job.scenario.model.dtype == tessera::DType::kBf16 ? Precision::kBf16 : Precision::kFp32;
  const std::string dataset = args["dataset"].as<std::string>();
  if (dataset != "synthetic" && dataset != "shapes") {
    std::cerr << "tessera-train: --dataset must be synthetic or shapes, got '" << dataset << "'\n";
    return 2;
  }
  job.options.dataset = dataset == "shapes" ? DatasetKind::kShapes : DatasetKind::kSynthetic;
  job.options.seed = args["seed"].as<uint64_t>();
  job.options.lr = args["lr"].as<double>();
  job.options.weight_decay = args["weight-decay"].as<double>();
  job.options.clip = args["clip"].as<double>();
  job.options.working_copies = args.count("no-working-copies") == 0;
  job.steps = args["steps"].as<int64_t>();
  job.checkpoint_every = args["checkpoint-every"].as<int64_t>();
  job.trace_steps = args["trace-steps"].as<int64_t>();
  job.profile_step = args["profile-step"].as<int64_t>();
  if (job.profile_step >= 0 && (!args.count("out") || !kernel_profile_built())) {
    std::cerr << "tessera-train: --profile-step needs --out and a torch 2 build (this one has "
              << TORCH_VERSION << ")\n";
    return 2;
  }
  job.timeout_s = args["timeout"].as<double>();
  job.resume = args.count("resume") > 0;
  job.checkpoint = args.count("no-checkpoint") == 0;
  if (args.count("out")) job.out_dir = args["out"].as<std::string>();
  if (job.steps < 1 || job.options.lr <= 0 || job.options.clip < 0 || job.timeout_s <= 0) {
    std::cerr << "tessera-train: --steps >= 1, --lr > 0, --clip >= 0 and --timeout > 0 required\n";
    return 2;
  }
  if (job.resume && job.out_dir.empty()) {
    std::cerr << "tessera-train: --resume needs --out (where the checkpoint is)\n";
    return 2;
  }
  const int64_t world = tessera::world_size(*job.scenario.plan, job.scenario.model);
  // Under an external launcher, its count of ranks per node (torchrun's LOCAL_WORLD_SIZE,
  // Slurm's tasks per node); the built-in launcher's --nproc below.
  for (const char* name : {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"})
    if (const char* value = std::getenv(name); value != nullptr && std::atoi(value) > 0) {
      job.local_ranks = std::atoi(value);
      break;
    }
  auto worker = [&](const WorkerEnv& env) { return train_worker(env, job); };
  if (const auto code = run_external_worker(worker, world, "tessera-train")) return *code;
  LaunchOptions launch_options;
  launch_options.nnodes = args["nnodes"].as<int>();
  launch_options.node_rank = args["node-rank"].as<int>();
  launch_options.nproc = args.count("nproc")
                             ? args["nproc"].as<int>()
                             : static_cast<int>(world / std::max(1, launch_options.nnodes));
  if (static_cast<int64_t>(launch_options.nproc) * launch_options.nnodes != world) {
    std::cerr << "tessera-train: the plan has " << world << " ranks; --nproc "
              << launch_options.nproc << " x --nnodes " << launch_options.nnodes << " must match\n";
    return 2;
  }
  job.local_ranks = launch_options.nproc;
  launch_options.timeout_s = 24 * 3600;
  if (args.count("master") && !parse_master(args["master"].as<std::string>(), launch_options)) {
    std::cerr << "tessera-train: --master must be ADDR:PORT, got '"
              << args["master"].as<std::string>() << "'\n";
    return 2;
  }
  const int code = launch_and_report(launch_options, worker);
  if (code == 0 && !job.out_dir.empty() && launch_options.node_rank == 0)
    std::cout << "recorded: " << job.out_dir << "/{loss.jsonl,run.json"
              << (job.trace_steps > 0 ? ",trace/" : "") << (job.checkpoint ? ",checkpoint/" : "")
              << "}\n";
  return code;
}

// tessera-train matmul-rate: the device's measured dense matrix-product rate, as JSON.
int matmul_rate(int argc, char** argv) {
  cxxopts::Options options("tessera-train matmul-rate",
                           "Measures the dense n x n x n matrix-product rate of a device on random "
                           "operands (the ceiling MFU is read against beside the datasheet's) and "
                           "prints it as one line of JSON.");
  options.add_options()("device", "cpu, cuda or cuda:N",
                        cxxopts::value<std::string>()->default_value("cpu"))(
      "dtype", "bf16 or fp32", cxxopts::value<std::string>()->default_value("bf16"))(
      "size", "matrix side n", cxxopts::value<int64_t>()->default_value("8192"))(
      "rounds", "timed rounds (the median is reported)", cxxopts::value<int>()->default_value("5"))(
      "per-round", "products per round", cxxopts::value<int>()->default_value("10"))(
      "h,help", "show this help");
  cxxopts::ParseResult args;
  if (const auto code = parse_arguments(options, argc, argv, args)) return *code;
  std::string problem;
  const torch::Device device = parse_device(args["device"].as<std::string>(), problem);
  const std::string dtype = args["dtype"].as<std::string>();
  if (problem.empty() && dtype != "bf16" && dtype != "fp32")
    problem = "--dtype " + dtype + ": expected bf16 or fp32";
  if (problem.empty() && device.is_cuda() && !cuda_built())
    problem = "--device cuda: this build of tessera-train has no CUDA";
  const int64_t n = args["size"].as<int64_t>();
  const int rounds = args["rounds"].as<int>(), per_round = args["per-round"].as<int>();
  if (problem.empty() && (n < 1 || rounds < 1 || per_round < 1))
    problem = "--size, --rounds and --per-round must be at least 1";
  if (!problem.empty()) {
    std::cerr << options.program() << ": " << problem << "\n";
    return 2;
  }
  if (device.is_cuda()) use_cuda_device(device.index());
  set_device_setting({device, Precision::kFp32});
  const MatmulRate r = measure_matmul_rate(dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32, n,
                                           rounds, per_round);
  std::printf(
      "{\"device\": \"%s\", \"dtype\": \"%s\", \"n\": %lld, \"rounds\": %d, \"per_round\": %d, "
      "\"flops_per_s\": %.6g, \"min_flops_per_s\": %.6g, \"max_flops_per_s\": %.6g}\n",
      device.str().c_str(), dtype.c_str(), static_cast<long long>(n), rounds, per_round,
      r.flops_per_s, r.min_flops_per_s, r.max_flops_per_s);
  return 0;
}

// tessera-train plain-loop: the overhead yardstick (plain_loop.hpp).
int plain_loop(int argc, char** argv) {
  cxxopts::Options options("tessera-train plain-loop",
                           "Trains a single-rank plan with a plain LibTorch loop (no Program): "
                           "the yardstick scripts/bench.sh exec compares tessera-train with.");
  options.add_options()("plan", "plan replacing the scenario's", cxxopts::value<std::string>())(
      "steps", "steps", cxxopts::value<int64_t>()->default_value("10"))(
      "input", "scenario", cxxopts::value<std::string>())("h,help", "show this help");
  options.parse_positional({"input"});
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    std::cerr << "tessera-train plain-loop: " << e.what() << "\n";
    return 2;
  }
  if (args.count("help") || !args.count("input")) {
    (args.count("help") ? std::cout : std::cerr) << options.help() << "\n";
    return args.count("help") ? 0 : 2;
  }
  tessera::Diagnostics diag;
  const std::string file = args["input"].as<std::string>();
  auto s = tessera::load_scenario_with_plan(
      file, args.count("plan") ? args["plan"].as<std::string>() : "", diag);
  if (!s) {
    std::cerr << diag.format();
    return 2;
  }
  if (const std::string problem = executor_support(s->model); !problem.empty()) {
    std::cerr << file << ": model: " << problem << "\n";
    return 2;
  }
  if (tessera::world_size(*s->plan, s->model) != 1) {
    std::cerr << "tessera-train plain-loop: the plan must have one rank\n";
    return 2;
  }
  torch::set_num_threads(1);
  const auto steps = run_plain_loop(*s, TrainOptions{}, args["steps"].as<int64_t>());
  for (std::size_t i = 0; i < steps.size(); ++i)
    std::printf("step %zu/%zu  loss %.9f  %.4f s\n", i + 1, steps.size(), steps[i].loss,
                steps[i].seconds);
  return 0;
}

// The subcommands by name; any other first argument is a scenario to train.
struct Subcommand {
  const char* name;
  const char* usage;  // its synopsis, for the usage text
  int (*run)(int argc, char** argv);
};

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> table = {
      {"comm-check", "comm-check [--nproc N] [--bytes B]   (collectives between ranks)",
       comm_check},
      {"plain-loop", "plain-loop <scenario.json> [--steps S]   (overhead yardstick)", plain_loop},
      {"matmul-rate", "matmul-rate [--device D] [--dtype T] [--size N]   (MFU's ceiling)",
       matmul_rate},
  };
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  tessera::set_warning_reporter(tessera::print_warnings_once(std::cerr));
  for (const Subcommand& c : subcommands())
    if (command == c.name) return c.run(argc - 1, argv + 1);
  if (command.empty() || command == "-h" || command == "--help") {
    std::ostream& out = command.empty() ? std::cerr : std::cout;
    out << "usage: tessera-train <scenario.json> [--plan P] [--nproc N] [--steps S] [--out DIR] "
           "[--resume] [--dataset synthetic|shapes] ...\n";
    for (const Subcommand& c : subcommands()) out << "       tessera-train " << c.usage << "\n";
    out << "\n'tessera-train <scenario.json> --help' lists the training options.\n";
    return command.empty() ? 2 : 0;
  }
  return train(argc, argv);
}

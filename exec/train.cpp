#include "exec/train.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <sys/resource.h>

#include <torch/version.h>

#include "exec/cuda.hpp"
#include "exec/kernel_profile.hpp"
#include "exec/process_group.hpp"
#include "shared/base/check.hpp"
#include "shared/base/failpoint.hpp"
#include "shared/records/trace_writer.hpp"
#include "shared/search/stage_split.hpp"

namespace tessera::exec {

namespace fs = std::filesystem;

namespace {

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Writes `text` to `path` through a temporary file and a rename: readers see the old file or
// the new one, never half of one.
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    TESSERA_CHECK(out.good(), "cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  return "unknown";
}

// Every rank's op times (and the collectives inside its ops) of one step, on rank 0, shifted by
// each rank's step start relative to the earliest rank's.
Timeline gather_timeline(const Comm& world, const StepResult& r) {
  const Program& p = r.program;
  std::size_t most = 0;
  for (const auto& ops : p.ranks) most = std::max(most, ops.size());
  torch::Tensor mine = torch::zeros({static_cast<int64_t>(2 + 2 * most)}, torch::kFloat64);
  auto a = mine.accessor<double, 1>();
  a[0] = r.started_s;
  a[1] = static_cast<double>(r.nested.size());
  for (std::size_t i = 0; i < r.times.size(); ++i) {
    a[static_cast<int64_t>(2 + 2 * i)] = r.times[i].start_s;
    a[static_cast<int64_t>(3 + 2 * i)] = r.times[i].finish_s;
  }
  const std::vector<int64_t> ones(static_cast<std::size_t>(world.size()), 1);
  const torch::Tensor all =
      all_gather_rows(world, mine.unsqueeze(0), ones).view({world.size(), -1});
  // The nested slices: five numbers each, as many rows as each rank has.
  torch::Tensor nested = torch::zeros({static_cast<int64_t>(r.nested.size()), 5}, torch::kFloat64);
  for (std::size_t k = 0; k < r.nested.size(); ++k) {
    const NestedSlice& n = r.nested[k];
    nested[static_cast<int64_t>(k)] = torch::tensor(
        {static_cast<double>(n.op), static_cast<double>(n.kind), n.start_s, n.finish_s, n.bytes},
        torch::kFloat64);
  }
  std::vector<int64_t> counts;
  for (int64_t rank = 0; rank < world.size(); ++rank)
    counts.push_back(static_cast<int64_t>(all[rank][1].item<double>()));
  const bool any = *std::max_element(counts.begin(), counts.end()) > 0;
  const torch::Tensor slices = any ? all_gather_rows(world, nested, counts) : nested;
  const double earliest = all.select(1, 0).min().item<double>();
  Timeline t;
  t.ops.resize(p.ranks.size());
  t.nested.resize(p.ranks.size());
  int64_t row = 0;
  for (std::size_t rank = 0; rank < p.ranks.size(); ++rank) {
    const auto line = all[static_cast<int64_t>(rank)];
    const double shift = line[0].item<double>() - earliest;
    for (std::size_t i = 0; i < p.ranks[rank].size(); ++i) {
      t.ops[rank].push_back({line[static_cast<int64_t>(2 + 2 * i)].item<double>() + shift,
                             line[static_cast<int64_t>(3 + 2 * i)].item<double>() + shift});
      t.step_s = std::max(t.step_s, t.ops[rank].back().finish_s);
    }
    for (int64_t k = 0; k < counts[rank]; ++k, ++row) {
      const auto s = slices[row];
      t.nested[rank].push_back({static_cast<int32_t>(s[0].item<double>()),
                                static_cast<CollectiveKind>(static_cast<int>(s[1].item<double>())),
                                s[2].item<double>() + shift, s[3].item<double>() + shift,
                                s[4].item<double>()});
    }
  }
  return t;
}

void barrier(const Comm& world) {
  torch::Tensor t = torch::zeros({1});
  all_reduce(world, t);
}

struct Checkpoint {
  int64_t step = 0;
  fs::path dir;
};

std::optional<Checkpoint> read_manifest(const fs::path& out_dir) {
  const fs::path manifest = out_dir / "checkpoint" / "manifest.json";
  if (!fs::exists(manifest)) return std::nullopt;
  std::ifstream in(manifest);
  const Json j = Json::parse(in);
  return Checkpoint{j.at("step").get<int64_t>(),
                    out_dir / "checkpoint" / j.at("dir").get<std::string>()};
}

void save_checkpoint(Worker& worker, const Comm& world, const fs::path& out_dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%06lld", static_cast<long long>(step));
  const fs::path dir = out_dir / "checkpoint" / name;
  fs::create_directories(dir);
  const fs::path file = dir / ("rank" + std::to_string(world.rank) + ".pt");
  worker.save(file.string() + ".tmp");
  // Reliability tests (docs/RELIABILITY.md) kill a worker at the two moments a checkpoint is
  // incomplete on disk: its shard written but not in place, and every shard in place but the
  // manifest not yet pointing at them.
  if (failpoint("checkpoint-shard-rank" + std::to_string(world.rank), step)) ::raise(SIGKILL);
  fs::rename(file.string() + ".tmp", file);
  barrier(world);  // every shard is in place before the manifest points at them
  if (world.rank == 0) {
    if (failpoint("checkpoint-manifest", step)) ::raise(SIGKILL);
    const auto previous = read_manifest(out_dir);
    write_atomically(out_dir / "checkpoint" / "manifest.json",
                     Json{{"step", step}, {"dir", name}, {"world", world.size()}}.dump(1) + "\n");
    if (previous && previous->dir != dir) fs::remove_all(previous->dir);
  }
  barrier(world);
}

}  // namespace

int train_worker(const WorkerEnv& env, const TrainJob& job) {
  torch::set_num_threads(1);  // ranks share the machine's cores
  // This rank's device, before any tensor: a GPU of the node's, shared when there are fewer
  // GPUs than ranks.
  DeviceSetting device;
  device.precision = job.precision;
  device.grad_reduce_in_fp32 = job.scenario.plan->grad_reduce_in_fp32;
  std::string transport = job.transport;
  if (job.device == torch::kCUDA) {
    TESSERA_CHECK(cuda_built(),
                  "--device cuda: this build of tessera-train has no CUDA (build "
                  "against a CUDA torch: scripts/setup.sh --torch2)");
    const int gpus = cuda_devices();
    TESSERA_CHECK(gpus > 0, "--device cuda: no GPU is visible to rank " + std::to_string(env.rank));
    const int index = env.local_rank % gpus;
    use_cuda_device(index);
    device.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
    if (transport == "auto") transport = gpus >= job.local_ranks ? "nccl" : "gloo";
  } else {
    TESSERA_CHECK(transport != "nccl", "--transport nccl needs --device cuda");
    transport = "gloo";
  }
  set_device_setting(device);
  GroupOptions group_options;
  group_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(job.timeout_s * 1000));
  auto store = connect_store(env, group_options);
  // What rank 0 was told to record (and whether to resume) holds for every rank: the recording
  // steps are collectives all ranks join, whatever their own node's command line said.
  std::string out_dir = job.out_dir, resume = job.resume ? "1" : "0",
              checkpointing = job.checkpoint ? "1" : "0";
  for (auto& [key, value] : {std::pair<const char*, std::string*>{"tessera/out", &out_dir},
                             {"tessera/resume", &resume},
                             {"tessera/checkpoint", &checkpointing},
                             {"tessera/transport", &transport}}) {
    if (env.rank == 0) {
      store->set(key, std::vector<uint8_t>(value->begin(), value->end()));
    } else {
      const std::vector<uint8_t> bytes = store->get(key);
      value->assign(bytes.begin(), bytes.end());
    }
  }
  Groups groups(store, env.rank, env.world_size, group_options.timeout,
                env.master_addr == "127.0.0.1" || env.master_addr == "localhost",
                transport == "nccl" ? Transport::kNccl : Transport::kGloo);
  const Scenario& s = job.scenario;
  // Frozen-aware stage boundaries, resolved once: the Worker lowers and run.json records this plan,
  // so a replay runs the very same split.
  const ParallelPlan plan = resolve_stage_split(*s.plan, s.model, s.workload, s.cluster);
  Worker worker(s, plan, groups, job.options);
  // Metrics, timelines and checkpoint barriers go over the host group (Gloo, CPU tensors).
  const Comm& world = groups.host();
  const bool lead = env.rank == 0;
  const fs::path out = out_dir;
  int64_t first = 0;
  if (resume == "1") {
    const auto checkpoint = read_manifest(out);
    TESSERA_CHECK(checkpoint.has_value(),
                  "--resume: no checkpoint in " + (out / "checkpoint").string());
    worker.load((checkpoint->dir / ("rank" + std::to_string(env.rank) + ".pt")).string());
    first = checkpoint->step;
  }
  std::ofstream losses;
  if (lead && !out.empty()) {
    fs::create_directories(out);
    // Keep the losses of the steps before the resumed one, drop any recorded after it.
    std::vector<std::string> kept;
    if (resume == "1") {
      std::ifstream in(out / "loss.jsonl");
      std::string line;
      while (std::getline(in, line)) {
        try {
          if (Json::parse(line).at("step").get<int64_t>() < first) kept.push_back(line);
        } catch (const std::exception&) {
        }
      }
    }
    losses.open(out / "loss.jsonl", std::ios::trunc);
    for (const std::string& line : kept) losses << line << "\n";
    losses.flush();
  }
  Json iterations = Json::array();
  std::vector<StepResult> traced;
  std::vector<Timeline> timelines;
  std::vector<double> offsets;
  const double job_start = monotonic_s();
  // schedule dip: steps, late searches, searches used and their wall time
  int64_t dip_steps = 0, dip_late = 0, dip_searches = 0;
  double dip_search_s = 0, dip_search_max_s = 0;
  for (int64_t step = first; step < job.steps; ++step) {
    const double started = monotonic_s();
    const bool profile = step == job.profile_step && !out.empty();
    if (profile) start_kernel_profile(device.device.is_cuda());
    StepResult r = worker.step(step);
    if (profile) {
      if (device.device.is_cuda()) cuda_synchronize();
      fs::create_directories(out / "profile");
      stop_kernel_profile(
          (out / "profile" / ("rank" + std::to_string(env.rank) + ".json")).string());
    }
    // The step time of the job: the slowest rank's.
    torch::Tensor slowest = torch::tensor({r.step_s}, torch::kFloat64);
    all_reduce(world, slowest, c10d::ReduceOp::MAX);
    const double step_s = slowest.item<double>();
    const double r_loss = r.loss, r_norm = r.grad_norm, r_prepare = r.prepare_s;
    // The step's model FLOPs (forward and backward of every rank, recomputation left out), as
    // the Program counts them: MFU is these over the step time and the devices' peak.
    const double model_flops = r.program.model_flops;
    const int64_t r_tokens = r.llm_tokens;
    const bool trace = !out.empty() && step - first < job.trace_steps;
    Timeline timeline;
    if (trace) timeline = gather_timeline(world, r);
    if (lead) {
      std::printf("step %lld/%lld  loss %.6f  grad-norm %.4g  %.3f s  %.0f tokens/s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(job.steps), r.loss,
                  r.grad_norm, step_s, static_cast<double>(r.llm_tokens) / step_s);
      std::fflush(stdout);
      Json samples = Json::array();
      for (const Sample& sample : r.samples) samples.push_back(to_json(sample));
      iterations.push_back({{"iteration", step},
                            {"loss", r.loss},
                            {"grad_norm", r.grad_norm},
                            {"step_s", step_s},
                            {"llm_tokens", r.llm_tokens},
                            {"model_flops", model_flops},
                            {"samples", samples}});
      if (r.dip) {
        // The schedule the step ran (a replay lowers the same Program), and how it was found.
        iterations.back()["dip"] = {{"schedule", dip_schedule_to_json(r.dip->schedule, s.model)},
                                    {"searched", r.dip->searched},
                                    {"late", r.dip->late},
                                    {"search_s", r.dip->search_s},
                                    {"scored", r.dip->scored},
                                    {"cached", r.dip->cached}};
        dip_steps += 1;
        dip_late += r.dip->late ? 1 : 0;
        if (r.dip->searched) {
          dip_searches += 1;
          dip_search_s += r.dip->search_s;
          dip_search_max_s = std::max(dip_search_max_s, r.dip->search_s);
        }
      }
      if (trace) {
        timelines.push_back(std::move(timeline));
        offsets.push_back(r.started_s - job_start);
        traced.push_back(std::move(r));
      }
    }
    if (losses.is_open()) {
      // step_s: the slowest rank's ops; wall_s: rank 0's whole step (batch, lowering, ops,
      // tracing and logging).
      losses << Json{{"step", step},           {"loss", r_loss},
                     {"grad_norm", r_norm},    {"step_s", step_s},
                     {"prepare_s", r_prepare}, {"wall_s", monotonic_s() - started},
                     {"llm_tokens", r_tokens}, {"model_flops", model_flops}}
                    .dump()
             << "\n";
      losses.flush();
    }
    const bool last = step + 1 == job.steps;
    if (!out.empty() && checkpointing == "1" &&
        (last || (job.checkpoint_every > 0 && (step + 1) % job.checkpoint_every == 0)))
      save_checkpoint(worker, world, out, step + 1);
  }
  // Memory per rank: exact parameter state (weights, gradients of trainable parameters, AdamW
  // moments for what this rank's optimizer holds) and the process's peak resident size.
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  // On a GPU, also the caching allocator's peaks over the run.
  const CudaMemory gpu = device.device.is_cuda() ? cuda_memory_peak() : CudaMemory{};
  torch::Tensor memory = torch::tensor(
      {static_cast<double>(worker.parameter_bytes()), static_cast<double>(usage.ru_maxrss) * 1024.0,
       static_cast<double>(gpu.peak_allocated_bytes), static_cast<double>(gpu.peak_reserved_bytes)},
      torch::kFloat64);
  torch::Tensor reordered =
      torch::tensor({static_cast<double>(worker.reordered_messages())}, torch::kFloat64);
  all_reduce(world, reordered);
  const torch::Tensor memories = all_gather_rows(
      world, memory.unsqueeze(0), std::vector<int64_t>(static_cast<std::size_t>(world.size()), 1));
  if (lead && !out.empty()) {
    std::vector<TraceIteration> its;
    for (std::size_t k = 0; k < traced.size(); ++k)
      its.push_back({&traced[k].program, &timelines[k], offsets[k]});
    if (!its.empty()) {
      const std::string error = write_chrome_traces((out / "trace").string(), its, transport);
      TESSERA_CHECK(error.empty(), error);
    }
    Json run{{"scenario", inline_scenario_json(s)},
             {"scenario_file", job.scenario_file},
             {"plan", to_json(plan)},
             {"world", env.world_size},
             {"device", device.device.is_cuda() ? "cuda" : "cpu"},
             {"precision", precision_name(device.precision)},
             {"backend", transport},
             {"dataset", job.options.dataset == DatasetKind::kShapes ? "shapes" : "synthetic"},
             {"options",
              {{"seed", job.options.seed},
               {"lr", job.options.lr},
               {"clip", job.options.clip},
               {"weight_decay", job.options.weight_decay},
               {"working_copies", job.options.working_copies}}},
             {"software", {{"torch", TORCH_VERSION}, {"torch_threads_per_rank", 1}}},
             {"machine",
              [&] {
                Json m{{"cores", std::thread::hardware_concurrency()}, {"cpu", cpu_model()}};
                if (device.device.is_cuda()) m["gpu"] = cuda_device_name();
                return m;
              }()},
             {"memory_per_rank",
              [&] {
                Json ranks = Json::array();
                for (int64_t r = 0; r < world.size(); ++r) {
                  ranks.push_back({{"rank", r},
                                   {"parameter_state_bytes", memories[r][0].item<double>()},
                                   {"peak_rss_bytes", memories[r][1].item<double>()}});
                  if (device.device.is_cuda()) {
                    ranks.back()["gpu_peak_allocated_bytes"] = memories[r][2].item<double>();
                    ranks.back()["gpu_peak_reserved_bytes"] = memories[r][3].item<double>();
                  }
                }
                return ranks;
              }()},
             {"p2p_messages_reordered", reordered.item<double>()},
             {"first_step", first},
             {"iterations", iterations}};
    if (dip_steps > 0)
      run["dip_search"] = {
          {"steps", dip_steps},
          {"late", dip_late},
          {"searches_used", dip_searches},
          {"search_s_mean",
           dip_searches > 0 ? dip_search_s / static_cast<double>(dip_searches) : 0.0},
          {"search_s_max", dip_search_max_s}};
    write_atomically(out / "run.json", run.dump(1) + "\n");
  }
  return 0;
}

}  // namespace tessera::exec

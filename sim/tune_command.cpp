// `tessera tune`: the analytic ranking checked by measurement. Sweeps the scenario, trains the
// K best plans for a few steps with tessera-train (recording traces), fits a profile to those
// runs, sweeps again with it, and reports every finalist's predicted step before and after
// calibration against the measured one, the held-out error of a profile fitted without it, and
// the plan now recommended. Every phase writes into DIR as it goes; --resume keeps what is there.
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <ostream>
#include <thread>

#include "shared/cost/profile.hpp"
#include "shared/layout/sweep_rows.hpp"
#include "shared/records/calibrate.hpp"
#include "shared/records/run_record.hpp"
#include "sim/command_line.hpp"
#include "sim/commands.hpp"
#include "sim/progress.hpp"
#include "sim/replay.hpp"
#include "sim/sweep.hpp"

namespace tessera::sim {

namespace {

namespace fs = std::filesystem;

// The tessera-train to run: --train, else $TESSERA_TRAIN, else the build tree's beside this
// program (build/sim/tessera -> build/exec/tessera-train), else the one on PATH.
std::string train_binary(const std::string& given) {
  // A path (not a name PATH resolves) made absolute: Slurm's nodes start in other folders.
  if (!given.empty())
    return given.find('/') == std::string::npos ? given : fs::absolute(given).string();
  if (const char* env = std::getenv("TESSERA_TRAIN"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = self.parent_path().parent_path() / "exec" / "tessera-train";
    if (fs::exists(beside)) return beside.string();
  }
  return "tessera-train";
}

// Runs argv with standard output and error into `log`; the exit status, or -1 when the program
// could not start or was killed.
int run_logged(const std::vector<std::string>& argv, const fs::path& log) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The last non-empty line of a log: what a refusing or failing tessera-train said.
std::string last_line(const fs::path& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last.size() > 160 ? last.substr(0, 160) + "..." : last;
}

// Whether DIR holds a finished recording of `steps` steps with its traces.
bool recorded(const fs::path& dir, int64_t steps) {
  std::ifstream in(dir / "loss.jsonl");
  int64_t lines = 0;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) ++lines;
  return lines >= steps && fs::exists(dir / "run.json") && fs::exists(dir / "trace" / "rank0.json");
}

// "12.5% faster" when a step of `than_s` becomes `now_s`, or "3.0% slower".
std::string faster_or_slower(double than_s, double now_s) {
  const double gain = 100 * (than_s / now_s - 1);
  return fixed(std::abs(gain), 1) + (gain >= 0 ? "% faster" : "% slower");
}

// "non_colocated: llm t1 d2 | vision t1 d2 dopt".
std::string placed_layout(const ParallelPlan& plan, const ModelSpec& model) {
  return enum_name(plan.placement, kPlacements) + ": " + describe_layout(plan, model);
}

// One plan to train: the --plan reference, the run folder, what progress calls it, its ranks.
struct TrainJob {
  std::string plan_ref;
  fs::path run;
  std::string what;
  int64_t world = 1;
};

// scripts/slurm of the source tree: $TESSERA_SLURM_SCRIPTS, else beside the build tree that
// holds this program (SOURCE/build/sim/tessera).
fs::path slurm_scripts_dir() {
  if (const char* env = std::getenv("TESSERA_SLURM_SCRIPTS"); env != nullptr && *env != '\0')
    return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path("scripts/slurm")
            : self.parent_path().parent_path().parent_path() / "scripts" / "slurm";
}

struct Finalist {
  int64_t rank = 0;  // in the first sweep's results.jsonl
  SweepRow row;
  std::string layout;
  std::string dir;     // the recorded run
  std::string status;  // "measured", or why not
  double measured_s = 0, before_s = 0, after_s = 0, held_out_s = 0;
  double before_pct = 0, after_pct = 0, held_out_pct = 0;
  bool held_out = false;  // a profile fitted without this run predicted it
  double reranked_s = 0;  // its predicted step in the calibrated sweep (0: not simulated there)
};

// Mean measured and predicted step over a replay's warm iterations.
std::pair<double, double> warm_means(const ReplayResult& r) {
  double measured = 0, predicted = 0;
  int64_t n = 0;
  for (const ReplayIteration& it : r.iterations)
    if (!it.warmup) {
      measured += it.measured_s;
      predicted += it.predicted_s;
      ++n;
    }
  return n == 0 ? std::pair{0.0, 0.0} : std::pair{measured / n, predicted / n};
}

}  // namespace

int run_tune(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera tune",
      "Measures the finalists of a sweep and re-ranks it: sweeps the scenario at one GPU count "
      "(plans without sequence parallelism, which the executor does not run), trains the K best "
      "plans the executor runs for a few steps with tessera-train (traces "
      "recorded), fits a calibration profile to those runs, sweeps again with it and reports, "
      "per finalist, the predicted step before and after calibration against the measured one "
      "(and a profile fitted without it: the held-out error), then the plan it now recommends, "
      "trained too where it was no finalist. Writes DIR/sweep, DIR/runs, DIR/profile.json, "
      "DIR/sweep-calibrated and DIR/tune.json.");
  options.add_options()("gpus", "the GPU count (default: the cluster's devices)",
                        cxxopts::value<int64_t>())("top", "finalists to measure",
                                                   cxxopts::value<int64_t>()->default_value("3"))(
      "steps", "training steps per finalist (the first traced one is left out as warm-up)",
      cxxopts::value<int64_t>()->default_value("6"))(
      "out", "output folder (default: out/tune-<scenario>)", cxxopts::value<std::string>())(
      "resume", "keep the sweeps and recorded runs already in the output folder")(
      "train", "the tessera-train program (default: $TESSERA_TRAIN, the build tree's, PATH's)",
      cxxopts::value<std::string>())(
      "slurm",
      "train through Slurm: the finalists of each rank count as one job array "
      "(scripts/slurm/train-array.sbatch), all submitted at once")(
      "j,jobs", "simulations in parallel",
      cxxopts::value<int>()->default_value(
          std::to_string(std::max(1u, std::thread::hardware_concurrency()))));
  int code = kOk;
  std::string file;
  const auto result =
      parse_with_input(options, "scenario file", "<scenario.json>", args, out, err, file, code);
  if (!result) return code;
  const int64_t top = (*result)["top"].as<int64_t>();
  const int64_t steps = (*result)["steps"].as<int64_t>();
  const int jobs = (*result)["jobs"].as<int>();
  if (top < 1 || steps < 3 || jobs < 1 ||
      (result->count("gpus") && (*result)["gpus"].as<int64_t>() < 1)) {
    err << options.program() << ": --top >= 1, --steps >= 3, --jobs >= 1 and --gpus >= 1\n";
    return kBadInput;
  }
  Diagnostics diag;
  const auto scenario = load_scenario(file, diag);
  if (!scenario) return report_problems(diag, err);
  const int64_t gpus =
      result->count("gpus") ? (*result)["gpus"].as<int64_t>() : device_count(scenario->cluster);
  if (gpus < 1) {
    err << options.program() << ": " << file
        << ": the cluster sets no device count (cpu-local): give --gpus\n";
    return kBadInput;
  }
  const fs::path dir =
      result->count("out") ? (*result)["out"].as<std::string>() : "out/tune-" + scenario->name;
  const bool resume = result->count("resume") > 0;
  const std::string train =
      train_binary(result->count("train") ? (*result)["train"].as<std::string>() : "");
  const fs::path slurm_scripts = fs::absolute(slurm_scripts_dir());
  if (result->count("slurm")) {
    if (!fs::exists(slurm_scripts / "train-array.sbatch")) {
      err << options.program() << ": --slurm: no "
          << (slurm_scripts / "train-array.sbatch").string()
          << " (set TESSERA_SLURM_SCRIPTS to the source tree's scripts/slurm)\n";
      return kBadInput;
    }
    // The batch scripts run on the cluster's nodes: they find train.sbatch and tessera-train
    // through the environment sbatch passes on.
    ::setenv("TESSERA_SLURM_SCRIPTS", slurm_scripts.c_str(), 1);
    ::setenv("TESSERA_TRAIN", train.c_str(), 1);
  }
  std::error_code ec;
  fs::create_directories(dir / "runs", ec);
  if (ec) {
    err << options.program() << ": cannot create " << (dir / "runs").string() << ": "
        << ec.message() << "\n";
    return kBadInput;
  }
  Progress progress(err, ::isatty(2) != 0);
  const auto sweep_once = [&](const fs::path& to, const std::optional<CostParams>& cost) {
    SweepOptions sweep;
    sweep.gpus = {gpus};
    // Plans the executor runs: its sequence parallelism takes no MoE layers or latent attention
    // (executor_plan_support).
    if (const ModuleSpec* llm = find_llm(scenario->model);
        llm != nullptr && llm->transformer &&
        (llm->transformer->experts > 0 || llm->transformer->kv_lora_rank > 0))
      sweep.sequence_parallel = {false};
    // At least the finalists simulated; more where the search space asks for more.
    const int64_t space_top = scenario->search ? scenario->search->top_k : 0;
    sweep.top_k = std::max(top + 2, space_top);
    sweep.jobs = jobs;
    sweep.resume = resume;
    sweep.out_dir = to.string();
    sweep.scenario_file = fs::absolute(file).string();
    sweep.cost = cost;
    return run_sweep(*scenario, sweep,
                     [&](const std::string& phase, const std::string& what, std::size_t done,
                         std::size_t total, const std::string& last,
                         bool failed) { progress.update(phase, what, done, total, last, failed); });
  };

  // 1. The analytic sweep.
  err << "tune: sweeping " << scenario->name << " at " << gpus << " GPUs\n";
  sweep_once(dir / "sweep", std::nullopt);
  const std::string results = (dir / "sweep" / "results.jsonl").string();
  const std::vector<SweepRow> rows = load_sweep_rows(results);

  // Trains each job's plan into its run folder (kept when --resume finds it finished): one at a
  // time here, or with --slurm as job arrays submitted together. Returns per job "measured", or
  // why not.
  const bool slurm = result->count("slurm") > 0;
  int round = 0;
  const auto record = [&](const std::vector<TrainJob>& batch) {
    std::vector<std::string> status(batch.size());
    std::vector<std::size_t> todo;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (resume && recorded(batch[i].run, steps)) {
        err << "tune: " << batch[i].what << ": recorded already\n";
        status[i] = "measured";
      } else {
        fs::remove_all(batch[i].run, ec);
        todo.push_back(i);
      }
    }
    const auto options_of = [&](const TrainJob& j) {
      return std::vector<std::string>{"--plan",          j.plan_ref,
                                      "--steps",         std::to_string(steps),
                                      "--trace-steps",   std::to_string(steps),
                                      "--no-checkpoint", "--out",
                                      j.run.string()};
    };
    std::map<std::size_t, fs::path> logs;
    if (!slurm) {
      for (std::size_t i : todo) {
        err << "tune: training " << batch[i].what << ", " << steps << " steps ...\n";
        const auto started = std::chrono::steady_clock::now();
        std::vector<std::string> argv{train, fs::absolute(file).string()};
        for (const std::string& o : options_of(batch[i])) argv.push_back(o);
        logs[i] = batch[i].run.string() + ".log";
        if (const int exited = run_logged(argv, logs[i]);
            exited == 0 && recorded(batch[i].run, steps))
          err << "tune: trained in "
              << fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                           .count(),
                       1)
              << " s\n";
        else if (exited == kBadInput)
          status[i] = "refused by the executor: " + last_line(logs[i]);
      }
    } else if (!todo.empty()) {
      // One array per rank count, every array submitted before any is waited for.
      ++round;
      const fs::path at = dir / "slurm";
      fs::create_directories(at / "logs", ec);
      std::map<int64_t, std::vector<std::size_t>> by_world;
      for (std::size_t i : todo) by_world[batch[i].world].push_back(i);
      std::vector<std::string> ids;
      for (const auto& [world, members] : by_world) {
        const std::string name = "round" + std::to_string(round) + "-ranks" + std::to_string(world);
        std::ofstream list(at / (name + ".txt"));
        for (std::size_t i : members) {
          std::string line;
          for (const std::string& o : options_of(batch[i])) line += (line.empty() ? "" : " ") + o;
          list << line << "\n";
        }
        list.close();
        const fs::path submitted = at / (name + ".submitted");
        const int submit =
            run_logged({"sbatch", "--parsable", "--array=1-" + std::to_string(members.size()),
                        "--ntasks=" + std::to_string(world),
                        "--output=" + (at / "logs" / (name + "-%a.log")).string(),
                        (slurm_scripts / "train-array.sbatch").string(),
                        (at / (name + ".txt")).string(), fs::absolute(file).string()},
                       submitted);
        const std::string id = last_line(submitted);
        if (submit != 0 || id.empty()) {
          for (std::size_t i : members) status[i] = "not submitted: " + id;
          continue;
        }
        ids.push_back(id.substr(0, id.find(';')));
        err << "tune: submitted job array " << ids.back() << ": " << members.size() << " plans of "
            << world << " ranks\n";
        for (std::size_t k = 0; k < members.size(); ++k)
          logs[members[k]] = at / "logs" / (name + "-" + std::to_string(k + 1) + ".log");
      }
      // Until none of the arrays is queued or running. squeue fails once every job it is asked
      // about has left the controller's memory: that too means done.
      std::string joined;
      for (const std::string& id : ids) joined += (joined.empty() ? "" : ",") + id;
      const auto started = std::chrono::steady_clock::now();
      auto next_note = started + std::chrono::seconds(30);
      while (!joined.empty()) {
        const fs::path queue = at / "squeue.txt";
        if (run_logged({"squeue", "-h", "-o", "%i", "-j", joined}, queue) != 0) break;
        std::ifstream in(queue);
        std::string first;
        if (!std::getline(in, first) || first.empty()) break;
        std::this_thread::sleep_for(std::chrono::seconds(2));
        if (const auto now = std::chrono::steady_clock::now(); now >= next_note) {
          err << "tune: waiting for job arrays " << joined << " ("
              << fixed(std::chrono::duration<double>(now - started).count(), 0) << " s)\n";
          next_note = now + std::chrono::seconds(30);
        }
      }
    }
    for (std::size_t i : todo) {
      if (!status[i].empty()) continue;
      status[i] = recorded(batch[i].run, steps) ? "measured" : "failed: " + last_line(logs[i]);
      if (status[i] != "measured") err << "tune: " << batch[i].what << ": " << status[i] << "\n";
    }
    for (std::size_t i = 0; i < batch.size(); ++i)
      if (status[i].rfind("refused", 0) == 0)
        err << "tune: " << batch[i].what << ": " << status[i] << "\n";
    return status;
  };

  // 2. Train the K best plans the executor takes, in the sweep's order: as many as are still
  //    missing each round, the next ones after a plan that could not be trained.
  std::vector<Finalist> finalists;
  int64_t measured = 0;
  for (std::size_t next = 0; measured < top && next < rows.size();) {
    std::vector<TrainJob> to_train;
    std::vector<Finalist> round_finalists;
    for (; next < rows.size() && measured + static_cast<int64_t>(round_finalists.size()) < top;
         ++next) {
      if (!rows[next].ok) continue;
      Finalist f;
      f.rank = static_cast<int64_t>(next) + 1;
      f.row = rows[next];
      f.layout = placed_layout(rows[next].plan, scenario->model);
      f.dir = (dir / "runs" / ("rank-" + std::to_string(f.rank))).string();
      to_train.push_back({results + "#" + std::to_string(f.rank), f.dir,
                          "rank " + std::to_string(f.rank) + " (" + f.layout + ")",
                          world_size(f.row.plan, scenario->model)});
      round_finalists.push_back(std::move(f));
    }
    const std::vector<std::string> status = record(to_train);
    for (std::size_t k = 0; k < round_finalists.size(); ++k) {
      round_finalists[k].status = status[k];
      if (status[k] == "measured") ++measured;
      finalists.push_back(std::move(round_finalists[k]));
    }
  }
  if (measured == 0) {
    err << options.program() << ": no plan of the sweep could be trained (logs in "
        << (dir / "runs").string() << ")\n";
    return 1;
  }

  // 3. Fit a profile to the measured runs.
  std::vector<CalibrationRun> runs;
  std::vector<Finalist*> fitted;
  for (Finalist& f : finalists) {
    if (f.status != "measured") continue;
    auto run = load_calibration_run(f.dir, true, diag);
    if (!run) return report_problems(diag, err);
    runs.push_back(std::move(*run));
    fitted.push_back(&f);
  }
  CalibrateOptions calibrate_options;
  const Profile profile = calibrate(runs, calibrate_options);
  const std::string profile_file = (dir / "profile.json").string();
  if (const std::string problem =
          write_file_atomically(profile_file, to_json(profile).dump(1) + "\n");
      !problem.empty()) {
    err << options.program() << ": " << problem << "\n";
    return 1;
  }
  err << "tune: profile fitted to " << runs.size() << " runs: " << profile_file << "\n";
  const ClusterSpec& machine = runs.front().run.scenario.cluster;
  const CostParams calibrated = profile_cost_params(profile, machine, profile_file, diag);
  if (!diag.ok()) return report_problems(diag, err);

  // 4. Each finalist replayed with the analytic model, the profile, and (the held-out error) a
  //    profile fitted to the other runs.
  ReplayOptions replay_options;
  for (std::size_t k = 0; k < runs.size(); ++k) {
    Finalist& f = *fitted[k];
    err << "tune: replaying rank " << f.rank << "\n";
    const ReplayResult before =
        replay(runs[k].run, runs[k].traced, default_cost_params(machine), replay_options);
    const ReplayResult after = replay(runs[k].run, runs[k].traced, calibrated, replay_options);
    std::tie(f.measured_s, f.before_s) = warm_means(before);
    f.after_s = warm_means(after).second;
    f.before_pct = before.mean_error_pct;
    f.after_pct = after.mean_error_pct;
    if (runs.size() >= 2) {
      std::vector<CalibrationRun> others;
      for (std::size_t j = 0; j < runs.size(); ++j)
        if (j != k) others.push_back(runs[j]);
      Diagnostics quiet;
      const CostParams without =
          profile_cost_params(calibrate(others, calibrate_options), machine, profile_file, quiet);
      const ReplayResult held = replay(runs[k].run, runs[k].traced, without, replay_options);
      f.held_out = quiet.ok() && held.error.empty();
      f.held_out_s = warm_means(held).second;
      f.held_out_pct = held.mean_error_pct;
    }
  }

  // 5. The whole sweep again with the profile.
  err << "tune: sweeping again with the profile\n";
  sweep_once(dir / "sweep-calibrated", calibrated);
  const std::vector<SweepRow> rows2 =
      load_sweep_rows((dir / "sweep-calibrated" / "results.jsonl").string());
  for (Finalist& f : finalists)
    for (const SweepRow& r : rows2)
      if (r.ok && r.key == f.row.key) f.reranked_s = r.step_s;
  // 6. Tune's choice: the calibrated sweep's best plan the executor runs, measured (trained
  //    here unless it was a finalist) and predicted by the profile, which never saw it.
  const std::string results2 = (dir / "sweep-calibrated" / "results.jsonl").string();
  const SweepRow* best = nullptr;
  Finalist choice;
  for (std::size_t i = 0; i < rows2.size() && best == nullptr; ++i) {
    if (!rows2[i].ok) continue;
    const auto finalist = std::find_if(finalists.begin(), finalists.end(), [&](const Finalist& f) {
      return f.row.key == rows2[i].key;
    });
    if (finalist != finalists.end() && finalist->status == "measured") {
      best = &rows2[i];
      choice = *finalist;
      break;
    }
    choice = Finalist{};
    choice.rank = static_cast<int64_t>(i) + 1;
    choice.row = rows2[i];
    choice.layout = placed_layout(rows2[i].plan, scenario->model);
    const fs::path run = dir / "runs" / ("calibrated-rank-" + std::to_string(choice.rank));
    choice.dir = run.string();
    choice.status = record({{results2 + "#" + std::to_string(choice.rank), run,
                             "the calibrated sweep's rank " + std::to_string(choice.rank) + " (" +
                                 choice.layout + ")",
                             world_size(rows2[i].plan, scenario->model)}})
                        .front();
    if (choice.status != "measured") continue;
    auto loaded = load_calibration_run(choice.dir, true, diag);
    if (!loaded) return report_problems(diag, err);
    const ReplayResult predicted = replay(loaded->run, loaded->traced, calibrated, replay_options);
    std::tie(choice.measured_s, choice.after_s) = warm_means(predicted);
    choice.after_pct = predicted.mean_error_pct;
    best = &rows2[i];
  }

  // The report.
  const Finalist* analytic_first = nullptr;
  const Finalist* fastest = nullptr;
  for (const Finalist& f : finalists) {
    if (f.status != "measured") continue;
    if (analytic_first == nullptr) analytic_first = &f;
    if (fastest == nullptr || f.measured_s < fastest->measured_s) fastest = &f;
  }
  out << "finalists of " << scenario->name << " at " << gpus
      << " GPUs (steps: mean over the warm iterations; errors: replayed against measured)\n";
  out << std::left << std::setw(6) << "rank" << std::setw(62) << "layout" << std::right
      << std::setw(4) << "MBS" << std::setw(11) << "measured" << std::setw(11) << "analytic"
      << std::setw(9) << "error" << std::setw(12) << "calibrated" << std::setw(9) << "error"
      << std::setw(11) << "held out" << std::setw(9) << "error"
      << "\n";
  for (const Finalist& f : finalists) {
    out << std::left << std::setw(6) << f.rank << std::setw(62) << f.layout.substr(0, 61)
        << std::right << std::setw(4) << f.row.plan.micro_batch_size;
    if (f.status != "measured") {
      out << "  " << f.status << "\n";
      continue;
    }
    out << std::setw(11) << fixed(f.measured_s, 4) << std::setw(11) << fixed(f.before_s, 4)
        << std::setw(9) << signed_percent(f.before_pct) << std::setw(12) << fixed(f.after_s, 4)
        << std::setw(9) << signed_percent(f.after_pct);
    if (f.held_out)
      out << std::setw(11) << fixed(f.held_out_s, 4) << std::setw(9)
          << signed_percent(f.held_out_pct);
    out << "\n";
  }
  const bool first_is_fastest = analytic_first == fastest;
  out << "the analytic first choice (rank " << analytic_first->rank << ") is "
      << (first_is_fastest
              ? "the measured fastest"
              : "not the measured fastest: rank " + std::to_string(fastest->rank) + " is " +
                    faster_or_slower(analytic_first->measured_s, fastest->measured_s))
      << "\n";
  if (best == nullptr) {
    out << "the calibrated sweep has no plan the executor runs\n";
  } else {
    const bool finalist = choice.dir.find("calibrated-rank-") == std::string::npos;
    out << "recommended after calibration (the calibrated sweep's rank " << choice.rank
        << "): " << choice.layout << ", micro-batch " << best->plan.micro_batch_size
        << ", predicted " << fixed(best->step_s, 4) << " s per step\n";
    out << "  measured " << fixed(choice.measured_s, 4) << " s per step ("
        << (finalist ? "a finalist"
                     : "trained to check it; the profile predicted it at " +
                           fixed(choice.after_s, 4) + " s, " + signed_percent(choice.after_pct))
        << "): " << faster_or_slower(analytic_first->measured_s, choice.measured_s)
        << " than the analytic first choice\n";
    const std::string plan_ref = results2 + "#" + std::to_string(choice.rank);
    out << "  train it:  tessera-train " << file << " --plan " << plan_ref << "\n";
    out << "  export it: tessera export " << file << " --plan " << plan_ref << " --to megatron\n";
  }

  Json j = Json::object();
  j["scenario"] = scenario->name;
  j["gpus"] = gpus;
  j["steps"] = steps;
  j["profile"] = profile_file;
  Json list = Json::array();
  for (const Finalist& f : finalists) {
    Json e = Json::object();
    e["rank"] = f.rank;
    e["key"] = f.row.key;
    e["layout"] = f.layout;
    e["status"] = f.status;
    e["sweep_step_s"] = f.row.step_s;
    if (f.status == "measured") {
      e["measured_s"] = f.measured_s;
      e["analytic_s"] = f.before_s;
      e["analytic_error_pct"] = f.before_pct;
      e["calibrated_s"] = f.after_s;
      e["calibrated_error_pct"] = f.after_pct;
      if (f.held_out) {
        e["held_out_s"] = f.held_out_s;
        e["held_out_error_pct"] = f.held_out_pct;
      }
      if (f.reranked_s > 0) e["calibrated_sweep_step_s"] = f.reranked_s;
    }
    list.push_back(e);
  }
  j["finalists"] = list;
  j["analytic_first_rank"] = analytic_first->rank;
  j["measured_fastest_rank"] = fastest->rank;
  j["gain_over_analytic_first_pct"] = 100 * (analytic_first->measured_s / fastest->measured_s - 1);
  if (best != nullptr) {
    Json r = Json::object();
    r["calibrated_rank"] = choice.rank;
    r["key"] = best->key;
    r["layout"] = choice.layout;
    r["predicted_step_s"] = best->step_s;
    r["measured_s"] = choice.measured_s;
    r["run"] = choice.dir;
    if (choice.dir.find("calibrated-rank-") != std::string::npos) {
      r["held_out_s"] = choice.after_s;
      r["held_out_error_pct"] = choice.after_pct;
    }
    r["gain_over_analytic_first_pct"] = 100 * (analytic_first->measured_s / choice.measured_s - 1);
    j["recommended"] = r;
  }
  const std::string summary = (dir / "tune.json").string();
  if (const std::string problem = write_file_atomically(summary, j.dump(1) + "\n");
      !problem.empty()) {
    err << options.program() << ": " << problem << "\n";
    return 1;
  }
  out << "written: " << summary << "\n";
  return kOk;
}

}  // namespace tessera::sim

// `tessera calibrate` and `tessera replay`: the loop from recorded runs to a fitted profile and
// back to predicted-vs-measured.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>

#include "shared/cost/profile.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/records/calibrate.hpp"
#include "shared/records/profile_report.hpp"
#include "shared/records/run_record.hpp"
#include "sim/command_line.hpp"
#include "sim/replay.hpp"

namespace tessera::sim {

int run_calibrate(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera calibrate",
      "Fits the cost model to recorded runs (tessera-train --out DIR): joins every trace slice "
      "to its op by op id, measures compute on a core of its own, collectives from their last "
      "member's arrival and messages from their send, and fits fixed cost + rate per class with "
      "least squares (medians over the warm iterations). Writes the profile that simulate, "
      "sweep and replay take with --profile.");
  options.add_options()("runs", "run folders", cxxopts::value<std::vector<std::string>>())(
      "o,out", "profile to write", cxxopts::value<std::string>())(
      "cluster", "cluster file the profile will be used on: warn where fits extrapolate onto it",
      cxxopts::value<std::string>())("warmup",
                                     "traced iterations left out at the start of each run",
                                     cxxopts::value<int64_t>()->default_value("1"));
  options.parse_positional({"runs"});
  options.positional_help("<run-dir>...");
  int code = kOk;
  const auto result = parse(options, args, out, err, code);
  if (!result) return code;
  if (!result->count("runs") || !result->count("out")) {
    err << options.program() << ": give one or more run folders and -o profile.json\n";
    return kBadInput;
  }
  const int64_t warmup = (*result)["warmup"].as<int64_t>();
  if (warmup < 0) {
    err << options.program() << ": --warmup must be >= 0\n";
    return kBadInput;
  }
  Diagnostics diag;
  std::optional<ClusterSpec> target;
  if (result->count("cluster")) {
    target = load_cluster((*result)["cluster"].as<std::string>(), diag);
    if (!target) return report_problems(diag, err);
  }
  std::vector<CalibrationRun> runs;
  for (const std::string& dir : (*result)["runs"].as<std::vector<std::string>>()) {
    auto run = load_calibration_run(dir, true, diag);
    if (!run) continue;
    const RunRecord& a = runs.empty() ? run->run : runs.front().run;
    const RunRecord& b = run->run;
    if (a.scenario.cluster.kind != b.scenario.cluster.kind ||
        a.scenario.cluster.device.name != b.scenario.cluster.device.name || a.cores != b.cores ||
        a.cpu != b.cpu)
      diag.error(dir + "/run.json", "machine",
                 "recorded on another machine than " + runs.front().run.dir +
                     " (one profile fits one machine)");
    runs.push_back(std::move(*run));
  }
  if (!diag.ok()) return report_problems(diag, err);
  CalibrateOptions calibrate_options;
  calibrate_options.warmup_iterations = warmup;
  calibrate_options.target = target ? &*target : nullptr;
  const Profile profile = calibrate(runs, calibrate_options);
  const std::string file = (*result)["out"].as<std::string>();
  const std::string problem = write_file_atomically(file, to_json(profile).dump(1) + "\n");
  if (!problem.empty()) {
    err << options.program() << ": " << problem << "\n";
    return 1;
  }
  out << format_profile(profile) << "profile written to " << file << "\n";
  return kOk;
}

namespace {

// `tessera replay --markdown`: one row per run (replayed as `replay` does), then the mean of each
// role, the runs the profile was fitted on apart from the others.
struct ReplayRow {
  std::string run;
  bool fitting = false;
  ReplayResult result;
};

std::string replay_table(const std::vector<ReplayRow>& rows, bool profiled) {
  std::string out =
      "| run | role | mean \\|error\\| per step | error of the mean step | the run's own noise "
      "|\n|---|---|---|---|---|\n";
  char line[320];
  auto percent = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f%%", v);
    return std::string(text);
  };
  for (const ReplayRow& r : rows) {
    std::snprintf(line, sizeof line, "| %s | %s | %.1f%% | %+.1f%% | %s |\n", r.run.c_str(),
                  !profiled   ? "-"
                  : r.fitting ? "fitting"
                              : "held out",
                  r.result.mean_abs_error_pct, r.result.mean_error_pct,
                  r.result.noise_floor_pct >= 0 ? percent(r.result.noise_floor_pct).c_str() : "-");
    out += line;
  }
  for (const bool fitting : {true, false}) {
    double per_step = 0, of_mean = 0, noise = 0;
    int64_t n = 0, steady = 0;
    for (const ReplayRow& r : rows)
      if (!profiled || r.fitting == fitting) {
        per_step += r.result.mean_abs_error_pct;
        of_mean += std::abs(r.result.mean_error_pct);
        if (r.result.noise_floor_pct >= 0) {
          noise += r.result.noise_floor_pct;
          ++steady;
        }
        ++n;
      }
    if (n > 0) {
      const auto count = static_cast<double>(n);
      std::snprintf(line, sizeof line,
                    "| **%s runs (%lld)** | | **%.1f%%** | **%.1f%%** (\\|·\\|) | %s |\n",
                    !profiled ? "all"
                    : fitting ? "fitting"
                              : "held-out",
                    static_cast<long long>(n), per_step / count, of_mean / count,
                    steady > 0 ? percent(noise / static_cast<double>(steady)).c_str() : "-");
      out += line;
    }
    if (!profiled) break;
  }
  return out;
}

}  // namespace

int run_replay(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera replay",
      "Calibrated trace replay: lowers a recorded run's plan with the samples each iteration "
      "trained on, simulates every iteration on the recorded machine and prints predicted vs "
      "measured step time per iteration and time per op class. Several runs: each in turn, or "
      "one table with --markdown.");
  add_profile_option(options);
  options.add_options()("runs", "run folders", cxxopts::value<std::vector<std::string>>())(
      "trace", "write the simulated traces (of the traced iterations) here",
      cxxopts::value<std::string>())(
      "html",
      "write a page here with a traced iteration's measured and predicted steps op by op, on "
      "the same ranks and time axis",
      cxxopts::value<std::string>())("warmup", "first iterations shown but left out of the errors",
                                     cxxopts::value<int64_t>()->default_value("1"))(
      "timeout", "seconds allowed per simulated iteration",
      cxxopts::value<double>()->default_value("600"))("json", "machine-readable output")(
      "markdown",
      "one table row per run: its role (the profile fitted on it or not), mean |error| per "
      "step, error of the mean step, the run's own noise; then the mean of each role");
  options.parse_positional({"runs"});
  options.positional_help("<run-dir>...");
  int code = kOk;
  const auto result = parse(options, args, out, err, code);
  if (!result) return code;
  if (!result->count("runs")) {
    err << options.program() << ": missing run folder\ntry '" << options.program() << " --help'\n";
    return kBadInput;
  }
  const auto dirs = (*result)["runs"].as<std::vector<std::string>>();
  ReplayOptions replay_options;
  replay_options.warmup_iterations = (*result)["warmup"].as<int64_t>();
  replay_options.timeout_s = (*result)["timeout"].as<double>();
  if (replay_options.warmup_iterations < 0 || replay_options.timeout_s <= 0) {
    err << options.program() << ": --warmup >= 0 and --timeout > 0\n";
    return kBadInput;
  }
  const bool markdown = result->count("markdown") > 0;
  if (dirs.size() > 1 &&
      (result->count("trace") || result->count("html") || result->count("json"))) {
    err << options.program() << ": --trace, --html and --json take one run folder\n";
    return kBadInput;
  }
  if (result->count("trace")) replay_options.trace_dir = (*result)["trace"].as<std::string>();
  if (result->count("html")) replay_options.html_file = (*result)["html"].as<std::string>();
  // The runs the profile was fitted on, by folder name.
  std::vector<std::string> fitted;
  Diagnostics diag;
  if (result->count("profile"))
    if (const auto profile = load_profile((*result)["profile"].as<std::string>(), diag))
      for (const std::string& run : profile->runs)
        fitted.push_back(std::filesystem::path(run).filename().string());
  if (!diag.ok()) return report_problems(diag, err);
  std::vector<ReplayRow> rows;
  int status = kOk;
  for (const std::string& dir : dirs) {
    auto run = load_calibration_run(dir, false, diag);
    if (!run) return report_problems(diag, err);
    const ClusterSpec& cluster = run->run.scenario.cluster;
    const std::optional<CostParams> cost = profile_option(*result, cluster, diag);
    if (!diag.ok()) return report_problems(diag, err);
    ReplayResult r =
        replay(run->run, run->traced, cost ? *cost : default_cost_params(cluster), replay_options);
    if (result->count("json")) {
      out << replay_to_json(r).dump(1) << "\n";
    } else if (!markdown) {
      out << "run " << dir << ": " << run->run.scenario.name << ", " << run->run.iterations.size()
          << " iterations, " << run->traced.size() << " traced; cost model: "
          << (cost ? (*result)["profile"].as<std::string>() : std::string("analytic defaults"))
          << "\n";
      out << format_replay(r);
    }
    if (!r.html_error.empty()) {
      err << options.program() << ": --html " << replay_options.html_file << ": " << r.html_error
          << "\n";
      return kBadInput;
    }
    if (!r.error.empty() || !r.trace_error.empty()) {
      if (!r.trace_error.empty()) err << options.program() << ": " << r.trace_error << "\n";
      if (markdown) err << options.program() << ": " << dir << ": " << r.error << "\n";
      status = 1;
      continue;
    }
    const std::string name = std::filesystem::path(dir).filename().string();
    const bool fitting = std::find(fitted.begin(), fitted.end(), name) != fitted.end();
    rows.push_back({name.empty() ? dir : name, fitting, std::move(r)});
  }
  if (markdown) out << replay_table(rows, result->count("profile") > 0);
  return status;
}

}  // namespace tessera::sim

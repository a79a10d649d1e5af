// `tessera fidelity`: the cost model against published training runs (scenarios with a
// `published` block): predicted vs published step per row, per series and per source; with
// --fit, the kernel model's two global parameters fitted on the rows not held out, and
// leave-one-source-out. Each row is lowered once (once per iteration its published mean covers)
// and evaluated at every tuning point.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <ostream>
#include <thread>

#include "shared/cost/evaluator.hpp"
#include "shared/cost/fidelity.hpp"
#include "shared/cost/metrics.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/search/estimate.hpp"
#include "shared/search/scenario_report.hpp"
#include "shared/search/stage_split.hpp"
#include "sim/command_line.hpp"

namespace tessera::sim {

namespace {

std::string percent(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f%%", 100 * x);
  return s;
}

std::string fit_text(const TuningGrid& grid, const TuningFit& fit) {
  char s[96];
  std::snprintf(s, sizeof s, "launch %.0f us", grid.launch_s[fit.launch_index] * 1e6);
  std::string out = s;
  for (const auto& [device, index] : fit.scale_index) {
    std::snprintf(s, sizeof s, ", %s %.2f", device.c_str(), grid.scale[index]);
    out += s;
  }
  return out;
}

// What a fit scales on its own: a device's rates under Megatron-LM, and apart from them under
// a PyTorch-native stack (the device file's `pytorch.training_scale`).
std::string fit_key(const std::string& device, Framework framework) {
  return framework == Framework::kMegatron ? device
                                           : device + "/" + enum_name(framework, kFrameworks);
}

// What a published run is, for the suite's figures by kind; the first that applies: a model with
// encoders is multimodal, an LLM with experts MoE, a fully sharded plan FSDP, FP8 GEMMs FP8.
std::string run_kind(const ModelSpec& model, const ParallelPlan& plan) {
  for (const ModuleSpec& m : model.modules)
    if (m.role == ModuleRole::kEncoder) return "multimodal";
  for (const ModuleSpec& m : model.modules)
    if (m.role == ModuleRole::kLlm && m.transformer && m.transformer->experts > 0) return "moe";
  if (plan.fully_sharded) return "fsdp";
  if (plan.fp8 != Fp8Recipe::kNone) return "fp8";
  return "dense";
}

void print_rows(const std::vector<FidelityRow>& rows, const std::vector<double>& predicted,
                std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof line, "%-36s %-22s %10s %10s %8s\n", "scenario", "series", "published",
                "predicted", "error");
  out << line;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const FidelityRow& r = rows[i];
    const double p = predicted[i];
    if (p > 0)
      std::snprintf(line, sizeof line, "%-36s %-22s %9.3fs %9.3fs %+7.1f%%%s\n", r.name.c_str(),
                    r.series.c_str(), r.published_s, p, 100 * (p - r.published_s) / r.published_s,
                    r.holdout ? "  (held out)" : "");
    else
      std::snprintf(line, sizeof line, "%-36s %-22s %9.3fs %10s %8s\n", r.name.c_str(),
                    r.series.c_str(), r.published_s, "-", "failed");
    out << line;
  }
}

// A table of per-group errors: its header when asked, then a line per group, its name with
// `suffix`.
void print_stats_table(const char* title, const std::vector<SeriesStats>& stats,
                       const std::string& suffix, bool header, std::ostream& out) {
  char line[256];
  if (header) {
    std::snprintf(line, sizeof line, "%-22s %5s %10s %10s %9s\n", title, "rows", "mean|err|",
                  "max|err|", "spearman");
    out << line;
  }
  for (const SeriesStats& s : stats) {
    char rho[16] = "        -";
    if (!std::isnan(s.spearman)) std::snprintf(rho, sizeof rho, "%9.2f", s.spearman);
    const std::string name = s.series + suffix;
    std::snprintf(line, sizeof line, "%-22s %5zu %9.1f%% %9.1f%% %s\n", name.c_str(), s.rows,
                  100 * s.mean_abs_error, 100 * s.max_abs_error, rho);
    out << line;
  }
}

// The totals of the suite's rows (held: of the held-out rows).
struct Totals {
  std::size_t rows = 0, within10 = 0, within15 = 0;
  double mean = 0, worst = 0;
};

Totals totals(const std::vector<FidelityRow>& rows, const std::vector<double>& predicted,
              bool held) {
  Totals t;
  std::vector<bool> use(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    use[i] = rows[i].holdout == held;
    if (!use[i]) continue;
    ++t.rows;
    const double e = abs_error(rows[i], predicted[i]);
    t.worst = std::max(t.worst, e);
    t.within10 += e <= 0.10;
    t.within15 += e <= 0.15;
  }
  if (t.rows > 0) t.mean = mean_abs_error(rows, use, predicted);
  return t;
}

void print_summary(const std::vector<FidelityRow>& rows, const std::vector<double>& predicted,
                   std::ostream& out) {
  print_stats_table("series", series_stats(rows, predicted), "", true, out);
  for (const bool held : {false, true}) {
    const Totals t = totals(rows, predicted, held);
    if (t.rows == 0) continue;
    out << (held ? "held out" : "suite (fitted sources)") << ": " << t.rows
        << " rows, mean |error| " << percent(t.mean) << ", max " << percent(t.worst)
        << ", within 10%: " << t.within10 << ", within 15%: " << t.within15 << "\n";
  }
  out << "\n";
  for (const bool held : {false, true})
    print_stats_table("kind", kind_stats(rows, predicted, held), held ? " (held out)" : "", !held,
                      out);
}

// Every published run ran, so its plan fit its GPUs: a row whose predicted peak is above the
// device's memory is an error of the memory model, named here.
void print_memory(const std::vector<FidelityRow>& rows, std::ostream& out) {
  std::size_t known = 0, fit = 0;
  std::string over;
  for (const FidelityRow& r : rows) {
    if (r.capacity_bytes <= 0) continue;
    ++known;
    if (r.peak_memory_bytes <= r.capacity_bytes) {
      ++fit;
      continue;
    }
    over += "\n  " + r.name + ": " + human_bytes(r.peak_memory_bytes) + " of " +
            human_bytes(r.capacity_bytes);
  }
  out << "memory: " << fit << " of " << known
      << " published plans predicted to fit their GPUs (every one ran)"
      << (over.empty() ? "" : "; predicted over capacity:") << over << "\n";
}

// The figures by kind (or by series) as the Markdown tables docs/FIDELITY.md holds
// (scripts/docs-tables.sh writes them there): a line per kind of the suite, then of the held-out
// rows (per series: a line per series, a held-out series named so), then the totals.
void print_markdown(const std::vector<FidelityRow>& rows, const std::vector<double>& predicted,
                    bool by_series, std::ostream& out) {
  const std::map<std::string, std::string> names = {{"dense", "dense"},
                                                    {"moe", "MoE"},
                                                    {"fsdp", "FSDP"},
                                                    {"fp8", "FP8"},
                                                    {"multimodal", "multimodal"}};
  const auto line = [&](const SeriesStats& k, bool held) {
    char rho[16] = "-";
    if (!std::isnan(k.spearman)) std::snprintf(rho, sizeof rho, "%.2f", k.spearman);
    const auto name = names.find(k.series);
    out << "| " << (!by_series && name != names.end() ? name->second : k.series)
        << (held ? ", held out" : "") << " | " << k.rows << " | " << percent(k.mean_abs_error)
        << " | " << percent(k.max_abs_error) << " | " << rho << " |\n";
  };
  out << "| " << (by_series ? "series" : "kind")
      << " | rows | mean \\|error\\| | max \\|error\\| | Spearman |\n";
  out << "|---|---|---|---|---|\n";
  // A series with rows on both sides (some held out) gets a line for each side.
  for (const bool held : {false, true})
    for (const SeriesStats& k :
         by_series ? series_stats(rows, predicted, held) : kind_stats(rows, predicted, held))
      line(k, held);
  for (const bool held : {false, true}) {
    const Totals t = totals(rows, predicted, held);
    if (t.rows == 0) continue;
    out << "| **" << (held ? "held out" : "suite") << " (" << t.rows << " rows)** | | **"
        << percent(t.mean) << "** | **" << percent(t.worst) << "** | within ±10%: " << t.within10
        << ", ±15%: " << t.within15 << " |\n";
  }
}

// Every row as a Markdown table (--markdown --rows): published and predicted step, signed error.
void print_markdown_rows(const std::vector<FidelityRow>& rows, const std::vector<double>& predicted,
                         std::ostream& out) {
  out << "| row | published | predicted | error |\n|---|---|---|---|\n";
  char cell[64];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const FidelityRow& r = rows[i];
    out << "| " << r.name << (r.holdout ? " (held out)" : "") << " | ";
    std::snprintf(cell, sizeof cell, "%#.4g s", r.published_s);
    out << cell << " | ";
    if (predicted[i] <= 0) {
      out << "failed | |\n";
      continue;
    }
    const double error = 100 * (predicted[i] - r.published_s) / r.published_s;
    std::snprintf(cell, sizeof cell, "%#.4g s | %s%.1f%%", predicted[i], error < 0 ? "\u2212" : "+",
                  std::fabs(error));
    out << cell << " |\n";
  }
}

// Leave-one-source-out as a Markdown table: each source predicted by a fit on all the others,
// then all the sources' rows together.
void print_markdown_folds(const std::vector<FidelityRow>& rows, const TuningGrid& grid,
                          std::ostream& out) {
  out << "| source left out | rows | mean \\|error\\| | fit on the others |\n|---|---|---|---|\n";
  double sum = 0;
  std::size_t n = 0;
  for (const SourceFold& f : leave_one_source_out(rows, grid)) {
    out << "| " << f.source_id << " | " << f.rows.size() << " | " << percent(f.mean_abs_error)
        << " | " << fit_text(grid, f.fit) << " |\n";
    sum += f.mean_abs_error * static_cast<double>(f.rows.size());
    n += f.rows.size();
  }
  out << "| **all** | " << n << " | **" << percent(n > 0 ? sum / static_cast<double>(n) : 0)
      << "** | (a device left without rows keeps scale 1) |\n";
}

}  // namespace

int run_fidelity(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera fidelity",
      "Compares the cost model's predicted step time (the in-order evaluator, as `tessera "
      "estimate`) with published training runs: scenarios with a `published` block. Prints "
      "every row's error, per series the mean and max |error| and the Spearman correlation of "
      "per-GPU throughput, the totals of the fitted sources and of the held-out rows, and the rows "
      "whose plan the memory model puts above their GPUs' memory (each of them ran). With "
      "--fit, also fits the kernel model's global parameters (GEMM/attention efficiency scale, "
      "per-kernel launch) on the rows not held out, over a grid, and reports leave-one-source-out: "
      "each source predicted by a fit on all the others.");
  options.add_options()("scenarios", "scenario files with a published block",
                        cxxopts::value<std::vector<std::string>>())(
      "fit", "fit the global parameters; leave-one-source-out")(
      "max-gpus", "leave out rows of more GPUs (0: none left out)",
      cxxopts::value<int64_t>()->default_value("0"))(
      "markdown", "print only the figures by kind, as the Markdown table of docs/FIDELITY.md")(
      "rows", "with --markdown: every row instead (published, predicted, signed error)")(
      "series", "with --markdown: per series (one source's runs) instead of by kind");
  options.parse_positional({"scenarios"});
  options.positional_help("<scenario.json>...");
  int code = kOk;
  const auto result = parse(options, args, out, err, code);
  if (!result) return code;
  if (!result->count("scenarios")) {
    err << options.program() << ": give one or more scenario files with a published block\n";
    return kBadInput;
  }
  for (const char* flag : {"rows", "series"})
    if (result->count(flag) && !result->count("markdown")) {
      err << options.program() << ": --" << flag << " goes with --markdown\n";
      return kBadInput;
    }
  if (result->count("fit") && result->count("markdown")) {
    err << options.program() << ": --markdown goes without --fit (whose leave-one-source-out "
        << "table is Markdown already)\n";
    return kBadInput;
  }
  const int64_t max_gpus = (*result)["max-gpus"].as<int64_t>();
  const bool fit = result->count("fit") > 0;
  const std::size_t workers = std::max(1u, std::thread::hardware_concurrency());
  Diagnostics diag;
  std::vector<Scenario> scenarios;
  for (const std::string& file : (*result)["scenarios"].as<std::vector<std::string>>()) {
    auto s = load_scenario(file, diag);
    if (!s) continue;
    if (!s->published) diag.error(file, "published", "missing: not a published run");
    if (!s->plan) diag.error(file, "plan", "missing");
    if (s->published && s->plan) scenarios.push_back(std::move(*s));
  }
  if (!diag.ok()) return report_problems(diag, err);

  TuningGrid grid = default_tuning_grid();
  if (!fit) grid = {};

  std::vector<FidelityRow> rows;
  std::size_t skipped = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < scenarios.size(); ++i) {
    const Scenario& s = scenarios[i];
    const int64_t gpus = world_size(*s.plan, s.model);
    if (max_gpus > 0 && gpus > max_gpus) {
      ++skipped;
      continue;
    }
    FidelityRow row{s.name,
                    s.published->series,
                    s.published->source_id,
                    fit_key(s.cluster.device.fitted_as(), s.plan->framework),
                    s.published->holdout,
                    run_kind(s.model, *s.plan),
                    s.published->step_s,
                    0,
                    0,
                    {},
                    0,
                    0};
    // Lowered once: a frozen-aware split is chosen with the default costs, and a DIP plan runs
    // its default schedule, not one searched per grid point.
    const CostParams params = default_cost_params(s.cluster);
    const ParallelPlan plan = resolve_stage_split(*s.plan, s.model, s.workload, s.cluster, &params);
    // One Program per drawn iteration the published mean covers; the row's prediction is
    // their mean step.
    std::vector<Lowered> programs;
    std::string error;
    double model_flops = 0;
    for (int64_t it = 0; it < s.published->iterations && error.empty(); ++it) {
      // Identical ranks folded: the evaluator's times are exactly the full Program's.
      programs.push_back(lower(s.model, s.cluster, plan, s.workload, draw_batch(s.workload, it),
                               nullptr, RankFolding::kIdentical));
      error = programs.back().error;
      model_flops += programs.back().program.model_flops;
    }
    if (!error.empty()) {
      err << "fidelity: " << s.name << ": " << error << "\n";
      row.predicted_s.assign(grid.size(), 0);
    } else {
      for (const Lowered& lowered : programs)
        for (const RankMemory& m : memory_per_rank(lowered.program))
          row.peak_memory_bytes = std::max(row.peak_memory_bytes, m.total());
      row.capacity_bytes = memory_capacity_bytes(s.cluster, programs.front().program.world);
      row.flops_per_gpu =
          model_flops / static_cast<double>(programs.size()) / static_cast<double>(gpus);
      // The defaults, then every grid point with the device's training scale replaced by the
      // point's; on every core (evaluate() is pure).
      row.predicted_s.assign(grid.size(), 0);
      ClusterSpec unscaled = s.cluster;
      if (unscaled.device.kernels) {
        unscaled.device.kernels->training_scale = 1;
        if (unscaled.device.kernels->pytorch) unscaled.device.kernels->pytorch->training_scale = 1;
      }
      std::atomic<std::size_t> next{0};
      auto work = [&] {
        for (std::size_t p = next++; p <= grid.size(); p = next++) {
          double& slot = p == grid.size() ? row.default_s : row.predicted_s[p];
          CostParams c = params;
          if (p < grid.size()) c.kernel_tuning = {grid.scale_at(p), grid.launch_at(p)};
          const ClusterSpec& cluster = p < grid.size() ? unscaled : s.cluster;
          const CostModel cost(cluster, s.model.dtype, c, s.model);
          double sum = 0;
          for (const Lowered& lowered : programs) {
            const Timeline t = evaluate(lowered.program, cost);
            if (!t.error.empty()) {
              sum = 0;
              break;
            }
            sum += t.step_s;
          }
          slot = sum / static_cast<double>(programs.size());
        }
      };
      std::vector<std::thread> threads;
      for (unsigned t = 1; t < std::min<std::size_t>(workers, grid.size() + 1); ++t)
        threads.emplace_back(work);
      work();
      for (std::thread& t : threads) t.join();
    }
    rows.push_back(std::move(row));
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    err << "fidelity: [" << i + 1 << "/" << scenarios.size() << "] " << s.name << " (" << gpus
        << " GPUs), " << grid.size() + 1 << " evaluation" << (grid.size() == 0 ? "" : "s") << ", "
        << static_cast<int>(elapsed) << " s so far\n";
  }
  if (rows.empty()) {
    err << options.program() << ": every row has more than --max-gpus GPUs\n";
    return kBadInput;
  }
  const std::vector<double> at_defaults = default_predictions(rows);
  if (result->count("markdown")) {
    if (result->count("rows"))
      print_markdown_rows(rows, at_defaults, out);
    else
      print_markdown(rows, at_defaults, result->count("series") > 0, out);
    return kOk;
  }
  if (skipped > 0) out << skipped << " rows of more than " << max_gpus << " GPUs left out\n";

  const KernelTuning defaults;
  out << "== the model's defaults: launch " << defaults.launch_s * 1e6
      << " us, each device's training_scale from its file ==\n";
  print_rows(rows, at_defaults, out);
  out << "\n";
  print_summary(rows, at_defaults, out);
  out << "\n";
  print_memory(rows, out);
  if (!fit) return kOk;

  std::vector<bool> suite(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) suite[i] = !rows[i].holdout;
  const TuningFit best = fit_tuning(rows, suite, grid);
  out << "\n== fitted on the suite (every row not held out): " << fit_text(grid, best) << " ==\n";
  const std::vector<double> fitted = fitted_predictions(rows, grid, best);
  print_rows(rows, fitted, out);
  out << "\n";
  print_summary(rows, fitted, out);
  out << "\n== leave one source out: each source predicted by a fit on all the others ==\n";
  print_markdown_folds(rows, grid, out);
  return kOk;
}

}  // namespace tessera::sim

#include "shared/records/calibrate.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include <Eigen/Dense>

#include "shared/base/check.hpp"

namespace tessera {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// FitStats::residual of a fit with `squared_error` over the samples `ys`: RMS error over the mean
// sample (single ops are noisy on a shared machine).
double residual(double squared_error, const std::vector<double>& ys) {
  double sy = 0;
  for (double y : ys) sy += y;
  const auto n = static_cast<double>(ys.size());
  return std::sqrt(std::max(0.0, squared_error) / n) / std::max(sy / n, 1e-12);
}

struct Fit {
  std::vector<double> coef;  // one per regressor column
  FitStats stats;
  bool separable = true;  // the first size regressor took more than one value
};

// Least squares with non-negative coefficients: seconds = Σ coef_j · column_j. Minimizes the
// squared error (so the fitted class's total time equals the measured total, which is what a
// step time adds up); among the column subsets whose unconstrained fit is non-negative, the one
// with the least error (an exact NNLS for the two or three columns used here).
Fit fit_columns(const std::vector<std::vector<double>>& columns, const std::vector<double>& ys) {
  const std::size_t n = ys.size(), k = columns.size();
  Fit fit;
  fit.coef.assign(k, 0);
  fit.stats.samples = static_cast<int64_t>(n);
  const std::vector<double>& size = columns.size() > 1 ? columns[1] : columns[0];
  fit.stats.min_x = *std::min_element(size.begin(), size.end());
  fit.stats.max_x = *std::max_element(size.begin(), size.end());
  fit.separable = fit.stats.max_x > fit.stats.min_x * 1.05;
  // Subsets that fit equally well (to 1e-10 of the signal) keep the earliest: fixed cost and
  // FLOP rate before the columns that refine them, when the data cannot tell them apart.
  double signal = 0;
  for (double y : ys) signal += y * y;
  const double tie = 1e-10 * signal;
  double best = -1;
  for (unsigned mask = 1; mask < (1u << k); ++mask) {
    std::vector<std::size_t> used;
    for (std::size_t j = 0; j < k; ++j)
      if (mask & (1u << j)) used.push_back(j);
    if (used.size() > n) continue;
    Eigen::MatrixXd m(static_cast<Eigen::Index>(n), static_cast<Eigen::Index>(used.size()));
    Eigen::VectorXd v(static_cast<Eigen::Index>(n));
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t c = 0; c < used.size(); ++c)
        m(static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)) = columns[used[c]][r];
      v(static_cast<Eigen::Index>(r)) = ys[r];
    }
    const Eigen::VectorXd x = m.colPivHouseholderQr().solve(v);
    if ((x.array() < 0).any() || !x.allFinite()) continue;
    const double error = (m * x - v).squaredNorm();
    if (best < 0 || error < best - tie) {
      best = error;
      fit.coef.assign(k, 0);
      for (std::size_t c = 0; c < used.size(); ++c)
        fit.coef[used[c]] = x(static_cast<Eigen::Index>(c));
    }
  }
  fit.stats.residual = residual(best, ys);
  return fit;
}

// Each sample's seconds under `coef` (Σ coef_j · column_j), at least floor · layers.
std::vector<double> fitted_values(const std::vector<std::vector<double>>& columns,
                                  const std::vector<double>& coef, double floor,
                                  const std::vector<double>& layers) {
  std::vector<double> out(columns[0].size(), 0);
  for (std::size_t r = 0; r < out.size(); ++r) {
    for (std::size_t j = 0; j < coef.size(); ++j) out[r] += coef[j] * columns[j][r];
    out[r] = std::max(out[r], host_floor_s(floor, layers[r]));
  }
  return out;
}

double squared_error(const std::vector<double>& fitted, const std::vector<double>& ys) {
  double e = 0;
  for (std::size_t r = 0; r < ys.size(); ++r) e += (fitted[r] - ys[r]) * (fitted[r] - ys[r]);
  return e;
}

// fit_columns under a host floor (ComputeFit::host_seconds_per_layer): seconds =
// max(Σ coef_j · column_j, floor · layers). Each sample's seconds per layer is tried as the
// floor, the columns fitted on the samples above it; the floor is kept where it removes at least
// a tenth of the squared error (a GPU waiting for its host at small micro-batches, not noise).
Fit fit_with_floor(const std::vector<std::vector<double>>& columns, const std::vector<double>& ys,
                   const std::vector<double>& layers, double& floor) {
  const Fit linear_fit = fit_columns(columns, ys);
  Fit best = linear_fit;
  floor = 0;
  const double linear = squared_error(fitted_values(columns, best.coef, 0, layers), ys);
  double least = linear;
  const std::size_t n = ys.size();
  std::vector<double> per_layer(n);
  for (std::size_t r = 0; r < n; ++r) per_layer[r] = ys[r] / host_floor_s(1, layers[r]);
  for (double h : per_layer) {
    std::vector<std::vector<double>> above(columns.size());
    std::vector<double> above_y;
    for (std::size_t r = 0; r < n; ++r)
      if (per_layer[r] > h) {
        for (std::size_t j = 0; j < columns.size(); ++j) above[j].push_back(columns[j][r]);
        above_y.push_back(ys[r]);
      }
    if (above_y.size() < 3) continue;  // a floor under which nearly everything sits
    Fit f = fit_columns(above, above_y);
    const double error = squared_error(fitted_values(columns, f.coef, h, layers), ys);
    if (error < least) {
      least = error;
      best.coef = f.coef;
      floor = h;
    }
  }
  double signal = 0;
  for (double y : ys) signal += y * y;
  if (least > 0.9 * linear || linear - least <= 1e-10 * signal) {
    floor = 0;
    return linear_fit;
  }
  best.stats.residual = residual(least, ys);
  return best;
}

// Quantiles of measured / fitted over every instance, scaled to mean 1 (FitStats::spread).
std::vector<double> spread_of(const std::vector<double>& fitted,
                              const std::vector<std::vector<double>>& raw) {
  constexpr std::size_t kQuantiles = 16;
  std::vector<double> ratios;
  for (std::size_t r = 0; r < raw.size(); ++r)
    if (fitted[r] > 0)
      for (double v : raw[r]) ratios.push_back(v / fitted[r]);
  if (ratios.size() < kQuantiles) return {};
  std::sort(ratios.begin(), ratios.end());
  std::vector<double> q;
  double sum = 0;
  for (std::size_t k = 0; k < kQuantiles; ++k) {
    const double pos =
        (static_cast<double>(k) + 0.5) / kQuantiles * static_cast<double>(ratios.size() - 1);
    const auto lo = static_cast<std::size_t>(pos);
    const std::size_t hi = std::min(lo + 1, ratios.size() - 1);
    q.push_back(ratios[lo] + (ratios[hi] - ratios[lo]) * (pos - static_cast<double>(lo)));
    sum += q.back();
  }
  if (sum <= 0) return {};
  for (double& v : q) v *= static_cast<double>(kQuantiles) / sum;
  return q;
}

}  // namespace

Profile calibrate(const std::vector<CalibrationRun>& runs, const CalibrateOptions& options) {
  TESSERA_CHECK(!runs.empty());
  Profile profile;
  const RunRecord& first = runs.front().run;
  profile.cluster_kind = first.scenario.cluster.kind;
  profile.device = first.scenario.cluster.device.name;
  profile.cores = first.cores;
  profile.cpu = first.cpu;
  profile.warmup_iterations = options.warmup_iterations;
  // Medians over the warm iterations of each op of each run.
  // class, op, size, tokens·layers, logits, nested calls, layers
  using Key = std::tuple<OpClass, std::string, double, double, double, double, double>;
  std::map<Key, std::vector<double>> samples, overlaps;
  int64_t used = 0;
  for (const CalibrationRun& c : runs) {
    profile.runs.push_back(c.run.dir);
    for (std::size_t k = static_cast<std::size_t>(options.warmup_iterations); k < c.traced.size();
         ++k) {
      ++used;
      for (const OpMeasure& m : measure_ops(c.traced[k].program, c.traced[k].timeline,
                                            c.run.scenario.model, c.run.scenario.cluster)) {
        const Key key{m.cls,   c.run.dir + "/" + m.op, m.x, m.token_layers, m.logits, m.calls,
                      m.layers};
        samples[key].push_back(m.seconds);
        overlaps[key].push_back(m.overlap);
      }
    }
  }
  if (used == 0)
    profile.warnings.push_back("no traced iteration after the " +
                               std::to_string(options.warmup_iterations) +
                               " warm-up iterations: nothing was fitted");
  // Per class: the regressors (1, size[, tokens·layers]) and the seconds of each sample.
  struct Samples {
    std::vector<double> x, token_layers, logits, calls, layers, y;
    std::vector<double> overlap;           // share of each sample's time beside collectives
    std::vector<std::vector<double>> raw;  // every measured instance behind each median
    void add(double size, double tl, double lg, double nc, double ly, double seconds,
             const std::vector<double>& all, double beside = 0) {
      overlap.push_back(beside);
      x.push_back(size);
      token_layers.push_back(tl);
      logits.push_back(lg);
      calls.push_back(nc);
      layers.push_back(ly);
      y.push_back(seconds);
      raw.push_back(all);
    }
  };
  std::map<OpClass, Samples> by_class, overlapped;
  for (const auto& [key, values] : samples) {
    const auto& [cls, op, x, tl, lg, nc, ly] = key;
    const double y = median(values);
    if (y <= 0) continue;
    // Compute that ran alongside its rank's collectives is kept apart (the slowdown below).
    if (cls.type == OpClass::Type::kCompute && median(overlaps[key]) > 0.5)
      overlapped[cls].add(x, tl, lg, nc, ly, y, values, median(overlaps[key]));
    else
      by_class[cls].add(x, tl, lg, nc, ly, y, values);
  }
  for (auto& [cls, o] : overlapped)
    if (by_class[cls].y.size() < 3) {  // too few quiet samples: fit on all of them
      for (std::size_t k = 0; k < o.y.size(); ++k)
        by_class[cls].add(o.x[k], o.token_layers[k], o.logits[k], o.calls[k], o.layers[k], o.y[k],
                          o.raw[k]);
      o = {};
    }
  std::vector<ComputeFit> compute;
  for (const auto& [cls, d] : by_class) {
    if (d.y.empty()) continue;
    std::vector<std::vector<double>> columns{std::vector<double>(d.y.size(), 1.0), d.x};
    if (cls.type == OpClass::Type::kCompute) {
      columns.push_back(d.token_layers);
      columns.push_back(d.logits);
      columns.push_back(d.calls);
      columns.push_back(d.layers);
    }
    double floor = 0;
    Fit fit = cls.type == OpClass::Type::kCompute ? fit_with_floor(columns, d.y, d.layers, floor)
                                                  : fit_columns(columns, d.y);
    fit.stats.spread = spread_of(fitted_values(columns, fit.coef, floor, d.layers), d.raw);
    const std::string name = class_name(cls);
    if (fit.stats.samples < 3)
      profile.warnings.push_back(name + ": " + std::to_string(fit.stats.samples) +
                                 " samples, too few for a reliable fit");
    else if (!fit.separable)
      profile.warnings.push_back(name + ": one size measured, fixed cost and rate not separable");
    if (fit.stats.residual > 0.5)
      profile.warnings.push_back(name + ": residual " +
                                 std::to_string(static_cast<int>(fit.stats.residual * 100)) +
                                 "% of the mean sample (noisy, or not fixed cost + rate)");
    const double a = fit.coef[0], b = fit.coef[1];
    switch (cls.type) {
      case OpClass::Type::kCompute:
        profile.compute.push_back({cls.role, cls.phase, cls.size, a, b, fit.coef[2], fit.coef[3],
                                   fit.coef[4], fit.coef[5], floor, fit.stats});
        break;
      case OpClass::Type::kCollective: {
        LinkFit f;
        f.kind = cls.kind;
        f.group_size = cls.group_size;
        f.local = cls.local;
        const double steps = latency_steps(cls.kind, cls.group_size);
        f.latency_s = steps > 0 ? a / steps : 0;
        f.bandwidth_bytes_per_s = b > 0 ? bus_factor(cls.kind, cls.group_size) / b : 1e18;
        f.stats = fit.stats;
        profile.collectives.push_back(f);
        break;
      }
      case OpClass::Type::kP2p: {
        LinkFit f;
        f.local = cls.local;
        f.latency_s = a;
        f.bandwidth_bytes_per_s = b > 0 ? 1 / b : 1e18;
        f.stats = fit.stats;
        profile.p2p.push_back(f);
        break;
      }
      case OpClass::Type::kOptimizer:
        profile.optimizer = OptimizerFit{a, b > 0 ? 1 / b : 1e18, fit.stats};
        break;
    }
  }
  // The slowdown of compute beside collectives (overlap_slowdown.hpp): a sample whose quiet fit
  // is q ran y = r * q seconds, a share u of them beside its rank's collectives. It ran c seconds
  // beside them before the slowdown, (s - 1) * c more after it, of which the share u beside them
  // too: u * y = c * (1 + u * (s - 1)). Then s = 1 + (r - 1) / u (exact when the collectives
  // cover the whole op).
  std::vector<double> ratios;
  for (const auto& [cls, o] : overlapped)
    for (const ComputeFit& f : profile.compute)
      if (f.role == cls.role && f.phase == cls.phase && f.size == cls.size)
        for (std::size_t k = 0; k < o.y.size(); ++k)
          ratios.push_back(1 +
                           (o.y[k] / fitted_compute_s(f, {o.x[k], o.token_layers[k], o.logits[k],
                                                          o.calls[k], o.layers[k]}) -
                            1) /
                               o.overlap[k]);
  profile.overlap_stats.samples = static_cast<int64_t>(ratios.size());
  if (!ratios.empty()) {
    profile.overlap_slowdown = std::max(1.0, median(ratios));
    double sq = 0;
    for (double r : ratios) sq += (r - profile.overlap_slowdown) * (r - profile.overlap_slowdown);
    profile.overlap_stats.residual =
        std::sqrt(sq / static_cast<double>(ratios.size())) / profile.overlap_slowdown;
    profile.overlap_stats.min_x = *std::min_element(ratios.begin(), ratios.end());
    profile.overlap_stats.max_x = *std::max_element(ratios.begin(), ratios.end());
  }
  if (const ClusterSpec* target = options.target) {
    if (target->device.name != profile.device)
      profile.warnings.push_back("the target cluster's device \"" + target->device.name +
                                 "\" is not the measured \"" + profile.device +
                                 "\": its compute keeps the analytic defaults");
    const bool inter = std::any_of(profile.collectives.begin(), profile.collectives.end(),
                                   [](const LinkFit& f) { return !f.local; });
    if (target->kind == ClusterKind::kGpu && target->nodes > 1 && !inter)
      profile.warnings.push_back(
          "only intra-node communication was measured: collectives across "
          "the node boundary of \"" +
          target->name + "\" keep the analytic defaults");
    int64_t largest = 0;
    for (const LinkFit& f : profile.collectives) largest = std::max(largest, f.group_size);
    const int64_t devices = device_count(*target);
    if (devices > largest && largest > 0)
      profile.warnings.push_back("collectives were measured on groups of up to " +
                                 std::to_string(largest) + " ranks; larger groups on \"" +
                                 target->name + "\" (" + std::to_string(devices) +
                                 " devices) extrapolate the latency and bus bandwidth");
  }
  return profile;
}

std::optional<CalibrationRun> load_calibration_run(const std::string& dir, bool traces_required,
                                                   Diagnostics& diag) {
  std::optional<RunRecord> run = load_run(dir, diag);
  if (!run) return std::nullopt;
  CalibrationRun c{std::move(*run), {}};
  const bool traced = std::filesystem::exists(std::filesystem::path(dir) / "trace" / "rank0.json");
  if (!traced && !traces_required) return c;
  auto traces = load_traces(c.run, diag);
  if (!traces) return std::nullopt;
  c.traced = std::move(*traces);
  return c;
}

}  // namespace tessera

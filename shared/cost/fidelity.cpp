#include "shared/cost/fidelity.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tessera {

TuningGrid default_tuning_grid() {
  TuningGrid g;
  for (int i = 0; i <= 15; ++i) g.scale.push_back(i == 13 ? 1.0 : 0.74 + 0.02 * i);
  for (int i = 0; i <= 4; ++i) g.launch_s.push_back(2e-6 * i);
  return g;
}

namespace {

std::size_t unit_scale(const TuningGrid& grid) {
  for (std::size_t i = 0; i < grid.scale.size(); ++i)
    if (grid.scale[i] == 1.0) return i;
  return 0;
}

std::vector<double> ranks(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    double below = 0, equal = 0;
    for (double x : v) {
      below += x < v[i];
      equal += x == v[i];
    }
    r[i] = below + (equal + 1) / 2;
  }
  return r;
}

}  // namespace

double abs_error(const FidelityRow& row, double predicted_s) {
  return predicted_s > 0 ? std::abs(predicted_s - row.published_s) / row.published_s : 1.0;
}

TuningFit fit_tuning(const std::vector<FidelityRow>& rows, const std::vector<bool>& use,
                     const TuningGrid& grid) {
  TuningFit best;
  double least = std::numeric_limits<double>::infinity();
  for (std::size_t l = 0; l < grid.launch_s.size(); ++l) {
    // Given the launch cost, each device's scale only moves its own rows: fit them apart.
    TuningFit fit;
    fit.launch_index = l;
    double total = 0;
    for (std::size_t i = 0; i < rows.size(); ++i)
      if (use[i]) ++fit.rows[rows[i].device];
    for (const auto& [device, count] : fit.rows) {
      double device_least = std::numeric_limits<double>::infinity();
      for (std::size_t s = 0; s < grid.scale.size(); ++s) {
        double sum = 0;
        for (std::size_t i = 0; i < rows.size(); ++i)
          if (use[i] && rows[i].device == device)
            sum += abs_error(rows[i], rows[i].predicted_s[grid.point(s, l)]);
        if (sum < device_least) {
          device_least = sum;
          fit.scale_index[device] = s;
        }
      }
      total += device_least;
    }
    if (total < least) {
      least = total;
      best = fit;
    }
  }
  return best;
}

std::vector<double> fitted_predictions(const std::vector<FidelityRow>& rows, const TuningGrid& grid,
                                       const TuningFit& fit) {
  std::vector<double> out;
  for (const FidelityRow& r : rows) {
    const auto it = fit.scale_index.find(r.device);
    const std::size_t s = it != fit.scale_index.end() ? it->second : unit_scale(grid);
    out.push_back(r.predicted_s[grid.point(s, fit.launch_index)]);
  }
  return out;
}

std::vector<double> default_predictions(const std::vector<FidelityRow>& rows) {
  std::vector<double> out;
  for (const FidelityRow& r : rows) out.push_back(r.default_s);
  return out;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  if (n == 0) return 0;
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  double ma = 0, mb = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ma += ra[i] / static_cast<double>(n);
    mb += rb[i] / static_cast<double>(n);
  }
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < n; ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

double mean_abs_error(const std::vector<FidelityRow>& rows, const std::vector<bool>& use,
                      const std::vector<double>& predicted_s) {
  double sum = 0;
  std::size_t n = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!use[i]) continue;
    ++n;
    sum += abs_error(rows[i], predicted_s[i]);
  }
  return n > 0 ? sum / static_cast<double>(n) : 0;
}

std::vector<SourceFold> leave_one_source_out(const std::vector<FidelityRow>& rows,
                                             const TuningGrid& grid) {
  std::vector<SourceFold> folds;
  for (const FidelityRow& r : rows) {
    if (r.holdout) continue;
    if (std::none_of(folds.begin(), folds.end(),
                     [&](const SourceFold& f) { return f.source_id == r.source_id; }))
      folds.push_back({r.source_id, {}, {}, 0});
  }
  for (SourceFold& f : folds) {
    std::vector<bool> train(rows.size()), test(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      train[i] = !rows[i].holdout && rows[i].source_id != f.source_id;
      test[i] = !rows[i].holdout && rows[i].source_id == f.source_id;
      if (test[i]) f.rows.push_back(i);
    }
    f.fit = fit_tuning(rows, train, grid);
    f.mean_abs_error = mean_abs_error(rows, test, fitted_predictions(rows, grid, f.fit));
  }
  return folds;
}

namespace {

// Per value of `key` over the rows `use` selects, in order of first appearance.
template <typename Key, typename Use>
std::vector<SeriesStats> grouped_stats(const std::vector<FidelityRow>& rows,
                                       const std::vector<double>& predicted_s, Key key, Use use) {
  std::vector<SeriesStats> out;
  for (const FidelityRow& r : rows)
    if (use(r) && std::none_of(out.begin(), out.end(),
                               [&](const SeriesStats& s) { return s.series == key(r); }))
      out.push_back({key(r)});
  for (SeriesStats& s : out) {
    std::vector<double> predicted, published;
    double sum = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const FidelityRow& r = rows[i];
      if (!use(r) || key(r) != s.series) continue;
      ++s.rows;
      const double e = abs_error(r, predicted_s[i]);
      sum += e;
      s.max_abs_error = std::max(s.max_abs_error, e);
      if (predicted_s[i] > 0) {
        predicted.push_back(r.flops_per_gpu / predicted_s[i]);
        published.push_back(r.flops_per_gpu / r.published_s);
      }
    }
    s.mean_abs_error = sum / static_cast<double>(s.rows);
    s.spearman = predicted.size() >= 3 ? spearman(predicted, published)
                                       : std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

}  // namespace

std::vector<SeriesStats> series_stats(const std::vector<FidelityRow>& rows,
                                      const std::vector<double>& predicted_s) {
  return grouped_stats(
      rows, predicted_s, [](const FidelityRow& r) { return r.series; },
      [](const FidelityRow&) { return true; });
}

std::vector<SeriesStats> series_stats(const std::vector<FidelityRow>& rows,
                                      const std::vector<double>& predicted_s, bool holdout) {
  return grouped_stats(
      rows, predicted_s, [](const FidelityRow& r) { return r.series; },
      [&](const FidelityRow& r) { return r.holdout == holdout; });
}

std::vector<SeriesStats> kind_stats(const std::vector<FidelityRow>& rows,
                                    const std::vector<double>& predicted_s, bool holdout) {
  return grouped_stats(
      rows, predicted_s, [](const FidelityRow& r) { return r.kind; },
      [&](const FidelityRow& r) { return r.holdout == holdout; });
}

}  // namespace tessera

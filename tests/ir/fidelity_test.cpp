// The published-runs comparison: Spearman, the per-device fit of the kernel model's global
// parameters over a grid, leave-one-source-out and the per-series statistics.
#include <cmath>

#include <doctest/doctest.h>

#include "shared/cost/fidelity.hpp"

using namespace tessera;

namespace {

// A grid of scales {0.8, 1.0} × launches {0, 1e-6}; a row whose prediction at scale s and launch
// l is base / s + l · 1e5 (a faster kernel rate, a shorter step).
TuningGrid small_grid() {
  return {{0.8, 1.0}, {0.0, 1e-6}};
}

FidelityRow row(const std::string& name, const std::string& source, const std::string& device,
                double published, double base, bool holdout = false) {
  FidelityRow r{
      name, "series-" + source, source, device, holdout, "dense", published, 1e15, base, {}, 0, 0};
  const TuningGrid g = small_grid();
  for (std::size_t p = 0; p < g.size(); ++p)
    r.predicted_s.push_back(base / g.scale_at(p) + g.launch_at(p) * 1e5);
  return r;
}

}  // namespace

TEST_CASE("spearman: 1 for the same order, -1 reversed, ties averaged") {
  CHECK(spearman({1, 2, 3, 4}, {10, 20, 30, 40}) == doctest::Approx(1));
  CHECK(spearman({1, 2, 3, 4}, {4, 3, 2, 1}) == doctest::Approx(-1));
  CHECK(spearman({1, 2, 3}, {5, 5, 5}) == 0);
  CHECK(spearman({1, 2, 3, 4}, {1, 3, 2, 4}) == doctest::Approx(0.8));
}

TEST_CASE("the fit picks each device's scale on its own rows and one launch cost for all") {
  // A100 rows are right at scale 0.8 (predicted base/0.8 = published), H100 rows at scale 1.
  std::vector<FidelityRow> rows = {
      row("a", "s1", "A100", 1.25, 1.0), row("b", "s2", "A100", 2.5, 2.0),
      row("c", "s3", "H100", 3.0, 3.0), row("held", "s4", "A100", 10.0, 1.0, true)};
  const TuningGrid g = small_grid();
  std::vector<bool> use = {true, true, true, false};
  const TuningFit fit = fit_tuning(rows, use, g);
  CHECK(fit.launch_index == 0);
  CHECK(g.scale[fit.scale_index.at("A100")] == 0.8);
  CHECK(g.scale[fit.scale_index.at("H100")] == 1.0);
  CHECK(fit.rows.at("A100") == 2);  // the held-out row is not fitted on
  const std::vector<double> p = fitted_predictions(rows, g, fit);
  CHECK(p[0] == doctest::Approx(1.25));
  CHECK(mean_abs_error(rows, use, p) == doctest::Approx(0));
  // The held-out row is predicted with the fit but was never part of it: 87.5% off.
  CHECK(abs_error(rows[3], p[3]) == doctest::Approx(0.875));
}

TEST_CASE("leave one source out: a device without other rows keeps scale 1") {
  std::vector<FidelityRow> rows = {row("a", "s1", "A100", 1.25, 1.0),
                                   row("b", "s2", "A100", 2.5, 2.0),
                                   row("c", "s3", "H100", 2.4, 3.0)};
  const TuningGrid g = small_grid();
  const std::vector<SourceFold> folds = leave_one_source_out(rows, g);
  REQUIRE(folds.size() == 3);
  // s1 is predicted by the A100 scale fitted on s2 alone: exact.
  CHECK(folds[0].source_id == "s1");
  CHECK(folds[0].mean_abs_error == doctest::Approx(0));
  // s3 is the only H100 source: without it the H100 scale stays 1 (3.0 s vs 2.4 s published),
  // although a fit on it would have chosen 0.8 — it is never seen.
  CHECK(folds[2].fit.scale_index.count("H100") == 0);
  CHECK(folds[2].mean_abs_error == doctest::Approx(0.25));
}

TEST_CASE("series statistics: mean and max |error|, Spearman from three rows") {
  std::vector<FidelityRow> rows = {row("a", "s", "A100", 1.0, 1.0), row("b", "s", "A100", 2.0, 2.2),
                                   row("c", "s", "A100", 4.0, 3.6),
                                   row("d", "t", "A100", 1.0, 0.5)};
  const std::vector<double> p = default_predictions(rows);
  const std::vector<SeriesStats> s = series_stats(rows, p);
  REQUIRE(s.size() == 2);
  CHECK(s[0].rows == 3);
  CHECK(s[0].mean_abs_error == doctest::Approx((0 + 0.1 + 0.1) / 3));
  CHECK(s[0].max_abs_error == doctest::Approx(0.1));
  CHECK(s[0].spearman == doctest::Approx(1));
  CHECK(std::isnan(s[1].spearman));
  // Held-out rows apart: series "s" splits into its held-out row and the others.
  rows[1].holdout = true;
  const std::vector<SeriesStats> fitted = series_stats(rows, p, false);
  const std::vector<SeriesStats> held = series_stats(rows, p, true);
  REQUIRE(fitted.size() == 2);
  CHECK(fitted[0].rows == 2);
  CHECK(fitted[0].max_abs_error == doctest::Approx(0.1));
  REQUIRE(held.size() == 1);
  CHECK(held[0].series == "series-s");
  CHECK(held[0].rows == 1);
  CHECK(held[0].mean_abs_error == doctest::Approx(0.1));
  rows[1].holdout = false;
  // A row that could not be predicted counts as 100% off.
  rows[3].default_s = 0;
  CHECK(series_stats(rows, default_predictions(rows))[1].mean_abs_error == doctest::Approx(1));
}

// How predictions compare with published training runs, and the fit of the kernel model's
// global parameters to them: the per-kernel launch cost (one value) and, per device, the share
// of its microbenchmark GEMM and attention rates that kernels reach inside a training step
// (DeviceKernels::training_scale). Every row is predicted at every point of a grid once; a fit is
// then a choice of grid point per device, with one launch cost for all. Leave-one-source-out
// refits on all sources but one and predicts that one; a device left without rows keeps the
// microbenchmark rates (scale 1). Rows marked held out are never part of a fit.
// docs/FIDELITY.md.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "shared/cost/kernel_cost.hpp"

namespace tessera {

// One published run: its prediction at the model's defaults and at each point of a TuningGrid.
struct FidelityRow {
  std::string name;
  std::string series;     // ranked within it (Spearman)
  std::string source_id;  // leave-one-source-out folds by it
  std::string device;     // a fit scales each device's rates on its own (a PyTorch-native
                          // stack's apart: "<device>/pytorch")
  bool holdout = false;
  std::string kind;  // what the run trains and how (run_kind): the suite's figures by kind
  double published_s = 0;
  double flops_per_gpu = 0;         // model FLOPs of one step per GPU (throughput for ranking)
  double default_s = 0;             // at the model's defaults; <= 0: could not be predicted
  std::vector<double> predicted_s;  // per grid point, with training_scale replaced by it
  // The predicted peak memory of its busiest rank (over the drawn iterations) and what the device
  // holds: the published run ran, so a peak above it is an error of the memory model.
  double peak_memory_bytes = 0;
  double capacity_bytes = 0;
};

// The points a fit chooses among: training scale × launch_s, every combination.
struct TuningGrid {
  std::vector<double> scale;
  std::vector<double> launch_s;
  std::size_t size() const { return scale.size() * launch_s.size(); }
  std::size_t point(std::size_t scale_index, std::size_t launch_index) const {
    return scale_index * launch_s.size() + launch_index;
  }
  double scale_at(std::size_t point) const { return scale[point / launch_s.size()]; }
  double launch_at(std::size_t point) const { return launch_s[point % launch_s.size()]; }
};
// Scales 0.74-1.04 in steps of 0.02 (1 among them) × 0-8 µs in steps of 2 µs.
TuningGrid default_tuning_grid();

// A fitted choice: one launch cost, a scale per device.
struct TuningFit {
  std::size_t launch_index = 0;
  std::map<std::string, std::size_t> scale_index;  // devices without an entry: scale 1
  std::map<std::string, std::size_t> rows;         // per device, the rows fitted on
};
// The fit of least mean |relative error| over the rows `use` selects (rows not predicted count
// as 100% off; ties: the earlier grid value).
TuningFit fit_tuning(const std::vector<FidelityRow>& rows, const std::vector<bool>& use,
                     const TuningGrid& grid);
// Each row's predicted step under `fit`.
std::vector<double> fitted_predictions(const std::vector<FidelityRow>& rows, const TuningGrid& grid,
                                       const TuningFit& fit);
std::vector<double> default_predictions(const std::vector<FidelityRow>& rows);

// Spearman rank correlation (average ranks for ties); 0 when either side is constant.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

// Relative error of a prediction (1 = 100% off for a row not predicted).
double abs_error(const FidelityRow& row, double predicted_s);
// Mean |relative error| over the rows `use` selects; 0 for none.
double mean_abs_error(const std::vector<FidelityRow>& rows, const std::vector<bool>& use,
                      const std::vector<double>& predicted_s);

struct SourceFold {
  std::string source_id;
  TuningFit fit;                  // on every other source's rows
  std::vector<std::size_t> rows;  // the source's rows
  double mean_abs_error = 0;      // over them, predicted with `fit`
};
// One fold per source of the non-held-out rows, in order of first appearance.
std::vector<SourceFold> leave_one_source_out(const std::vector<FidelityRow>& rows,
                                             const TuningGrid& grid);

struct SeriesStats {
  std::string series;  // or the kind, for kind_stats
  std::size_t rows = 0;
  double mean_abs_error = 0, max_abs_error = 0;
  double spearman = 0;  // of per-GPU throughput, predicted vs published; NaN under 3 rows
};
// Per series, in order of first appearance.
std::vector<SeriesStats> series_stats(const std::vector<FidelityRow>& rows,
                                      const std::vector<double>& predicted_s);
// The same over the held-out rows only when `holdout`, else over the others.
std::vector<SeriesStats> series_stats(const std::vector<FidelityRow>& rows,
                                      const std::vector<double>& predicted_s, bool holdout);
// The same per kind (FidelityRow::kind), held-out rows apart from the others when `holdout`.
std::vector<SeriesStats> kind_stats(const std::vector<FidelityRow>& rows,
                                    const std::vector<double>& predicted_s, bool holdout);

}  // namespace tessera

#include "sim/replay.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "shared/base/json_reader.hpp"
#include "shared/records/op_measure.hpp"
#include "shared/records/trace_writer.hpp"
#include "shared/search/step_picture.hpp"
#include "sim/simulator.hpp"
#include "sim/sweep_report.hpp"

namespace tessera::sim {

namespace {

// ReplayResult::noise_floor_pct: the least over each measured step c of mean |c - m| / m over the
// warm steps m (the optimum of that piecewise-linear mean lies at one of them).
double noise_floor_pct(const RunRecord& run, const std::vector<ReplayIteration>& iterations) {
  std::vector<double> steps;
  const std::vector<Sample>* samples = nullptr;
  for (std::size_t k = 0; k < iterations.size(); ++k) {
    if (iterations[k].warmup) continue;
    const std::vector<Sample>& these = run.iterations[k].batch.samples;
    if (samples != nullptr && these != *samples) return -1;
    samples = &these;
    steps.push_back(iterations[k].measured_s);
  }
  double least = -1;
  for (double c : steps) {
    double sum = 0;
    for (double m : steps) sum += std::abs(c - m) / m;
    const double mean = 100 * sum / static_cast<double>(steps.size());
    if (least < 0 || mean < least) least = mean;
  }
  return least;
}

}  // namespace

ReplayResult replay(const RunRecord& run, const std::vector<TracedIteration>& traced,
                    const CostParams& cost, const ReplayOptions& options) {
  ReplayResult result;
  SimulateOptions sim;
  sim.cost = cost;
  sim.timeout_s = options.timeout_s;
  sim.keep_timelines = true;
  for (const RecordedIteration& it : run.iterations) {
    sim.batches.push_back(it.batch);
    if (it.dip) sim.dip_schedules.push_back(*it.dip);
  }
  if (sim.dip_schedules.size() != sim.batches.size()) sim.dip_schedules.clear();
  const Scenario& s = run.scenario;
  const SimulationResult r = simulate(s, *s.plan, sim);
  if (!r.feasible) {
    result.error = r.reason;
    return result;
  }
  result.notes = r.notes;  // the profile's coverage included (simulate adds it)
  const int64_t first = run.iterations.front().batch.iteration;
  double sum_abs = 0, sum = 0;
  int64_t warm = 0;
  std::map<int64_t, std::size_t> simulated;  // iteration -> index in r
  for (std::size_t k = 0; k < run.iterations.size(); ++k) {
    ReplayIteration it;
    it.iteration = run.iterations[k].batch.iteration;
    it.measured_s = run.iterations[k].step_s;
    it.predicted_s = r.iterations[k].metrics.step_s;
    it.warmup = it.iteration - first < options.warmup_iterations;
    simulated[it.iteration] = k;
    if (!it.warmup) {
      const double e = it.error_pct();
      sum_abs += std::abs(e);
      sum += e;
      result.max_abs_error_pct = std::max(result.max_abs_error_pct, std::abs(e));
      ++warm;
    }
    result.iterations.push_back(it);
  }
  if (warm > 0) {
    result.mean_abs_error_pct = sum_abs / static_cast<double>(warm);
    result.mean_error_pct = sum / static_cast<double>(warm);
    result.noise_floor_pct = noise_floor_pct(run, result.iterations);
  }
  // Per class, over the traced warm iterations: the trace's slices against the simulation's.
  std::map<std::string, std::pair<double, double>> classes;
  int64_t compared = 0;
  std::vector<std::size_t> traced_index;
  for (const TracedIteration& t : traced) {
    const auto at = simulated.find(t.program.iteration);
    if (at == simulated.end() || t.program.iteration - first < options.warmup_iterations) continue;
    ++compared;
    for (const OpMeasure& m : measure_ops(t.program, t.timeline, s.model, s.cluster))
      classes[class_name(m.cls)].first += m.wall_s;
    for (const OpMeasure& m :
         measure_ops(r.programs[at->second], r.timelines[at->second], s.model, s.cluster))
      classes[class_name(m.cls)].second += m.wall_s;
    traced_index.push_back(at->second);
  }
  for (const auto& [name, times] : classes)
    result.classes.push_back({name, times.first / static_cast<double>(compared),
                              times.second / static_cast<double>(compared)});
  if (!options.html_file.empty()) {
    // The first traced warm iteration (else the first traced), measured and predicted.
    const TracedIteration* shown = nullptr;
    for (const TracedIteration& t : traced) {
      if (!simulated.contains(t.program.iteration)) continue;
      if (shown == nullptr) shown = &t;
      if (t.program.iteration - first >= options.warmup_iterations) {
        shown = &t;
        break;
      }
    }
    if (shown == nullptr) {
      result.html_error = "no traced iteration to draw (record the run with --trace-steps)";
    } else {
      const std::size_t k = simulated.at(shown->program.iteration);
      StepPicture measured = step_picture(shown->program, shown->timeline);
      StepPicture predicted = step_picture_like(measured, r.programs[k], r.timelines[k]);
      measured.step_s = predicted.step_s = std::max(measured.step_s, predicted.step_s);
      const ReplayIteration& it = result.iterations[k];
      char line[256];
      std::snprintf(line, sizeof line,
                    "<p>Iteration %lld: measured %.4g s, predicted %.4g s (%+.1f%%). The same "
                    "ranks and time axis above and below; white is idle.</p>",
                    static_cast<long long>(it.iteration), it.measured_s, it.predicted_s,
                    it.error_pct());
      const std::string page =
          html_page_head("Tessera replay: " + s.name) + line +
          step_timeline_svg(measured, "measured (the run's trace)") +
          step_timeline_svg(predicted, "predicted (simulated with the cost model)") +
          "</body></html>\n";
      result.html_error = write_file_atomically(options.html_file, page);
    }
  }
  if (!options.trace_dir.empty()) {
    std::vector<TraceIteration> its;
    double offset = 0;
    for (const TracedIteration& t : traced) {
      const auto at = simulated.find(t.program.iteration);
      if (at == simulated.end()) continue;
      its.push_back({&r.programs[at->second], &r.timelines[at->second], offset});
      offset += r.timelines[at->second].step_s;
    }
    if (its.empty())  // an untraced run: the first iterations
      for (std::size_t k = 0; k < std::min<std::size_t>(3, r.programs.size()); ++k) {
        its.push_back({&r.programs[k], &r.timelines[k], offset});
        offset += r.timelines[k].step_s;
      }
    result.trace_error = write_chrome_traces(options.trace_dir, its, "sim");
  }
  return result;
}

std::string format_replay(const ReplayResult& r) {
  std::string out;
  for (const std::string& note : r.notes) out += "note: " + note + "\n";
  if (!r.error.empty()) return out + "replay failed: " + r.error + "\n";
  char line[256];
  out += "iteration   measured (s)   predicted (s)   error\n";
  for (const ReplayIteration& it : r.iterations) {
    std::snprintf(line, sizeof line, "%9lld   %12.4f   %13.4f   %+6.1f%%%s\n",
                  static_cast<long long>(it.iteration), it.measured_s, it.predicted_s,
                  it.error_pct(), it.warmup ? "  (warm-up, not counted)" : "");
    out += line;
  }
  std::snprintf(
      line, sizeof line,
      "step time error over the warm iterations: mean |error| %.1f%%, max |error| %.1f%%, "
      "mean %+.1f%%\n",
      r.mean_abs_error_pct, r.max_abs_error_pct, r.mean_error_pct);
  out += line;
  if (r.noise_floor_pct >= 0) {
    std::snprintf(line, sizeof line,
                  "the measured steps' own noise (same samples every iteration): no one step "
                  "time comes closer than %.1f%% on average\n",
                  r.noise_floor_pct);
    out += line;
  }
  if (!r.classes.empty()) {
    out += "\nop class (seconds per iteration, all ranks)   measured   predicted   error\n";
    for (const ReplayClass& c : r.classes) {
      const double e = c.measured_s > 0 ? 100 * (c.predicted_s - c.measured_s) / c.measured_s : 0;
      std::snprintf(line, sizeof line, "%-44s %9.4f   %9.4f   %+6.1f%%\n", c.name.c_str(),
                    c.measured_s, c.predicted_s, e);
      out += line;
    }
  }
  return out;
}

Json replay_to_json(const ReplayResult& r) {
  Json its = Json::array(), classes = Json::array();
  for (const ReplayIteration& it : r.iterations)
    its.push_back({{"iteration", it.iteration},
                   {"measured_s", it.measured_s},
                   {"predicted_s", it.predicted_s},
                   {"error_pct", it.error_pct()},
                   {"warmup", it.warmup}});
  for (const ReplayClass& c : r.classes)
    classes.push_back(
        {{"class", c.name}, {"measured_s", c.measured_s}, {"predicted_s", c.predicted_s}});
  return {{"error", r.error},
          {"notes", r.notes},
          {"iterations", its},
          {"mean_abs_error_pct", r.mean_abs_error_pct},
          {"max_abs_error_pct", r.max_abs_error_pct},
          {"mean_error_pct", r.mean_error_pct},
          {"noise_floor_pct", r.noise_floor_pct >= 0 ? Json(r.noise_floor_pct) : Json()},
          {"classes", classes}};
}

}  // namespace tessera::sim

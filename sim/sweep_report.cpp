#include "sim/sweep_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "shared/search/scenario_report.hpp"
#include "sim/sweep_families.hpp"

namespace tessera::sim {

namespace {

std::string esc(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string num(double v, const char* fmt = "%.3g") {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

// A line chart of one value per (series, x label); missing points leave gaps.
std::string line_chart(const std::string& title, const std::string& y_label,
                       const std::vector<std::string>& xs,
                       const std::map<std::string, std::vector<std::optional<double>>>& series) {
  const double w = 640, h = 320, left = 80, right = 160, top = 40, bottom = 50;
  double y_max = 0;
  for (const auto& [name, values] : series)
    for (const auto& v : values)
      if (v) y_max = std::max(y_max, *v);
  if (y_max <= 0) y_max = 1;
  auto x_at = [&](std::size_t i) {
    return left + (xs.size() == 1 ? (w - left - right) / 2
                                  : (w - left - right) * static_cast<double>(i) /
                                        static_cast<double>(xs.size() - 1));
  };
  auto y_at = [&](double v) { return top + (h - top - bottom) * (1 - v / (y_max * 1.1)); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "'>";
  svg << "<text x='" << w / 2 << "' y='20' text-anchor='middle' font-weight='bold'>" << esc(title)
      << "</text>";
  svg << "<line x1='" << left << "' y1='" << h - bottom << "' x2='" << w - right << "' y2='"
      << h - bottom << "' stroke='#333'/>";
  svg << "<line x1='" << left << "' y1='" << top << "' x2='" << left << "' y2='" << h - bottom
      << "' stroke='#333'/>";
  for (int t = 0; t <= 4; ++t) {
    const double v = y_max * 1.1 * t / 4;
    svg << "<text x='" << left - 6 << "' y='" << y_at(v) + 4
        << "' text-anchor='end' font-size='11'>" << human_si(v) << "</text>";
    svg << "<line x1='" << left << "' y1='" << y_at(v) << "' x2='" << w - right << "' y2='"
        << y_at(v) << "' stroke='#eee'/>";
  }
  for (std::size_t i = 0; i < xs.size(); ++i)
    svg << "<text x='" << x_at(i) << "' y='" << h - bottom + 18
        << "' text-anchor='middle' font-size='11'>" << esc(xs[i]) << "</text>";
  svg << "<text x='20' y='" << (top + h - bottom) / 2 << "' transform='rotate(-90 20 "
      << (top + h - bottom) / 2 << ")' text-anchor='middle' font-size='12'>" << esc(y_label)
      << "</text>";
  int k = 0;
  for (const auto& [name, values] : series) {
    const char* color = kColors[k % 6];
    std::string path;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!values[i]) continue;
      path +=
          (path.empty() ? "M" : " L") + num(x_at(i), "%.1f") + " " + num(y_at(*values[i]), "%.1f");
      svg << "<circle cx='" << x_at(i) << "' cy='" << y_at(*values[i]) << "' r='4' fill='" << color
          << "'/>";
    }
    if (!path.empty())
      svg << "<path d='" << path << "' stroke='" << color << "' fill='none' stroke-width='2'/>";
    svg << "<rect x='" << w - right + 15 << "' y='" << top + 20 * k
        << "' width='12' height='12' fill='" << color << "'/>";
    svg << "<text x='" << w - right + 32 << "' y='" << top + 20 * k + 11 << "' font-size='12'>"
        << esc(name) << "</text>";
    ++k;
  }
  svg << "</svg>";
  return svg.str();
}

// One bar per family: what a single GPU count (or grid point) has instead of a line.
std::string bar_chart(const std::string& title, const std::string& y_label,
                      const std::map<std::string, double>& bars) {
  const double w = 640, h = 320, left = 80, top = 40, bottom = 50;
  double y_max = 0;
  for (const auto& [name, v] : bars) y_max = std::max(y_max, v);
  if (y_max <= 0) y_max = 1;
  const double slot = (w - left - 40) / static_cast<double>(std::max<std::size_t>(1, bars.size()));
  auto y_at = [&](double v) { return top + (h - top - bottom) * (1 - v / (y_max * 1.1)); };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "'>";
  svg << "<text x='" << w / 2 << "' y='20' text-anchor='middle' font-weight='bold'>" << esc(title)
      << "</text>";
  svg << "<line x1='" << left << "' y1='" << h - bottom << "' x2='" << w - 40 << "' y2='"
      << h - bottom << "' stroke='#333'/>";
  for (int t = 0; t <= 4; ++t) {
    const double v = y_max * 1.1 * t / 4;
    svg << "<text x='" << left - 6 << "' y='" << y_at(v) + 4
        << "' text-anchor='end' font-size='11'>" << human_si(v) << "</text>";
    svg << "<line x1='" << left << "' y1='" << y_at(v) << "' x2='" << w - 40 << "' y2='" << y_at(v)
        << "' stroke='#eee'/>";
  }
  svg << "<text x='20' y='" << (top + h - bottom) / 2 << "' transform='rotate(-90 20 "
      << (top + h - bottom) / 2 << ")' text-anchor='middle' font-size='12'>" << esc(y_label)
      << "</text>";
  int k = 0;
  for (const auto& [name, v] : bars) {
    const double x = left + slot * (k + 0.2), width = slot * 0.6;
    svg << "<rect x='" << x << "' y='" << y_at(v) << "' width='" << width << "' height='"
        << h - bottom - y_at(v) << "' fill='" << kColors[k % 6] << "'/>";
    svg << "<text x='" << x + width / 2 << "' y='" << y_at(v) - 5
        << "' text-anchor='middle' font-size='11'>" << human_si(v) << "</text>";
    svg << "<text x='" << x + width / 2 << "' y='" << h - bottom + 18
        << "' text-anchor='middle' font-size='12'>" << esc(name) << "</text>";
    ++k;
  }
  svg << "</svg>";
  return svg.str();
}

// Best estimated tokens/s of homogeneous plans per (TP, PP).
std::string heat_map(const std::vector<EstimatedPlan>& estimated) {
  std::map<std::pair<int64_t, int64_t>, double> best;
  std::set<int64_t> tps, pps;
  for (const EstimatedPlan& e : estimated) {
    if (e.placement != Placement::kHomogeneous) continue;
    auto& b = best[{e.llm_tp, e.llm_pp}];
    b = std::max(b, e.tokens_per_s);
    tps.insert(e.llm_tp);
    pps.insert(e.llm_pp);
  }
  if (best.empty()) return "<p>No homogeneous plans were estimated.</p>";
  double top_value = 0;
  for (const auto& [key, v] : best) top_value = std::max(top_value, v);
  const double cell = 70, left = 60, top = 50;
  const double w = std::max(480.0, left + cell * static_cast<double>(tps.size()) + 20);
  const double h = top + cell * static_cast<double>(pps.size()) + 40;
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "'>";
  svg << "<text x='" << w / 2
      << "' y='20' text-anchor='middle' font-weight='bold'>LLM TP x PP: best estimated tokens/s "
         "(homogeneous)</text>";
  int col = 0;
  for (int64_t tp : tps) {
    svg << "<text x='" << left + cell * (col + 0.5) << "' y='" << top - 8
        << "' text-anchor='middle' font-size='12'>TP " << tp << "</text>";
    int row = 0;
    for (int64_t pp : pps) {
      const auto it = best.find({tp, pp});
      const double x = left + cell * col, y = top + cell * row;
      if (col == 0)
        svg << "<text x='" << left - 8 << "' y='" << y + cell / 2 + 4
            << "' text-anchor='end' font-size='12'>PP " << pp << "</text>";
      if (it == best.end()) {
        svg << "<rect x='" << x << "' y='" << y << "' width='" << cell - 2 << "' height='"
            << cell - 2 << "' fill='#f4f4f4'/>";
      } else {
        const double f = it->second / top_value;  // 0..1
        const int g = static_cast<int>(255 - 155 * f), r = static_cast<int>(240 - 200 * f);
        char color[16];
        std::snprintf(color, sizeof color, "#%02x%02x%02x", r, g, std::max(0, r - 20));
        svg << "<rect x='" << x << "' y='" << y << "' width='" << cell - 2 << "' height='"
            << cell - 2 << "' fill='" << color << "'/>";
        svg << "<text x='" << x + cell / 2 << "' y='" << y + cell / 2 + 4
            << "' text-anchor='middle' font-size='11'>" << human_si(it->second) << "</text>";
      }
      ++row;
    }
    ++col;
  }
  svg << "</svg>";
  return svg.str();
}

// Step time of the top plans split into compute, exposed communication, boundary transfers
// and other idle time (pipeline bubble and load imbalance).
std::string breakdown(const std::vector<const SweepRow*>& rows, const ModelSpec& model,
                      const std::string& title) {
  if (rows.empty()) return "";
  double longest = 0;
  for (const SweepRow* r : rows) longest = std::max(longest, r->step_s);
  const double bar = 22, left = 330, width = 420, top = 40;
  const double h = top + bar * 1.5 * static_cast<double>(rows.size()) + 40;
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << left + 680 << "' height='" << h
      << "'>";
  svg << "<text x='" << (left + width) / 2 << "' y='20' text-anchor='middle' font-weight='bold'>"
      << esc(title) << "</text>";
  const char* names[] = {"compute", "exposed communication", "boundary", "imbalance",
                         "bubble and waits"};
  const char* colors[] = {"#4c78a8", "#e45756", "#f58518", "#9d755d", "#bab0ac"};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SweepRow& r = *rows[i];
    const double y = top + bar * 1.5 * static_cast<double>(i);
    const StepParts step = step_parts(r);
    const double parts[] = {step.compute_s, step.comm_s, step.boundary_s, step.imbalance_s,
                            step.bubble_s};
    svg << "<text x='" << left - 6 << "' y='" << y + bar * 0.7
        << "' text-anchor='end' font-size='11'>" << i + 1 << ". "
        << esc(enum_name(r.plan.placement, kPlacements) + " " + describe_layout(r.plan, model))
        << "</text>";
    double x = left;
    for (int k = 0; k < 5; ++k) {
      const double len = width * parts[k] / longest;
      svg << "<rect x='" << x << "' y='" << y << "' width='" << std::max(0.0, len) << "' height='"
          << bar << "' fill='" << colors[k] << "'><title>" << names[k] << " " << num(parts[k])
          << " s</title></rect>";
      x += len;
    }
    svg << "<text x='" << x + 4 << "' y='" << y + bar * 0.7 << "' font-size='11'>" << num(r.step_s)
        << " s</text>";
  }
  double legend_x = left;  // each entry as wide as its name
  for (int k = 0; k < 5; ++k) {
    svg << "<rect x='" << legend_x << "' y='" << h - 25 << "' width='12' height='12' fill='"
        << colors[k] << "'/><text x='" << legend_x + 16 << "' y='" << h - 15 << "' font-size='11'>"
        << names[k] << "</text>";
    legend_x += 28 + 6.5 * static_cast<double>(std::string(names[k]).size());
  }
  svg << "</svg>";
  return svg.str();
}

}  // namespace

// One step op by op on a few ranks (StepPicture): a lane per rank, compute as full bars coloured
// by module (forward light, backward dark, weight gradients between, recomputation
// grey), transfers as thin grey bars beneath; white is idle.
std::string step_timeline_svg(const StepPicture& picture, const std::string& title) {
  const double left = 340, right = 20, top = 40, lane = 26, w = 1080;
  const double h = top + lane * static_cast<double>(picture.lanes.size()) + 60;
  const double span = picture.step_s > 0 ? picture.step_s : 1;
  auto x_at = [&](double t) { return left + (w - left - right) * t / span; };
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << w << "' height='" << h << "'>";
  svg << "<text x='" << w / 2 << "' y='20' text-anchor='middle' font-weight='bold'>" << esc(title)
      << "</text>";
  for (std::size_t i = 0; i < picture.lanes.size(); ++i) {
    const StepLane& l = picture.lanes[i];
    const double y = top + lane * static_cast<double>(i);
    svg << "<text x='" << left - 6 << "' y='" << y + 15 << "' text-anchor='end' font-size='11'>"
        << esc(l.label) << "</text>";
    svg << "<rect x='" << left << "' y='" << y + 1 << "' width='" << w - left - right
        << "' height='" << lane - 2 << "' fill='#fafafa' stroke='#eee'/>";
    for (const StepBar& b : l.bars) {
      const double x0 = x_at(b.start_s), x1 = std::max(x_at(b.finish_s), x0 + 0.5);
      const char* color = b.module >= 0 ? kColors[b.module % 6] : "#555";
      const double opacity = !b.compute             ? 1.0
                             : b.phase == Phase::kF ? 0.45
                             : b.phase == Phase::kW ? 0.7
                                                    : 1.0;
      const double top_y = b.compute ? y + 2 : y + lane - 8, height = b.compute ? lane - 11 : 5;
      svg << "<rect class='op' x='" << num(x0, "%.2f") << "' y='" << top_y << "' width='"
          << num(x1 - x0, "%.2f") << "' height='" << height << "' fill='"
          << (b.compute ? (b.phase == Phase::kR ? "#999" : color) : "#666") << "' fill-opacity='"
          << opacity << "'><title>" << esc(b.name)
          << (b.ops > 1 ? " and " + std::to_string(b.ops - 1) + " more" : std::string()) << ": "
          << num(b.start_s, "%.4g") << " to " << num(b.finish_s, "%.4g") << " s</title></rect>";
    }
  }
  const double axis = top + lane * static_cast<double>(picture.lanes.size()) + 4;
  for (int t = 0; t <= 5; ++t) {
    const double v = span * t / 5;
    svg << "<text x='" << x_at(v) << "' y='" << axis + 14
        << "' text-anchor='middle' font-size='11'>" << num(v, "%.3g") << " s</text>";
  }
  double x = left;
  for (std::size_t m = 0; m < picture.modules.size(); ++m) {
    svg << "<rect x='" << x << "' y='" << axis + 24 << "' width='12' height='12' fill='"
        << kColors[m % 6] << "'/><text x='" << x + 16 << "' y='" << axis + 34 << "' font-size='11'>"
        << esc(picture.modules[m]) << "</text>";
    x += 30 + 7 * static_cast<double>(picture.modules[m].size());
  }
  svg << "<text x='" << x << "' y='" << axis + 34
      << "' font-size='11'>forward light, backward dark; grey beneath: transfers; white: "
         "idle</text>";
  svg << "</svg>";
  return svg.str();
}

std::string html_page_head(const std::string& title) {
  return "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + esc(title) +
         "</title><style>"
         "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-"
         "size:13px}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f0f0f0}"
         "td.l{text-align:left}.charts{display:flex;flex-wrap:wrap;gap:24px;margin:16px "
         "0}</style></head><body><h1>" +
         esc(title) + "</h1>";
}

std::string sweep_report_html(const SweepResult& r, const Scenario& s) {
  std::ostringstream html;
  html << html_page_head("Tessera sweep: " + s.name);
  if (!s.description.empty()) html << "<p>" << esc(s.description) << "</p>";
  int64_t rejected = 0;
  for (const auto& [reason, count] : r.rejected) rejected += count;
  html << "<p>" << r.considered << " plans considered, " << r.valid << " valid, " << r.ranked
       << " estimated, " << r.rows.size() << " simulated; " << rejected << " rejected (";
  bool first = true;
  for (const auto& [reason, count] : r.rejected) {
    html << (first ? "" : ", ") << count << " " << esc(reason);
    first = false;
  }
  html << ").</p>";
  if (r.refined_bases > 0)
    html << "<p>Second stage: the best " << r.refined_bases
         << " plans of the first ranking (each placement family's best among them) again with "
            "Entrain, sorted micro-batches, DIP and the CP splits: "
         << r.refined << " variants, " << r.refined - r.refined_rejected << " estimated.</p>";
  for (const std::string& note : r.notes) html << "<p>" << esc(note) << "</p>";

  // First the families side by side: each one's best simulated plan, and why the fastest wins.
  for (const auto& group : family_bests(r.rows)) {
    const SweepRow& lead = *group.front();
    const std::string where = point_text(lead.point);
    html << "<h2>Best plan of each placement family on " << lead.gpus << " GPUs"
         << esc(where.empty() ? "" : " at " + where)
         << "</h2><table class='families'><tr><th>placement</th><th>layout</th><th>step "
            "(s)</th><th>tokens/s</th><th>TFLOP/s/GPU</th><th>compute (s)</th><th>imbalance "
            "(s)</th><th>bubble and waits (s)</th><th>exposed comm (s)</th><th>boundary "
            "(s)</th></tr>";
    for (const SweepRow* row : group) {
      const StepParts parts = step_parts(*row);
      html << "<tr><td class='l'>" << enum_name(row->plan.placement, kPlacements)
           << "</td><td class='l'>" << esc(describe_layout(row->plan, s.model)) << "</td><td>"
           << num(row->step_s, "%.4g") << "</td><td>" << num(row->tokens_per_s, "%.4g")
           << "</td><td>" << num(row->tflops_per_device, "%.4g") << "</td><td>"
           << num(parts.compute_s) << "</td><td>" << num(parts.imbalance_s) << "</td><td>"
           << num(parts.bubble_s) << "</td><td>" << num(parts.comm_s) << "</td><td>"
           << num(parts.boundary_s) << "</td></tr>";
    }
    html << "</table><ul class='why'>";
    for (std::size_t i = 1; i < group.size(); ++i)
      html << "<li>" << esc(why_faster(lead, *group[i])) << "</li>";
    html << "</ul><div class='charts'>"
         << breakdown(group, s.model, "Where each family's best step goes (mean over ranks)")
         << "</div>";
    // Each family's best, one step op by op.
    bool heading = false;
    for (const SweepRow* row : group) {
      const auto it = r.pictures.find(row->key);
      if (it == r.pictures.end() || !it->second.error.empty() || it->second.lanes.empty()) continue;
      if (!heading)
        html << "<h3>One step, op by op (the analytic evaluator's times, no network contention; "
                "a lane per distinct role of a rank)</h3>";
      heading = true;
      html << "<div class='timeline'>"
           << step_timeline_svg(it->second, enum_name(row->plan.placement, kPlacements) + ": " +
                                                describe_layout(row->plan, s.model) + ", " +
                                                num(it->second.step_s, "%.4g") + " s")
           << "</div>";
    }
  }
  if (const std::vector<std::string> lines = technique_lines(r, s.model); !lines.empty()) {
    html << "<h2>What the second stage's techniques did</h2><p>Each family's best first-stage "
            "plan with Entrain, sorted micro-batches, DIP or another CP split: speed-up by the "
            "analytic estimate.</p><ul>";
    for (const std::string& l : lines) html << "<li>" << esc(l) << "</li>";
    html << "</ul>";
  }

  // Chart 1: best simulated tokens/s per placement family against GPU count, or against the
  // grid point when the sweep has a --set axis.
  std::vector<std::string> xs;
  std::map<std::string, std::map<std::string, double>> best;  // family -> x -> tokens/s
  const bool by_point = std::any_of(r.rows.begin(), r.rows.end(),
                                    [](const SweepRow& row) { return !row.point.empty(); });
  for (const SweepRow& row : r.rows) {
    if (!row.ok) continue;
    std::string x;
    if (by_point) {
      for (const auto& item : row.point.items()) x += (x.empty() ? "" : ", ") + item.value().dump();
      if (x.empty()) x = "-";
    } else {
      x = std::to_string(row.gpus) + " GPUs";
    }
    if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
    double& b = best[enum_name(row.plan.placement, kPlacements)][x];
    b = std::max(b, row.tokens_per_s);
  }
  if (!by_point)
    std::sort(xs.begin(), xs.end(), [](const std::string& a, const std::string& b) {
      return std::stoll(a) < std::stoll(b);
    });
  std::map<std::string, std::vector<std::optional<double>>> series;
  for (const auto& [family, values] : best)
    for (const std::string& x : xs) {
      const auto it = values.find(x);
      series[family].push_back(it == values.end() ? std::nullopt
                                                  : std::optional<double>(it->second));
    }
  std::string axis = "GPU count";
  if (by_point)
    for (const auto& item : r.rows.front().point.items()) axis = item.key();
  html << "<div class='charts'>";
  if (xs.size() == 1) {  // one GPU count: a bar per family
    std::map<std::string, double> bars;
    for (const auto& [family, values] : best) bars[family] = values.begin()->second;
    html << bar_chart("Best simulated throughput per placement (" + xs.front() + ")", "tokens/s",
                      bars);
  } else {
    html << line_chart("Best simulated throughput per placement vs " + axis, "tokens/s", xs,
                       series);
  }
  html << heat_map(r.estimated) << "</div>";
  std::vector<const SweepRow*> top;
  for (const SweepRow& row : r.rows)
    if (row.ok && top.size() < 10) top.push_back(&row);
  html << "<div class='charts'>"
       << breakdown(top, s.model, "Step time of the top plans (mean over ranks)") << "</div>";

  html << "<h2>Simulated "
          "plans</h2><table><tr><th>#</th><th>point</th><th>GPUs</th><th>placement</th><th>layout</"
          "th><th>MBS</th><th>GBS</th>"
       << "<th>schedule</th><th>micro-batching</th><th>recompute</th><th>SP</th><th>step "
          "(s)</th><th>tokens/s</th><th>TFLOP/s/GPU</th><th>MFU</th><th>peak memory</th><th "
          "title='the share of the step a rank computes nothing, mean over ranks'>idle (% of "
          "step)</th></tr>";
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const SweepRow& row = r.rows[i];
    std::string point;
    for (const auto& item : row.point.items())
      point += (point.empty() ? "" : ", ") + item.key() + "=" + item.value().dump();
    html << "<tr><td>" << i + 1 << "</td><td class='l'>" << esc(point) << "</td><td>" << row.gpus
         << "</td><td class='l'>" << enum_name(row.plan.placement, kPlacements)
         << "</td><td class='l'>" << esc(describe_layout(row.plan, s.model)) << "</td><td>"
         << row.plan.micro_batch_size << "</td><td>" << row.global_batch << "</td><td class='l'>"
         << enum_name(row.plan.schedule, kSchedules) << "</td><td class='l'>"
         << enum_name(row.plan.microbatching, kMicrobatching) << "</td><td class='l'>"
         << enum_name(row.plan.recompute, kRecomputes) << "</td><td class='l'>"
         << (row.plan.sequence_parallel ? "yes" : "no") << "</td>";
    if (row.ok) {
      html << "<td>" << num(row.step_s, "%.4g") << "</td><td>" << num(row.tokens_per_s, "%.4g")
           << "</td><td>" << num(row.tflops_per_device, "%.4g") << "</td><td>"
           << num(100 * row.mfu, "%.1f") << "%</td><td>" << human_bytes(row.peak_memory_bytes)
           << "</td><td>" << num(100 * row.idle_share, "%.1f") << "%</td></tr>";
    } else {
      html << "<td class='l' colspan='6'>failed: " << esc(row.failure) << "</td></tr>";
    }
  }
  html << "</table></body></html>\n";
  return html.str();
}

}  // namespace tessera::sim

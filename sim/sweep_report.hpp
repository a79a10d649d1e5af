// The sweep's HTML report: one self-contained page (inline SVG, no scripts) with each placement
// family's best plan and one step of it op by op, the best throughput per placement family
// against GPU count (or the --set axis), a TP x PP heat map of estimated throughput, a stacked
// step-time breakdown of the top plans, and the plan table.
#pragma once

#include <string>

#include "sim/sweep.hpp"

namespace tessera::sim {

std::string sweep_report_html(const SweepResult& result, const Scenario& scenario);

// One step op by op as an SVG timeline (the report's and `tessera replay --html`'s).
std::string step_timeline_svg(const StepPicture& picture, const std::string& title);

// What a self-contained page of these charts begins with, titled.
std::string html_page_head(const std::string& title);

}  // namespace tessera::sim

// The sweep's HTML report: one self-contained page (inline SVG, no scripts) with the best
// throughput per placement family against GPU count (or the --set axis), a TP x PP heat map of
// estimated throughput, a stacked step-time breakdown of the top plans, and the plan table.
#pragma once

#include <string>

#include "sim/sweep.hpp"

namespace tessera::sim {

std::string sweep_report_html(const SweepResult& result, const Scenario& scenario);

}  // namespace tessera::sim

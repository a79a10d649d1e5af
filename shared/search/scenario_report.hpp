// Human-readable summary of a scenario (`tessera show`): modules with parameters and FLOPs per
// token, token statistics over drawn batches, the cluster, the plan and its rank groups.
#pragma once

#include <cstdint>
#include <string>

#include "shared/layout/scenario.hpp"
#include "shared/program/program.hpp"

namespace tessera {

struct ReportOptions {
  int64_t batches = 4;     // batches drawn for token statistics
  int64_t max_groups = 4;  // groups listed per kind before "..."
};

std::string scenario_report(const Scenario& scenario, const ReportOptions& options);
std::string model_report(const ModelSpec& model);

// 7.06e9 -> "7.06 B" (counts of things: parameters, tokens).
std::string human_count(double n);
// 4.5e11 -> "450 G" (SI prefix for rates: FLOP/s, B/s).
std::string human_si(double n);
// 85899345920 -> "80 GiB".
std::string human_bytes(double bytes);
// "241 GiB (weights 3.03 GiB, gradients 6.06 GiB, optimizer 18.2 GiB, activations 214 GiB,
// boundary 0 B)": a rank's memory and its parts.
std::string memory_parts(const RankMemory& memory);

}  // namespace tessera

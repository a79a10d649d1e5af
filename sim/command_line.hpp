// Command-line plumbing shared by the `tessera` subcommands: flag parsing with --help, the
// positional input file, --plan and --profile, and the report of input problems (exit 2).
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include <cxxopts.hpp>

#include "shared/base/diagnostics.hpp"
#include "shared/cost/cost_model.hpp"
#include "shared/layout/scenario.hpp"
#include "sim/commands.hpp"
#include "sim/sweep.hpp"

namespace tessera::sim {

constexpr int kOk = 0;
constexpr int kBadInput = 2;

// `v` with `digits` decimals ("3.1416").
std::string fixed(double v, int digits);
// `percent` (already times 100) with its sign and one decimal ("+3.2%", "-0.4%").
std::string signed_percent(double percent);

// Parses flags; on --help prints usage and sets `exit_code` to 0, on a bad flag prints the
// problem and sets it to 2. Returns nullopt in both cases.
std::optional<cxxopts::ParseResult> parse(cxxopts::Options& options, const Args& args,
                                          std::ostream& out, std::ostream& err, int& exit_code);

// Adds the positional input file (`what`, shown as `usage`), parses, and returns the result
// with `file` set; nullopt (with `code` set) on --help or a bad command line.
std::optional<cxxopts::ParseResult> parse_with_input(cxxopts::Options& options, const char* what,
                                                     const char* usage, const Args& args,
                                                     std::ostream& out, std::ostream& err,
                                                     std::string& file, int& code);

// The scenario, changed by --set where the command has it, with --plan replacing its plan;
// nullopt after recording problems.
std::optional<Scenario> scenario_with_plan(const cxxopts::ParseResult& args,
                                           const std::string& file, Diagnostics& diag);

// --plan, shared by the commands that run one plan.
void add_plan_option(cxxopts::Options& options);

// --iteration, shared by the commands that draw one batch, and its value: nullopt after telling
// `err` why it is not one (a negative number).
void add_iteration_option(cxxopts::Options& options);
std::optional<int64_t> iteration_option(const cxxopts::Options& options,
                                        const cxxopts::ParseResult& args, std::ostream& err);

// --profile, shared by the commands that predict: a calibration profile's fits replace the
// analytic defaults.
void add_profile_option(cxxopts::Options& options);
// The cost parameters for `cluster`: --profile's, or nullopt when none was given (problems go
// to `diag`).
std::optional<CostParams> profile_option(const cxxopts::ParseResult& args,
                                         const ClusterSpec& cluster, Diagnostics& diag);

// --set json.path=v1,v2 (repeatable): each value is JSON when it parses (numbers, true, "text"),
// else a string. nullopt after recording what is malformed in `diag`.
void add_set_option(cxxopts::Options& options, const char* help);
std::optional<std::vector<SetAxis>> set_option(const cxxopts::ParseResult& args, Diagnostics& diag);
// The --set values as one point {path: value} (one value per path), for commands that run one
// scenario.
std::optional<Json> set_point(const cxxopts::ParseResult& args, Diagnostics& diag);

// Prints every problem and the count; returns 2.
int report_problems(const Diagnostics& diag, std::ostream& err);

}  // namespace tessera::sim

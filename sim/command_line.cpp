#include "sim/command_line.hpp"

#include <iomanip>
#include <sstream>

#include "shared/cost/profile.hpp"
#include "shared/layout/plan_source.hpp"

namespace tessera::sim {

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string signed_percent(double percent) {
  return (percent >= 0 ? "+" : "") + fixed(percent, 1) + "%";
}

namespace {

// cxxopts wants argc/argv; keep the strings alive for it.
struct Argv {
  std::vector<std::string> storage;
  std::vector<char*> pointers;
  explicit Argv(const std::string& program, const Args& args) : storage{program} {
    storage.insert(storage.end(), args.begin(), args.end());
    for (std::string& s : storage) pointers.push_back(s.data());
  }
  int argc() const { return static_cast<int>(pointers.size()); }
  char** argv() { return pointers.data(); }
};

}  // namespace

std::optional<cxxopts::ParseResult> parse(cxxopts::Options& options, const Args& args,
                                          std::ostream& out, std::ostream& err, int& exit_code) {
  options.add_options()("h,help", "show this help");
  Argv argv(options.program(), args);
  try {
    auto result = options.parse(argv.argc(), argv.argv());
    if (result.count("help")) {
      out << options.help() << "\n";
      exit_code = kOk;
      return std::nullopt;
    }
    return result;
  } catch (const cxxopts::exceptions::exception& e) {
    err << options.program() << ": " << e.what() << "\n"
        << "try '" << options.program() << " --help'\n";
    exit_code = kBadInput;
    return std::nullopt;
  }
}

std::optional<cxxopts::ParseResult> parse_with_input(cxxopts::Options& options, const char* what,
                                                     const char* usage, const Args& args,
                                                     std::ostream& out, std::ostream& err,
                                                     std::string& file, int& code) {
  options.add_options()("input", what, cxxopts::value<std::string>());
  options.parse_positional({"input"});
  options.positional_help(usage);
  auto result = parse(options, args, out, err, code);
  if (!result) return std::nullopt;
  if (!result->count("input")) {
    err << options.program() << ": missing " << what << "\ntry '" << options.program()
        << " --help'\n";
    code = kBadInput;
    return std::nullopt;
  }
  file = (*result)["input"].as<std::string>();
  return result;
}

std::optional<Scenario> scenario_with_plan(const cxxopts::ParseResult& args,
                                           const std::string& file, Diagnostics& diag) {
  const std::string plan = args.count("plan") ? args["plan"].as<std::string>() : "";
  const std::optional<Json> point = set_point(args, diag);
  if (!point) return std::nullopt;
  return load_scenario_at(file, plan, *point, diag);
}

void add_plan_option(cxxopts::Options& options) {
  options.add_options()(
      "plan", "plan replacing the scenario's: plan.json, or results.jsonl#R (rank R of a sweep)",
      cxxopts::value<std::string>());
}

int report_problems(const Diagnostics& diag, std::ostream& err) {
  err << diag.format();
  err << diag.errors().size() << (diag.errors().size() == 1 ? " problem" : " problems")
      << " found\n";
  return kBadInput;
}

void add_iteration_option(cxxopts::Options& options) {
  options.add_options()("iteration", "which iteration's batch to draw",
                        cxxopts::value<int64_t>()->default_value("0"));
}

std::optional<int64_t> iteration_option(const cxxopts::Options& options,
                                        const cxxopts::ParseResult& args, std::ostream& err) {
  const int64_t iteration = args["iteration"].as<int64_t>();
  if (iteration >= 0) return iteration;
  err << options.program() << ": --iteration must be >= 0\n";
  return std::nullopt;
}

void add_profile_option(cxxopts::Options& options) {
  options.add_options()("profile",
                        "calibration profile (tessera calibrate): its fitted costs replace the "
                        "analytic defaults",
                        cxxopts::value<std::string>());
}

std::optional<CostParams> profile_option(const cxxopts::ParseResult& args,
                                         const ClusterSpec& cluster, Diagnostics& diag) {
  if (!args.count("profile")) return std::nullopt;
  const std::string file = args["profile"].as<std::string>();
  const std::optional<Profile> profile = load_profile(file, diag);
  if (!profile) return std::nullopt;
  return profile_cost_params(*profile, cluster, file, diag);
}

void add_set_option(cxxopts::Options& options, const char* help) {
  options.add_options()("set", help, cxxopts::value<std::vector<std::string>>());
}

namespace {

std::vector<std::string> set_texts(const cxxopts::ParseResult& args) {
  return args.count("set") ? args["set"].as<std::vector<std::string>>()
                           : std::vector<std::string>{};
}

}  // namespace

std::optional<std::vector<SetAxis>> set_option(const cxxopts::ParseResult& args,
                                               Diagnostics& diag) {
  return parse_set_axes(set_texts(args), diag);
}

std::optional<Json> set_point(const cxxopts::ParseResult& args, Diagnostics& diag) {
  return parse_set_point(set_texts(args), diag);
}

}  // namespace tessera::sim

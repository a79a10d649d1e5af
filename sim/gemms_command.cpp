// `tessera gemms`: measured matrix-product rates (scripts/gemm-rates.py) beside the kernel
// model's GEMM pricing for the device they ran on.
#include <cmath>
#include <iomanip>
#include <map>
#include <ostream>

#include "shared/cost/gemm_rates.hpp"
#include "sim/command_line.hpp"

namespace tessera::sim {

namespace {

// The group a row's error is summarised in: one product or several grouped, dtype and FP8
// scaling (the dense products set beside grouped ones count as dense).
std::string family(const GemmMeasurement& g) {
  return std::string(g.groups > 1 ? (g.kind == "streams" ? "experts on streams" : "grouped")
                                  : "dense") +
         " " + (g.dtype == DType::kFp8 ? "fp8 per " + g.scaling : "bf16");
}

// The measured rate.
double tflops(const GemmMeasurement& g) {
  return 2 * g.m * g.n * g.k * g.groups / g.seconds / 1e12;
}

}  // namespace

int run_gemms(const Args& args, std::ostream& out, std::ostream& err) {
  cxxopts::Options options(
      "tessera gemms",
      "Sets matrix products measured on a GPU (scripts/gemm-rates.py: dense and grouped, bf16 "
      "and FP8) beside the kernel model's price for them on the device they ran on (the shipped "
      "device its name matches, or --device): each product's measured and predicted time, the "
      "error, and the mean |error| per kind. The model prices FP8 with block scales at the "
      "device's "
      "block-scaled FP8 rate and every other FP8 product at its per-tensor rate, so per-row "
      "rows show what their scales cost beyond per-tensor ones.");
  options.add_options()("device",
                        "a shipped device's name or a device file (default: the one "
                        "the measurement's GPU name matches)",
                        cxxopts::value<std::string>())(
      "markdown", "print the rows and the means as Markdown tables");
  int code = kOk;
  std::string file;
  const auto result = parse_with_input(options, "measurement file", "<gemm-rates.jsonl>", args, out,
                                       err, file, code);
  if (!result) return code;
  Diagnostics diag;
  const std::optional<GemmRates> rates = read_gemm_rates(file, diag);
  if (!rates) return report_problems(diag, err);
  const std::string name =
      result->count("device") ? (*result)["device"].as<std::string>() : rates->device;
  const std::optional<DeviceSpec> device = read_named_device(name, diag);
  if (!device) return report_problems(diag, err);
  if (!device->kernels) {
    err << options.program() << ": " << device->name << " has no kernel data to price GEMMs with\n";
    return kBadInput;
  }
  for (const GemmMeasurement& g : rates->rows)
    if (!device->peak_flops.count(g.dtype))
      diag.error(file, "line " + std::to_string(g.line) + ".dtype",
                 device->name + " has no peak at this dtype");
  if (!diag.ok()) return report_problems(diag, err);

  const bool markdown = result->count("markdown") > 0;
  if (!markdown)
    out << "measured on " << rates->device << " (torch " << rates->torch << "), priced as "
        << device->name << "\n";
  if (markdown) {
    out << "| product | m | n | k | groups | measured | TFLOP/s | predicted | error |\n"
        << "|---|---|---|---|---|---|---|---|---|\n";
  } else {
    out << std::left << std::setw(52) << "product" << std::right << std::setw(7) << "m"
        << std::setw(7) << "n" << std::setw(7) << "k" << std::setw(7) << "groups" << std::setw(12)
        << "measured" << std::setw(9) << "TFLOP/s" << std::setw(12) << "predicted" << std::setw(9)
        << "error"
        << "\n";
  }
  std::map<std::string, std::pair<double, int>> by_family;  // sum of |error|, rows
  std::vector<std::string> order;
  for (const GemmMeasurement& g : rates->rows) {
    if (!g.skipped.empty()) {
      if (!markdown)
        out << std::left << std::setw(52) << g.what << " skipped: " << g.skipped << "\n";
      continue;
    }
    const double predicted = predicted_gemm_s(*device, g);
    const double error = predicted / g.seconds - 1;
    const std::string f = family(g);
    if (!by_family.count(f)) order.push_back(f);
    by_family[f].first += std::abs(error);
    by_family[f].second += 1;
    const std::string measured_ms = fixed(1e3 * g.seconds, 4) + " ms";
    const std::string predicted_ms = fixed(1e3 * predicted, 4) + " ms";
    if (markdown) {
      out << "| " << g.what << " | " << g.m << " | " << g.n << " | " << g.k << " | " << g.groups
          << " | " << measured_ms << " | " << fixed(tflops(g), 0) << " | " << predicted_ms << " | "
          << signed_percent(100 * error) << " |\n";
    } else {
      out << std::left << std::setw(52) << g.what << std::right << std::setw(7) << g.m
          << std::setw(7) << g.n << std::setw(7) << g.k << std::setw(7) << g.groups << std::setw(12)
          << measured_ms << std::setw(9) << fixed(tflops(g), 0) << std::setw(12) << predicted_ms
          << std::setw(9) << signed_percent(100 * error) << "\n";
    }
  }
  out << (markdown ? "\n| kind | products | mean \\|error\\| |\n|---|---|---|\n"
                   : "mean |error| of the predicted time, by kind:\n");
  for (const std::string& f : order) {
    const auto [sum, n] = by_family[f];
    const std::string mean = fixed(100 * sum / n, 1) + "%";
    if (markdown)
      out << "| " << f << " | " << n << " | " << mean << " |\n";
    else
      out << "  " << std::left << std::setw(28) << f << std::right << std::setw(3) << n
          << " products  " << mean << "\n";
  }
  return kOk;
}

}  // namespace tessera::sim

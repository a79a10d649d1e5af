// A one-dimensional distribution of a workload quantity (text tokens, images per sample, image
// width, audio seconds ...). JSON: a bare number is a constant; otherwise an object
//   {"dist": "uniform",   "min": 1, "max": 8}
//   {"dist": "normal",    "mean": 512, "std": 128, "min": 16, "max": 4096}
//   {"dist": "lognormal", "median": 300, "sigma": 0.7, "min": 16, "max": 8192}
//   {"dist": "choice",    "values": [0, 1, 2, 8], "weights": [0.2, 0.5, 0.2, 0.1]}
// min/max clamp normal and lognormal draws; they are optional there.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shared/base/json_reader.hpp"
#include "shared/base/random.hpp"

namespace tessera {

enum class DistKind { kConstant, kUniform, kNormal, kLogNormal, kChoice };

struct Distribution {
  DistKind kind = DistKind::kConstant;
  double value = 0;           // constant
  double mean = 0;            // normal
  double std = 0;             // normal
  double median = 0;          // lognormal: exp(mu)
  double sigma = 0;           // lognormal: standard deviation of log
  std::optional<double> min;  // uniform (required), normal/lognormal (clamp)
  std::optional<double> max;
  std::vector<double> values;   // choice
  std::vector<double> weights;  // choice; Default: all equal

  static Distribution constant(double v) {
    Distribution d;
    d.value = v;
    return d;
  }
  bool operator==(const Distribution&) const = default;
};

// A draw, capped at `limit` (the quantity's largest value; workload_spec.hpp).
double sample(const Distribution& d, Rng& rng, double limit);
// Draw rounded to the nearest integer (token counts, item counts, pixels).
int64_t sample_int(const Distribution& d, Rng& rng, double limit);
// Smallest and largest value a draw can take (after clamping); used for validation.
double dist_lower_bound(const Distribution& d);
double dist_upper_bound(const Distribution& d);
// Expected value (of the clamped distribution for choice/uniform/constant; of the unclamped
// one for normal/lognormal, which is what a user writing mean/median means).
double dist_mean(const Distribution& d);

// Reads `value` (number or object) at `path`. `non_negative` rejects draws that can go below 0.
bool read_distribution(const Json& value, const std::string& file, const std::string& path,
                       Distribution& out, bool non_negative, Diagnostics& diag);
Json to_json(const Distribution& d);
std::string describe(const Distribution& d);

}  // namespace tessera

#include "shared/spec/distribution.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "shared/base/check.hpp"

namespace tessera {

namespace {

const EnumTable<DistKind> kDistKinds = {{"constant", DistKind::kConstant},
                                        {"uniform", DistKind::kUniform},
                                        {"normal", DistKind::kNormal},
                                        {"lognormal", DistKind::kLogNormal},
                                        {"choice", DistKind::kChoice}};

double clamp_to(const Distribution& d, double x) {
  if (d.min) x = std::max(x, *d.min);
  if (d.max) x = std::min(x, *d.max);
  return x;
}

}  // namespace

namespace {

double draw(const Distribution& d, Rng& rng) {
  switch (d.kind) {
    case DistKind::kConstant:
      return d.value;
    case DistKind::kUniform:
      return *d.min + (*d.max - *d.min) * rng.uniform();
    case DistKind::kNormal:
      return clamp_to(d, d.mean + d.std * rng.normal());
    case DistKind::kLogNormal:
      return clamp_to(d, d.median * std::exp(d.sigma * rng.normal()));
    case DistKind::kChoice: {
      const double total = d.weights.empty()
                               ? static_cast<double>(d.values.size())
                               : std::accumulate(d.weights.begin(), d.weights.end(), 0.0);
      double target = rng.uniform() * total;
      for (std::size_t i = 0; i < d.values.size(); ++i) {
        target -= d.weights.empty() ? 1.0 : d.weights[i];
        if (target < 0) return d.values[i];
      }
      return d.values.back();
    }
  }
  TESSERA_CHECK(false, "unhandled distribution kind");
}

}  // namespace

double sample(const Distribution& d, Rng& rng, double limit) {
  return std::min(draw(d, rng), limit);
}

int64_t sample_int(const Distribution& d, Rng& rng, double limit) {
  if (d.kind == DistKind::kUniform && std::floor(*d.min) == *d.min &&
      std::floor(*d.max) == *d.max && *d.max <= limit)
    return rng.uniform_int(static_cast<int64_t>(*d.min), static_cast<int64_t>(*d.max));
  return static_cast<int64_t>(std::llround(sample(d, rng, limit)));
}

double dist_lower_bound(const Distribution& d) {
  switch (d.kind) {
    case DistKind::kConstant:
      return d.value;
    case DistKind::kChoice:
      return *std::min_element(d.values.begin(), d.values.end());
    case DistKind::kLogNormal:
      return d.min.value_or(0.0);
    default:
      return d.min.value_or(-HUGE_VAL);
  }
}

double dist_upper_bound(const Distribution& d) {
  switch (d.kind) {
    case DistKind::kConstant:
      return d.value;
    case DistKind::kChoice:
      return *std::max_element(d.values.begin(), d.values.end());
    default:
      return d.max.value_or(HUGE_VAL);
  }
}

double dist_mean(const Distribution& d) {
  switch (d.kind) {
    case DistKind::kConstant:
      return d.value;
    case DistKind::kUniform:
      return 0.5 * (*d.min + *d.max);
    case DistKind::kNormal:
      return d.mean;
    case DistKind::kLogNormal:
      return d.median * std::exp(0.5 * d.sigma * d.sigma);
    case DistKind::kChoice: {
      double sum = 0, total = 0;
      for (std::size_t i = 0; i < d.values.size(); ++i) {
        const double w = d.weights.empty() ? 1.0 : d.weights[i];
        sum += w * d.values[i];
        total += w;
      }
      return sum / total;
    }
  }
  return 0;
}

bool read_distribution(const Json& value, const std::string& file, const std::string& path,
                       Distribution& out, bool non_negative, Diagnostics& diag) {
  const std::size_t errors_before = diag.errors().size();
  Distribution d;
  if (value.is_number()) {
    read_value(value, file, path, d.value, diag);
  } else {
    ObjectReader r(value, file, path, diag);
    if (!r.valid()) return false;
    if (!r.required_enum("dist", d.kind, kDistKinds)) {
      r.has({"value", "min", "max", "mean", "std", "median", "sigma", "values", "weights"});
      r.finish();
      return false;
    }
    switch (d.kind) {
      case DistKind::kConstant:
        r.required("value", d.value);
        break;
      case DistKind::kUniform: {
        double lo = 0, hi = 0;
        if (r.required("min", lo) && r.required("max", hi)) {
          d.min = lo;
          d.max = hi;
          if (hi < lo) r.error("max", "must be >= min");
        }
        break;
      }
      case DistKind::kNormal:
      case DistKind::kLogNormal: {
        if (d.kind == DistKind::kNormal) {
          r.required("mean", d.mean);
          if (r.required("std", d.std)) r.check_at_least("std", d.std, 0.0);
        } else {
          if (r.required("median", d.median)) r.check_positive("median", d.median);
          if (r.required("sigma", d.sigma)) r.check_at_least("sigma", d.sigma, 0.0);
        }
        double bound = 0;
        if (r.optional("min", bound)) d.min = bound;
        if (r.optional("max", bound)) d.max = bound;
        if (d.min && d.max && *d.max < *d.min) r.error("max", "must be >= min");
        break;
      }
      case DistKind::kChoice: {
        if (r.required("values", d.values) && d.values.empty())
          r.error("values", "must not be empty");
        if (r.optional("weights", d.weights)) {
          if (d.weights.size() != d.values.size())
            r.error("weights", "has " + std::to_string(d.weights.size()) + " entries, values has " +
                                   std::to_string(d.values.size()));
          double total = 0;
          for (double w : d.weights) {
            if (w < 0) r.error("weights", "weights must be >= 0");
            total += w;
          }
          if (total <= 0) r.error("weights", "weights must not all be zero");
        }
        break;
      }
    }
    r.finish();
  }
  if (diag.errors().size() != errors_before) return false;
  if (non_negative && dist_lower_bound(d) < 0) {
    diag.error(file, path, "can draw negative values; give a min >= 0");
    return false;
  }
  out = d;
  return true;
}

Json to_json(const Distribution& d) {
  if (d.kind == DistKind::kConstant) return d.value;
  Json j;
  j["dist"] = enum_name(d.kind, kDistKinds);
  switch (d.kind) {
    case DistKind::kNormal:
      j["mean"] = d.mean;
      j["std"] = d.std;
      break;
    case DistKind::kLogNormal:
      j["median"] = d.median;
      j["sigma"] = d.sigma;
      break;
    case DistKind::kChoice:
      j["values"] = d.values;
      if (!d.weights.empty()) j["weights"] = d.weights;
      break;
    default:
      break;
  }
  if (d.min) j["min"] = *d.min;
  if (d.max) j["max"] = *d.max;
  return j;
}

std::string describe(const Distribution& d) {
  std::ostringstream out;
  switch (d.kind) {
    case DistKind::kConstant:
      out << d.value;
      break;
    case DistKind::kUniform:
      out << "uniform[" << *d.min << ", " << *d.max << "]";
      break;
    case DistKind::kNormal:
      out << "normal(" << d.mean << ", " << d.std << ")";
      break;
    case DistKind::kLogNormal:
      out << "lognormal(median " << d.median << ", s " << d.sigma << ")";
      break;
    case DistKind::kChoice: {
      out << "choice{";
      for (std::size_t i = 0; i < d.values.size(); ++i) out << (i ? "," : "") << d.values[i];
      out << "}";
      break;
    }
  }
  return out.str();
}

}  // namespace tessera

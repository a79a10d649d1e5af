// What a calibration profile says and covers: its fits printed, and where predicting a Program
// with it leaves the measured ground.
#pragma once

#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/profile.hpp"
#include "shared/program/program.hpp"

namespace tessera {

// Where predicting `program` with `params` leaves the measured ground: classes no fit covers
// (analytic defaults), sizes beyond twice the measured range, other group sizes. One line per
// class; empty when every op is covered or `params` has no fits.
std::vector<std::string> profile_coverage(const CostParams& params, const Program& program,
                                          const ModelSpec& model, const ClusterSpec& cluster);

// One line per fitted parameter set with its samples, residual and range, then the warnings.
std::string format_profile(const Profile& profile);

}  // namespace tessera

// Which modules train and which pass a gradient back, from the model's DAG.
#pragma once

#include <vector>

#include "shared/spec/model_spec.hpp"

namespace tessera {

// Per module: does it train, and does a gradient have to flow through it (some trainable
// module upstream)? Derived from the model DAG, never from a switch.
struct GradientFlow {
  bool trainable = false;
  bool needs_input_grad = false;
  bool backward() const { return trainable || needs_input_grad; }
};
std::vector<GradientFlow> gradient_flow(const ModelSpec& model);

}  // namespace tessera

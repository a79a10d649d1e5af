#include "shared/model/gradient_flow.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <string>

namespace tessera {

std::vector<GradientFlow> gradient_flow(const ModelSpec& model) {
  std::vector<GradientFlow> flow(model.modules.size());
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < model.modules.size(); ++i) index[model.modules[i].name] = i;
  // trainable upstream: some module on a path into this one (itself excluded) trains.
  std::function<bool(std::size_t)> trains_upstream_or_self = [&](std::size_t i) {
    const ModuleSpec& m = model.modules[i];
    if (!m.frozen) return true;
    return std::any_of(m.inputs.begin(), m.inputs.end(), [&](const std::string& in) {
      return trains_upstream_or_self(index.at(in));
    });
  };
  for (std::size_t i = 0; i < model.modules.size(); ++i) {
    const ModuleSpec& m = model.modules[i];
    flow[i].trainable = !m.frozen;
    flow[i].needs_input_grad =
        std::any_of(m.inputs.begin(), m.inputs.end(),
                    [&](const std::string& in) { return trains_upstream_or_self(index.at(in)); });
  }
  return flow;
}

}  // namespace tessera

// Small helpers the Worker's files share (runtime.hpp declares the Worker; its methods live in
// runtime.cpp, the interpreter, and worker_*.cpp by concern).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "shared/base/check.hpp"
#include "shared/layout/rank_groups.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera::exec {

inline int module_index(const ModelSpec& model, const std::string& name) {
  const ModuleSpec* m = find_module(model, name);
  TESSERA_CHECK(m != nullptr, "no module named " + name);
  return static_cast<int>(m - model.modules.data());
}

// The group of `kind` that holds `rank`, or {} when the rank is not in the module.
inline const Group* group_with(const std::vector<Group>& groups, int64_t rank) {
  for (const Group& g : groups)
    if (std::find(g.begin(), g.end(), rank) != g.end()) return &g;
  return nullptr;
}

inline int64_t index_in(const Group* g, int64_t rank) {
  return g == nullptr ? 0 : std::find(g->begin(), g->end(), rank) - g->begin();
}

}  // namespace tessera::exec

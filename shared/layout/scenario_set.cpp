#include "shared/layout/scenario_set.hpp"

#include "shared/layout/plan_source.hpp"

namespace tessera {

std::optional<std::vector<SetAxis>> parse_set_axes(const std::vector<std::string>& pieces,
                                                   Diagnostics& diag) {
  std::vector<std::string> texts;
  for (const std::string& piece : pieces) {
    // The option parser splits vector options on commas: a piece without '=' continues the
    // previous one.
    if (piece.find('=') == std::string::npos && !texts.empty())
      texts.back() += "," + piece;
    else
      texts.push_back(piece);
  }
  std::vector<SetAxis> axes;
  for (const std::string& set : texts) {
    const std::size_t eq = set.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == set.size()) {
      diag.error("--set", "", "needs json.path=v1,v2,..., got '" + set + "'");
      return std::nullopt;
    }
    SetAxis axis{set.substr(0, eq), {}};
    // Values are separated by commas outside brackets, braces and strings: `[1,2],[4]` is two
    // lists.
    std::vector<std::string> values{""};
    int depth = 0;
    bool quoted = false;
    for (const char ch : set.substr(eq + 1)) {
      if (ch == '"') quoted = !quoted;
      if (!quoted && (ch == '[' || ch == '{')) ++depth;
      if (!quoted && (ch == ']' || ch == '}')) --depth;
      if (ch == ',' && depth == 0 && !quoted)
        values.emplace_back();
      else
        values.back() += ch;
    }
    for (const std::string& v : values) {
      try {
        axis.values.push_back(Json::parse(v));
      } catch (const Json::exception&) {
        axis.values.push_back(Json(v));
      }
    }
    axes.push_back(axis);
  }
  return axes;
}

std::optional<Json> parse_set_point(const std::vector<std::string>& pieces, Diagnostics& diag) {
  const std::optional<std::vector<SetAxis>> axes = parse_set_axes(pieces, diag);
  if (!axes) return std::nullopt;
  Json point = Json::object();
  for (const SetAxis& axis : *axes) {
    if (axis.values.size() != 1) {
      diag.error("--set " + axis.path, "", "one value here, not a list");
      return std::nullopt;
    }
    point[axis.path] = axis.values.front();
  }
  return point;
}

std::optional<Scenario> scenario_at(const Scenario& s, const Json& point, Diagnostics& diag) {
  if (point.empty()) return s;
  Json j = inline_scenario_json(s);
  for (const auto& item : point.items()) {
    const std::string problem = set_json_path(j, item.key(), item.value());
    if (!problem.empty()) {
      diag.error("--set", item.key(), problem);
      return std::nullopt;
    }
  }
  Diagnostics local;
  auto at = read_scenario(j, s.file, local);
  if (!at) {
    for (const Diagnostic& d : local.errors())
      diag.error("--set " + point.dump(), d.path, d.message);
    return std::nullopt;
  }
  return at;
}

std::optional<Scenario> load_scenario_at(const std::string& file, const std::string& plan_spec,
                                         const Json& point, Diagnostics& diag) {
  if (point.empty()) return load_scenario_with_plan(file, plan_spec, diag);
  std::optional<Scenario> loaded = load_scenario(file, diag);
  if (!loaded) return std::nullopt;
  // The plan first, then the changes; the result is validated whole.
  std::optional<Scenario> planned = with_plan(std::move(*loaded), plan_spec, diag, false);
  if (!planned) return std::nullopt;
  std::optional<Scenario> at = scenario_at(*planned, point, diag);
  if (at) at->plan_ref = planned->plan_ref;
  return at;
}

}  // namespace tessera

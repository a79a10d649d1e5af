#include "shared/search_space.hpp"

namespace tessera {

SearchSpace read_search_space(const Json& json, const std::string& file, const std::string& path,
                              Diagnostics& diag) {
  SearchSpace s;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return s;
  if (const Json* v = r.find("placements")) {
    if (!v->is_array() || v->empty()) {
      r.error("placements", "expected a non-empty array of placements");
    } else {
      s.placements.clear();
      for (std::size_t i = 0; i < v->size(); ++i) {
        Placement p{};
        if (read_enum((*v)[i], file, index_path(r.path_of("placements"), i), p, kPlacements, diag))
          s.placements.push_back(p);
      }
    }
  }
  const std::pair<const char*, std::vector<int64_t>*> lists[] = {
      {"gpus", &s.gpus}, {"tp", &s.tp},   {"cp", &s.cp},
      {"pp", &s.pp},     {"vpp", &s.vpp}, {"micro_batch_sizes", &s.micro_batch_sizes}};
  for (const auto& [key, list] : lists) {
    if (!r.optional(key, *list)) continue;
    if (list->empty() && std::string_view(key) != "gpus") r.error(key, "must not be empty");
    for (std::size_t i = 0; i < list->size(); ++i)
      if ((*list)[i] < 1) diag.error(file, index_path(r.path_of(key), i), "must be >= 1");
  }
  if (const Json* v = r.find("recompute")) {
    if (!v->is_array() || v->empty()) {
      r.error("recompute", "expected a non-empty array of none, selective, full");
    } else {
      s.recompute.clear();
      for (std::size_t i = 0; i < v->size(); ++i) {
        Recompute x{};
        if (read_enum((*v)[i], file, index_path(r.path_of("recompute"), i), x, kRecomputes, diag))
          s.recompute.push_back(x);
      }
    }
  }
  if (r.optional("top_k", s.top_k)) r.check_positive("top_k", s.top_k);
  r.finish();
  return s;
}

Json to_json(const SearchSpace& s) {
  Json j;
  Json placements = Json::array();
  for (Placement p : s.placements) placements.push_back(enum_name(p, kPlacements));
  j["placements"] = placements;
  j["gpus"] = s.gpus;
  j["tp"] = s.tp;
  j["cp"] = s.cp;
  j["pp"] = s.pp;
  j["vpp"] = s.vpp;
  j["micro_batch_sizes"] = s.micro_batch_sizes;
  Json recompute = Json::array();
  for (Recompute x : s.recompute) recompute.push_back(enum_name(x, kRecomputes));
  j["recompute"] = recompute;
  j["top_k"] = s.top_k;
  return j;
}

}  // namespace tessera

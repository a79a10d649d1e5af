#include "shared/layout/search_space.hpp"

#include <algorithm>

namespace tessera {

namespace {

// An array of enum names under `key` (non-empty unless `may_be_empty`), replacing `out` when
// present.
template <class E>
void read_enum_list(ObjectReader& r, std::string_view key, std::vector<E>& out,
                    const EnumTable<E>& table, bool may_be_empty = false) {
  const Json* v = r.find(key);
  if (v == nullptr) return;
  if (!v->is_array() || (v->empty() && !may_be_empty)) {
    std::string names;
    for (const std::string& n : enum_names(table)) names += (names.empty() ? "" : ", ") + n;
    return r.error(key, std::string(may_be_empty ? "expected an array of "
                                                 : "expected a non-empty array of ") +
                            names);
  }
  out.clear();
  for (std::size_t i = 0; i < v->size(); ++i) {
    E x{};
    if (read_enum((*v)[i], r.file(), index_path(r.path_of(key), i), x, table, r.diagnostics()))
      out.push_back(x);
  }
}

template <class E>
Json enum_list(const std::vector<E>& values, const EnumTable<E>& table) {
  Json j = Json::array();
  for (E x : values) j.push_back(enum_name(x, table));
  return j;
}

}  // namespace

SearchSpace read_search_space(const Json& json, const std::string& file, const std::string& path,
                              Diagnostics& diag) {
  SearchSpace s;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return s;
  read_enum_list(r, "placements", s.placements, kPlacements);
  const std::pair<const char*, std::vector<int64_t>*> lists[] = {
      {"gpus", &s.gpus},
      {"tp", &s.tp},
      {"cp", &s.cp},
      {"pp", &s.pp},
      {"vpp", &s.vpp},
      {"ep", &s.ep},
      {"micro_batch_sizes", &s.micro_batch_sizes},
      {"encoder_pp", &s.encoder_pp},
      {"encoder_cp", &s.encoder_cp}};
  for (const auto& [key, list] : lists) {
    if (!r.optional(key, *list)) continue;
    if (list->empty() && std::string_view(key) != "gpus") r.error(key, "must not be empty");
    for (std::size_t i = 0; i < list->size(); ++i)
      if ((*list)[i] < 1) diag.error(file, index_path(r.path_of(key), i), "must be >= 1");
  }
  if (const Json* v = r.find("etp"); v != nullptr) {
    // Each value "tp" (the experts split as the dense layers) or 1 (whole experts).
    if (!v->is_array() || v->empty()) {
      r.error("etp", "expected a non-empty array of \"tp\" and 1");
    } else {
      s.etp.clear();
      for (std::size_t i = 0; i < v->size(); ++i) {
        const Json& x = (*v)[i];
        if (x.is_string() && x.get<std::string>() == "tp")
          s.etp.push_back(0);
        else if (x.is_number_integer() && x.get<int64_t>() == 1)
          s.etp.push_back(1);
        else
          diag.error(file, index_path(r.path_of("etp"), i), "must be \"tp\" or 1");
      }
    }
  }
  read_enum_list(r, "recompute", s.recompute, kRecomputes);
  read_enum_list(r, "moe_dispatchers", s.moe_dispatchers, kMoeDispatchers);
  for (auto [key, list] : {std::pair{"sequence_parallel", &s.sequence_parallel},
                           std::pair{"distributed_optimizer", &s.distributed_optimizer},
                           std::pair{"fully_sharded", &s.fully_sharded},
                           std::pair{"moe_a2a_overlap", &s.moe_a2a_overlap}}) {
    const Json* v = r.find(key);
    if (v == nullptr) continue;
    if (!v->is_array() || v->empty() ||
        !std::all_of(v->begin(), v->end(), [](const Json& x) { return x.is_boolean(); })) {
      r.error(key, "expected a non-empty array of true and false");
      continue;
    }
    list->clear();
    for (const Json& x : *v) list->push_back(x.get<bool>());
  }
  read_enum_list(r, "stage_splits", s.stage_splits, kStageSplits);
  read_enum_list(r, "fp8", s.fp8, kFp8Recipes);
  r.optional_enum("framework", s.framework, kFrameworks);
  read_enum_list(r, "cp_splits", s.cp_splits, kCpSplits);
  read_enum_list(r, "microbatching", s.microbatching, kMicrobatching);
  read_enum_list(r, "homogeneous_schedules", s.homogeneous_schedules, kSchedules);
  for (std::size_t i = 0; i < s.homogeneous_schedules.size(); ++i)
    if (s.homogeneous_schedules[i] != Schedule::k1F1B &&
        s.homogeneous_schedules[i] != Schedule::kDip)
      diag.error(file, index_path(r.path_of("homogeneous_schedules"), i),
                 "must be 1f1b (interleaved where vpp > 1) or dip");
  read_enum_list(r, "indivisible_heads", s.indivisible_heads, kIndivisibleHeads, true);
  read_enum_list(r, "encoder_data_parallel", s.encoder_data_parallel, kEncoderDataParallel);
  if (r.optional("top_k", s.top_k)) r.check_positive("top_k", s.top_k);
  if (const Json* refine = r.find("refine"); refine != nullptr) {
    ObjectReader rr(*refine, file, r.path_of("refine"), diag);
    if (rr.valid()) {
      if (rr.optional("top", s.refine.top) && s.refine.top < 0)
        rr.error("top", "must be >= 0 (0: no second stage)");
      read_enum_list(rr, "microbatching", s.refine.microbatching, kMicrobatching, true);
      rr.optional("dip", s.refine.dip);
      read_enum_list(rr, "cp_splits", s.refine.cp_splits, kCpSplits, true);
      rr.finish();
    }
  }
  r.finish();
  return s;
}

Json to_json(const SearchSpace& s) {
  Json j;
  j["placements"] = enum_list(s.placements, kPlacements);
  j["gpus"] = s.gpus;
  j["tp"] = s.tp;
  j["cp"] = s.cp;
  j["pp"] = s.pp;
  j["vpp"] = s.vpp;
  j["ep"] = s.ep;
  j["etp"] = Json::array();
  for (int64_t v : s.etp) j["etp"].push_back(v == 0 ? Json("tp") : Json(v));
  j["micro_batch_sizes"] = s.micro_batch_sizes;
  j["encoder_pp"] = s.encoder_pp;
  j["encoder_cp"] = s.encoder_cp;
  j["moe_dispatchers"] = enum_list(s.moe_dispatchers, kMoeDispatchers);
  j["moe_a2a_overlap"] = s.moe_a2a_overlap;
  j["recompute"] = enum_list(s.recompute, kRecomputes);
  j["sequence_parallel"] = s.sequence_parallel;
  j["distributed_optimizer"] = s.distributed_optimizer;
  j["fully_sharded"] = s.fully_sharded;
  j["fp8"] = enum_list(s.fp8, kFp8Recipes);
  j["framework"] = enum_name(s.framework, kFrameworks);
  j["stage_splits"] = enum_list(s.stage_splits, kStageSplits);
  j["cp_splits"] = enum_list(s.cp_splits, kCpSplits);
  j["microbatching"] = enum_list(s.microbatching, kMicrobatching);
  j["homogeneous_schedules"] = enum_list(s.homogeneous_schedules, kSchedules);
  j["indivisible_heads"] = enum_list(s.indivisible_heads, kIndivisibleHeads);
  j["encoder_data_parallel"] = enum_list(s.encoder_data_parallel, kEncoderDataParallel);
  j["top_k"] = s.top_k;
  j["refine"] = {{"top", s.refine.top},
                 {"microbatching", enum_list(s.refine.microbatching, kMicrobatching)},
                 {"dip", s.refine.dip},
                 {"cp_splits", enum_list(s.refine.cp_splits, kCpSplits)}};
  return j;
}

}  // namespace tessera

#include "shared/layout/scenario.hpp"

#include <filesystem>

namespace tessera {

namespace {

namespace fs = std::filesystem;

std::string directory_of(const std::string& file) {
  const fs::path parent = fs::path(file).parent_path();
  return parent.empty() ? "." : parent.string();
}

// A part given inline or as a path. Calls `read(json, file, path)` with the right origin.
template <class T, class Reader>
std::optional<T> read_part(ObjectReader& r, std::string_view key, std::string& ref, bool required,
                           Reader read) {
  const Json* v = r.find(key);
  if (v == nullptr) {
    if (required) r.missing(key);
    return std::nullopt;
  }
  if (v->is_string()) {
    ref = v->get<std::string>();
    std::string target;
    const auto json = read_referenced_json(ref, r.file(), r.path_of(key), r.diagnostics(), &target);
    if (!json) return std::nullopt;
    return read(*json, target, std::string{});
  }
  return read(*v, r.file(), r.path_of(key));
}

// Which modalities a workload can draw, and a path to blame.
struct MediaUse {
  Modality modality;
  const char* name;
};

}  // namespace

std::optional<Scenario> read_scenario(const Json& json, const std::string& file,
                                      Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  Scenario s;
  s.file = file;
  ObjectReader r(json, file, "", diag);
  if (!r.valid()) return std::nullopt;
  r.optional("name", s.name);
  r.optional("description", s.description);
  Diagnostics& d = diag;
  if (auto m = read_part<ModelSpec>(r, "model", s.model_ref, true,
                                    [&](const Json& j, const std::string& f, const std::string& p) {
                                      return read_model(j, f, p, d);
                                    }))
    s.model = *m;
  if (r.optional("freeze", s.freeze))
    for (std::size_t i = 0; i < s.freeze.size(); ++i) {
      ModuleSpec* module = nullptr;
      for (ModuleSpec& candidate : s.model.modules)
        if (candidate.name == s.freeze[i]) module = &candidate;
      if (module == nullptr && !s.model.modules.empty())
        diag.error(file, "freeze[" + std::to_string(i) + "]",
                   "no module named '" + s.freeze[i] + "' in model " + s.model.name);
      else if (module != nullptr)
        module->frozen = true;
    }
  if (auto w =
          read_part<WorkloadSpec>(r, "workload", s.workload_ref, true,
                                  [&](const Json& j, const std::string& f, const std::string& p) {
                                    return read_workload(j, f, p, directory_of(f), d);
                                  }))
    s.workload = *w;
  if (auto c =
          read_part<ClusterSpec>(r, "cluster", s.cluster_ref, true,
                                 [&](const Json& j, const std::string& f, const std::string& p) {
                                   return read_cluster(j, f, p, d);
                                 }))
    s.cluster = *c;
  s.plan = read_part<ParallelPlan>(r, "plan", s.plan_ref, false,
                                   [&](const Json& j, const std::string& f, const std::string& p) {
                                     return read_plan(j, f, p, d);
                                   });
  if (const Json* v = r.find("search")) s.search = read_search_space(*v, file, "search", diag);
  if (const Json* v = r.find("published")) {
    ObjectReader pr(*v, file, "published", diag);
    Published p;
    if (pr.required("step_s", p.step_s)) pr.check_positive("step_s", p.step_s);
    pr.required("metric", p.metric);
    pr.required("source", p.source);
    pr.required("source_id", p.source_id);
    pr.optional("series", p.series);
    pr.optional("holdout", p.holdout);
    if (pr.optional("iterations", p.iterations) && (p.iterations < 1 || p.iterations > 1024))
      pr.error("iterations", "must be 1 to 1024, got " + std::to_string(p.iterations));
    pr.finish();
    s.published = p;
  }
  r.finish();
  if (s.name.empty()) s.name = fs::path(file).stem().string();
  // Cross-part rules only make sense when every part read cleanly.
  if (diag.errors().size() == before) validate_scenario(s, diag);
  if (diag.errors().size() != before) return std::nullopt;
  return s;
}

std::optional<Scenario> load_scenario(const std::string& file, Diagnostics& diag) {
  const auto json = read_json_file(file, diag);
  if (!json) return std::nullopt;
  return read_scenario(*json, file, diag);
}

void validate_scenario(const Scenario& s, Diagnostics& diag) {
  if (find_llm(s.model) == nullptr)
    diag.error(s.file, "model", "model " + s.model.name + " has no llm module to train");

  // Every modality the workload can produce needs an encoder.
  const std::string workload_file = s.workload_ref.empty() ? s.file : s.workload_ref;
  const std::string workload_path = s.workload_ref.empty() ? "workload" : "";
  for (std::size_t i = 0; i < s.workload.sources.size(); ++i) {
    const SampleSource& source = s.workload.sources[i];
    const std::string at = s.workload.mixture() ? index_path(join_path(workload_path, "samples"), i)
                                                : join_path(workload_path, "samples");
    const std::pair<const std::optional<MediaDistribution>*, MediaUse> uses[] = {
        {&source.image, {Modality::kImage, "image"}},
        {&source.audio, {Modality::kAudio, "audio"}},
        {&source.video, {Modality::kVideo, "video"}}};
    for (const auto& [dist, use] : uses) {
      if (*dist && dist_upper_bound((*dist)->count) > 0 &&
          encoder_for(s.model, use.modality) == nullptr)
        diag.error(workload_file, join_path(at, use.name),
                   "workload draws " + std::string(use.name) + " but model " + s.model.name +
                       " has no " + use.name + " encoder");
    }
  }
  for (std::size_t i = 0; i < s.workload.manifest_samples.size(); ++i) {
    const Sample& sample = s.workload.manifest_samples[i];
    for (const auto& [has, use] :
         {std::pair{!sample.images.empty(), MediaUse{Modality::kImage, "image"}},
          std::pair{!sample.audio_seconds.empty(), MediaUse{Modality::kAudio, "audio"}},
          std::pair{!sample.videos.empty(), MediaUse{Modality::kVideo, "video"}}}) {
      if (has && encoder_for(s.model, use.modality) == nullptr) {
        diag.error(s.workload.manifest, "line " + std::to_string(i + 1),
                   "sample has " + std::string(use.name) + " but model " + s.model.name +
                       " has no " + use.name + " encoder");
        return;
      }
    }
  }
  if (s.plan) {
    const std::string plan_file = s.plan_ref.empty() ? s.file : s.plan_ref;
    validate_plan(*s.plan, s.model, s.workload, s.cluster, plan_file,
                  s.plan_ref.empty() ? "plan" : "", diag);
  }
}

Json to_json(const Scenario& s) {
  Json j;
  j["name"] = s.name;
  if (!s.description.empty()) j["description"] = s.description;
  j["model"] = s.model_ref.empty() ? to_json(s.model) : Json(s.model_ref);
  j["workload"] = s.workload_ref.empty() ? to_json(s.workload) : Json(s.workload_ref);
  j["cluster"] = s.cluster_ref.empty() ? to_json(s.cluster) : Json(s.cluster_ref);
  if (!s.freeze.empty()) j["freeze"] = s.freeze;
  if (s.plan) j["plan"] = s.plan_ref.empty() ? to_json(*s.plan) : Json(s.plan_ref);
  if (s.search) j["search"] = to_json(*s.search);
  if (s.published) {
    Json p{{"step_s", s.published->step_s},
           {"metric", s.published->metric},
           {"source", s.published->source},
           {"source_id", s.published->source_id}};
    if (!s.published->series.empty()) p["series"] = s.published->series;
    if (s.published->holdout) p["holdout"] = true;
    if (s.published->iterations != 1) p["iterations"] = s.published->iterations;
    j["published"] = p;
  }
  return j;
}

Json inline_scenario_json(const Scenario& s) {
  Json j = to_json(s);
  j["model"] = to_json(s.model);
  Json workload = to_json(s.workload);
  if (!s.workload.manifest.empty()) {
    // The manifest path is relative to the file that named it; make it absolute.
    const fs::path named =
        s.workload_ref.empty() ? fs::path(s.file) : fs::path(directory_of(s.file)) / s.workload_ref;
    const fs::path manifest(s.workload.manifest);
    workload["manifest"] =
        manifest.is_absolute()
            ? manifest.string()
            : fs::absolute(fs::path(directory_of(named.string())) / manifest).string();
  }
  j["workload"] = workload;
  j["cluster"] = to_json(s.cluster);
  if (s.plan) j["plan"] = to_json(*s.plan);
  return j;
}

std::string set_json_path(Json& root, const std::string& path, const Json& value) {
  Json* at = &root;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    const std::size_t dot = path.find('.', begin);
    std::string part =
        path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
    const bool last = dot == std::string::npos;
    // "modules[2]" -> key "modules", index 2 (several indices allowed).
    std::vector<std::size_t> indices;
    while (!part.empty() && part.back() == ']') {
      const std::size_t open = part.rfind('[');
      if (open == std::string::npos) return "malformed index in '" + path + "'";
      try {
        indices.insert(indices.begin(), std::stoul(part.substr(open + 1, part.size() - open - 2)));
      } catch (const std::exception&) {
        return "malformed index in '" + path + "'";
      }
      part = part.substr(0, open);
    }
    if (!at->is_object()) return "'" + path + "': '" + part + "' is not inside an object";
    if (last && indices.empty()) {
      (*at)[part] = value;
      return "";
    }
    // The search space is optional (its defaults apply): setting one of its keys starts it.
    if (!at->contains(part) && at == &root && part == "search" && indices.empty())
      (*at)[part] = Json::object();
    if (!at->contains(part)) return "'" + path + "': no key '" + part + "'";
    at = &(*at)[part];
    for (std::size_t i : indices) {
      if (!at->is_array() || i >= at->size())
        return "'" + path + "': index " + std::to_string(i) + " out of range";
      at = &(*at)[i];
    }
    if (last) {
      *at = value;
      return "";
    }
    begin = dot + 1;
  }
  return "empty path";
}

std::optional<ModelSpec> load_model(const std::string& file, Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  const auto json = read_json_file(file, diag);
  if (!json) return std::nullopt;
  ModelSpec m = read_model(*json, file, "", diag);
  if (diag.errors().size() != before) return std::nullopt;
  return m;
}

std::optional<ClusterSpec> load_cluster(const std::string& file, Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  const auto json = read_json_file(file, diag);
  if (!json) return std::nullopt;
  ClusterSpec c = read_cluster(*json, file, "", diag);
  if (diag.errors().size() != before) return std::nullopt;
  return c;
}

}  // namespace tessera

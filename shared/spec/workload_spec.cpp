#include "shared/spec/workload_spec.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tessera {

namespace {

std::string number_text(double x) {
  std::ostringstream out;
  out.precision(12);
  out << x;
  return out.str();
}

void read_dist(ObjectReader& r, std::string_view key, Distribution& out, bool required,
               double limit) {
  const Json* v = r.find(key);
  if (v == nullptr) {
    if (required) r.missing(key);
    return;
  }
  if (read_distribution(*v, r.file(), r.path_of(key), out, /*non_negative=*/true, r.diagnostics()))
    if (const double top = dist_upper_bound(out); std::isfinite(top) && top > limit)
      r.error(key,
              "draws up to " + number_text(top) + "; at most " + number_text(limit) + " is taken");
}

std::optional<MediaDistribution> read_media(ObjectReader& parent, std::string_view key,
                                            Modality modality) {
  const Json* v = parent.find(key);
  if (v == nullptr) return std::nullopt;
  ObjectReader r(*v, parent.file(), parent.path_of(key), parent.diagnostics());
  if (!r.valid()) return std::nullopt;
  MediaDistribution m;
  read_dist(r, "count", m.count, true, kMaxMediaItems);
  if (modality == Modality::kImage || modality == Modality::kVideo) {
    read_dist(r, "width", m.width, true, kMaxMediaSide);
    read_dist(r, "height", m.height, true, kMaxMediaSide);
  }
  if (modality == Modality::kVideo) read_dist(r, "frames", m.frames, true, kMaxFrames);
  if (modality == Modality::kAudio) read_dist(r, "seconds", m.seconds, true, kMaxAudioSeconds);
  r.finish();
  for (const auto& [name, d] : {std::pair{"width", &m.width}, std::pair{"height", &m.height},
                                std::pair{"frames", &m.frames}})
    if (r.has(name) && dist_lower_bound(*d) < 1) r.error(name, "draws must be >= 1; give min >= 1");
  return m;
}

Json to_json(const MediaDistribution& m, Modality modality) {
  Json j;
  j["count"] = to_json(m.count);
  if (modality == Modality::kImage || modality == Modality::kVideo) {
    j["width"] = to_json(m.width);
    j["height"] = to_json(m.height);
  }
  if (modality == Modality::kVideo) j["frames"] = to_json(m.frames);
  if (modality == Modality::kAudio) j["seconds"] = to_json(m.seconds);
  return j;
}

void load_manifest(WorkloadSpec& w, const std::string& manifest_path, ObjectReader& r) {
  std::ifstream in(manifest_path);
  if (!in) {
    r.error("manifest", "cannot read '" + manifest_path + "'");
    return;
  }
  std::string line;
  int64_t number = 0;
  Diagnostics& diag = r.diagnostics();
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "line " + std::to_string(number);
    Diagnostics local;
    const auto json = parse_json_text(line, manifest_path + ":" + std::to_string(number), local);
    Sample s;
    if (json && read_sample(*json, manifest_path, where, s, local)) w.manifest_samples.push_back(s);
    diag.append(local);
    if (diag.errors().size() > 50) {
      r.error("manifest", "too many errors in '" + manifest_path + "', stopped at " + where);
      return;
    }
  }
  if (w.manifest_samples.empty() && diag.ok())
    r.error("manifest", "'" + manifest_path + "' has no samples");
}

// The distributions of one sample source; finishes the reader (unknown keys are errors).
void read_source(ObjectReader& s, SampleSource& out) {
  read_dist(s, "text_tokens", out.text_tokens, true, kMaxTextTokens);
  out.image = read_media(s, "image", Modality::kImage);
  out.audio = read_media(s, "audio", Modality::kAudio);
  out.video = read_media(s, "video", Modality::kVideo);
  s.finish();
}

Json to_json(const SampleSource& source, bool mixture) {
  Json s;
  if (mixture) {
    s["name"] = source.name;
    s["weight"] = source.weight;
    if (source.group != source.name) s["group"] = source.group;
  }
  s["text_tokens"] = to_json(source.text_tokens);
  if (source.image) s["image"] = to_json(*source.image, Modality::kImage);
  if (source.audio) s["audio"] = to_json(*source.audio, Modality::kAudio);
  if (source.video) s["video"] = to_json(*source.video, Modality::kVideo);
  return s;
}

}  // namespace

bool read_sample(const Json& json, const std::string& file, const std::string& path, Sample& out,
                 Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return false;
  Sample s;
  if (r.required("text_tokens", s.text_tokens) &&
      r.check_at_least<int64_t>("text_tokens", s.text_tokens, 0) && s.text_tokens > kMaxTextTokens)
    r.error("text_tokens", "at most " + number_text(kMaxTextTokens) + " tokens are taken");
  if (const Json* images = r.find("images")) {
    std::vector<std::vector<int64_t>> sizes;
    if (read_value(*images, file, r.path_of("images"), sizes, diag)) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        if (sizes[i].size() != 2 || sizes[i][0] < 1 || sizes[i][1] < 1 ||
            sizes[i][0] > kMaxMediaSide || sizes[i][1] > kMaxMediaSide) {
          diag.error(file, index_path(r.path_of("images"), i),
                     "expected [width, height], each 1 to " + number_text(kMaxMediaSide));
          continue;
        }
        s.images.push_back({sizes[i][0], sizes[i][1]});
      }
    }
  }
  if (r.optional("audio_seconds", s.audio_seconds))
    for (std::size_t i = 0; i < s.audio_seconds.size(); ++i)
      if (s.audio_seconds[i] < 0 || s.audio_seconds[i] > kMaxAudioSeconds)
        diag.error(file, index_path(r.path_of("audio_seconds"), i),
                   "must be 0 to " + number_text(kMaxAudioSeconds));
  if (const Json* videos = r.find("videos")) {
    std::vector<std::vector<int64_t>> clips;
    if (read_value(*videos, file, r.path_of("videos"), clips, diag)) {
      for (std::size_t i = 0; i < clips.size(); ++i) {
        if (clips[i].size() != 3 || clips[i][0] < 1 || clips[i][1] < 1 || clips[i][2] < 1 ||
            clips[i][0] > kMaxFrames || clips[i][1] > kMaxMediaSide ||
            clips[i][2] > kMaxMediaSide) {
          diag.error(file, index_path(r.path_of("videos"), i),
                     "expected [frames, width, height] >= 1 (at most " + number_text(kMaxFrames) +
                         " frames of " + number_text(kMaxMediaSide) + " pixels a side)");
          continue;
        }
        s.videos.push_back({clips[i][0], clips[i][1], clips[i][2]});
      }
    }
  }
  r.finish();
  if (diag.errors().size() != before) return false;
  out = s;
  return true;
}

Json to_json(const Sample& s) {
  Json j;
  j["text_tokens"] = s.text_tokens;
  if (!s.images.empty()) {
    Json images = Json::array();
    for (const ImageItem& i : s.images) images.push_back({i.width, i.height});
    j["images"] = images;
  }
  if (!s.audio_seconds.empty()) j["audio_seconds"] = s.audio_seconds;
  if (!s.videos.empty()) {
    Json videos = Json::array();
    for (const VideoItem& v : s.videos) videos.push_back({v.frames, v.width, v.height});
    j["videos"] = videos;
  }
  return j;
}

WorkloadSpec read_workload(const Json& json, const std::string& file, const std::string& path,
                           const std::string& base_dir, Diagnostics& diag) {
  WorkloadSpec w;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return w;
  if (r.required("global_batch", w.global_batch) &&
      r.check_positive("global_batch", w.global_batch) && w.global_batch > kMaxGlobalBatch)
    r.error("global_batch", std::to_string(w.global_batch) + " samples; at most " +
                                std::to_string(kMaxGlobalBatch) + " are taken");
  if (r.required("max_seq_len", w.max_seq_len) && r.check_positive("max_seq_len", w.max_seq_len) &&
      w.max_seq_len > (int64_t{1} << 26))
    r.error("max_seq_len", std::to_string(w.max_seq_len) + " tokens; at most 67108864 are taken");
  r.optional("description", w.description);
  r.optional("packing", w.packing);
  r.optional("seed", w.seed);
  if (r.optional("router_skew", w.router_skew) && !(w.router_skew >= 0 && w.router_skew <= 8))
    r.error("router_skew", "must be in [0, 8], got " + std::to_string(w.router_skew));
  const bool has_manifest = r.optional("manifest", w.manifest);
  const bool has_samples = r.has("samples");
  if (has_manifest == has_samples) {
    r.error("samples", has_manifest ? "give either samples or manifest, not both"
                                    : "required: samples (distributions) or manifest (JSONL file)");
  }
  r.optional("group_batches", w.group_batches);
  const bool mixture = has_samples && r.find("samples")->is_array();
  if (has_samples) {
    const Json& samples = *r.find("samples");
    if (mixture) {
      // A mixture: named sources with positive weights.
      if (samples.empty()) r.error("samples", "a mixture needs at least one source");
      for (std::size_t i = 0; i < samples.size(); ++i) {
        const std::string at = index_path(r.path_of("samples"), i);
        ObjectReader s(samples[i], file, at, diag);
        if (!s.valid()) continue;
        SampleSource source;
        if (s.required("name", source.name) && source.name.empty())
          s.error("name", "must not be empty");
        if (s.required("weight", source.weight) && !(source.weight > 0 && source.weight < 1e12))
          s.error("weight", "must be above 0 (and below 1e12)");
        if (s.optional("group", source.group) && source.group.empty())
          s.error("group", "must not be empty");
        if (source.group.empty()) source.group = source.name;
        read_source(s, source);
        for (const SampleSource& other : w.sources)
          if (other.name == source.name && !source.name.empty())
            s.error("name", "'" + source.name + "' names an earlier source too");
        w.sources.push_back(std::move(source));
      }
    } else {
      ObjectReader s(samples, file, r.path_of("samples"), diag);
      if (s.valid()) {
        SampleSource source;
        read_source(s, source);
        w.sources.push_back(std::move(source));
      }
    }
  }
  if (w.group_batches && !mixture)
    r.error("group_batches", "needs samples given as a mixture (an array of sources)");
  if (has_manifest && !w.manifest.empty()) {
    const std::filesystem::path p(w.manifest);
    load_manifest(w, p.is_absolute() ? w.manifest : (std::filesystem::path(base_dir) / p).string(),
                  r);
  }
  r.finish();
  return w;
}

Json to_json(const WorkloadSpec& w) {
  Json j;
  if (!w.description.empty()) j["description"] = w.description;
  j["global_batch"] = w.global_batch;
  j["max_seq_len"] = w.max_seq_len;
  j["packing"] = w.packing;
  j["seed"] = w.seed;
  if (w.router_skew > 0) j["router_skew"] = w.router_skew;
  if (!w.manifest.empty()) {
    j["manifest"] = w.manifest;
  } else if (!w.mixture()) {
    j["samples"] = to_json(w.sources.at(0), false);
  } else {
    Json s = Json::array();
    for (const SampleSource& source : w.sources) s.push_back(to_json(source, true));
    j["samples"] = s;
    if (w.group_batches) j["group_batches"] = true;
  }
  return j;
}

}  // namespace tessera

// WorkloadSpec: what the training data looks like — batch size, sequence length, and where
// samples come from (parametric distributions per modality, or a JSONL manifest).
// Sample/Batch are the drawn data; draw_batch() is deterministic for (seed, iteration).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/spec/distribution.hpp"
#include "shared/spec/model_spec.hpp"

namespace tessera {

// Media items of one kind per sample: how many, and their size.
struct MediaDistribution {
  Distribution count;    // items per sample
  Distribution width;    // image/video pixels
  Distribution height;   // image/video pixels
  Distribution frames;   // video frames per clip
  Distribution seconds;  // audio clip length
  bool operator==(const MediaDistribution&) const = default;
};

struct ImageItem {
  int64_t width = 0;
  int64_t height = 0;
  bool operator==(const ImageItem&) const = default;
};
struct VideoItem {
  int64_t frames = 0;
  int64_t width = 0;
  int64_t height = 0;
  bool operator==(const VideoItem&) const = default;
};

// One training sample: its text and its raw media. Token counts depend on the model's encoders
// and are computed by sample_tokens() (batch.hpp).
struct Sample {
  int64_t text_tokens = 0;
  std::vector<ImageItem> images;
  std::vector<double> audio_seconds;
  std::vector<VideoItem> videos;
  bool operator==(const Sample&) const = default;
};

// The largest value of each sample quantity Tessera takes, far above any real data set and far
// below where token arithmetic (int64) or a sample's memory would overflow. A file's value or
// explicit bound above its limit is refused; a distribution without an upper bound (normal,
// lognormal without max) has its draws capped there.
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 24;
inline constexpr double kMaxTextTokens = 1 << 24;
inline constexpr double kMaxMediaItems = 4096;    // images, clips or recordings per sample
inline constexpr double kMaxMediaSide = 1 << 16;  // pixels
inline constexpr double kMaxFrames = 1 << 16;
inline constexpr double kMaxAudioSeconds = 86400;

// One kind of sample: the distributions its text and media are drawn from. Absent media kinds
// draw nothing.
struct SampleSource {
  std::string name;   // a mixture's sources are named
  double weight = 1;  // a mixture draws each source in proportion to its weight
  std::string group;  // with WorkloadSpec::group_batches, sources of one group share batches
  Distribution text_tokens;
  std::optional<MediaDistribution> image;
  std::optional<MediaDistribution> audio;
  std::optional<MediaDistribution> video;
  bool operator==(const SampleSource&) const = default;
};

struct WorkloadSpec {
  std::string description;   // where the distributions come from
  int64_t global_batch = 0;  // samples per iteration
  int64_t max_seq_len = 0;   // LLM sequence length cap (tokens)
  bool packing = false;      // samples packed back to back into max_seq_len sequences
  uint64_t seed = 0;
  // How unevenly a mixture-of-experts router spreads tokens: expert popularity follows a Zipf law
  // of this exponent over a random order of each layer's experts (drawn from `seed`); 0: every
  // expert gets its even share. See expert_load.hpp.
  double router_skew = 0;
  // Parametric: one source, or a weighted mixture of several (a data set's components).
  std::vector<SampleSource> sources;
  // A mixture draws each iteration's whole batch from the sources of one group (a source's
  // group defaults to its name), the group chosen by its sources' total weight: as LLaVA's
  // `group_by_modality_length` sampler keeps text-only and image samples in batches of their own.
  bool group_batches = false;
  // Samples given as a mixture (an array of named sources), even of one source.
  bool mixture() const {
    return sources.size() > 1 || (sources.size() == 1 && !sources[0].name.empty());
  }
  // Manifest source: a JSONL file, one sample per line (docs/FORMATS.md). When set, the
  // parametric fields are unused. `manifest` is as written; `manifest_samples` is its content.
  std::string manifest;
  std::vector<Sample> manifest_samples;

  bool operator==(const WorkloadSpec&) const = default;
};

// Reads a workload; `base_dir` resolves a relative manifest path.
WorkloadSpec read_workload(const Json& json, const std::string& file, const std::string& path,
                           const std::string& base_dir, Diagnostics& diag);
Json to_json(const WorkloadSpec& workload);

// Parses one manifest line (JSON object) into a Sample.
bool read_sample(const Json& json, const std::string& file, const std::string& path, Sample& out,
                 Diagnostics& diag);
Json to_json(const Sample& sample);

}  // namespace tessera

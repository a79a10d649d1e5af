#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include "shared/model/batch.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const char* kWorkload = R"({"global_batch": 64, "max_seq_len": 4096, "seed": 9, "samples": {
  "text_tokens": {"dist": "lognormal", "median": 200, "sigma": 0.7, "min": 8, "max": 2048},
  "image": {"count": {"dist": "choice", "values": [0, 1, 4]}, "width": {"dist": "uniform", "min": 224, "max": 1024}, "height": 448},
  "audio": {"count": 1, "seconds": {"dist": "uniform", "min": 1, "max": 30}}}})";

WorkloadSpec parse(const char* text, Diagnostics& diag, const std::string& dir = ".") {
  return read_workload(Json::parse(text), "w.json", "workload", dir, diag);
}

}  // namespace

TEST_CASE("draw_batch is deterministic per (seed, iteration) and varies across iterations") {
  Diagnostics diag;
  const WorkloadSpec w = parse(kWorkload, diag);
  REQUIRE(diag.ok());
  const Batch a = draw_batch(w, 3), b = draw_batch(w, 3), c = draw_batch(w, 4);
  CHECK(a.samples == b.samples);
  CHECK(a.samples != c.samples);
  REQUIRE(a.samples.size() == 64);
  for (const Sample& s : a.samples) {
    CHECK((s.text_tokens >= 8 && s.text_tokens <= 2048));
    CHECK((s.images.size() == 0 || s.images.size() == 1 || s.images.size() == 4));
    for (const ImageItem& i : s.images)
      CHECK((i.width >= 224 && i.width <= 1024 && i.height == 448));
    CHECK(s.audio_seconds.size() == 1);
  }
  // A sample does not depend on the batch size: the first samples agree.
  WorkloadSpec smaller = w;
  smaller.global_batch = 8;
  const Batch d = draw_batch(smaller, 3);
  CHECK(std::equal(d.samples.begin(), d.samples.end(), a.samples.begin()));
  // The draw's literal values are pinned below ("a one-source workload draws as before").
}

TEST_CASE(
    "manifest workloads read JSONL, shuffle per epoch and cover every sample once per epoch") {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-manifest-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "samples.jsonl");
    for (int i = 0; i < 10; ++i)
      out << R"({"text_tokens": )" << (100 + i) << R"(, "images": [[336, 336]]})"
          << "\n";
    out << "\n";  // blank lines are skipped
  }
  Diagnostics diag;
  const WorkloadSpec w =
      parse(R"({"global_batch": 5, "max_seq_len": 512, "manifest": "samples.jsonl"})", diag,
            dir.string());
  REQUIRE(diag.ok());
  REQUIRE(w.manifest_samples.size() == 10);
  std::vector<int64_t> epoch;
  for (int it = 0; it < 2; ++it)
    for (const Sample& s : draw_batch(w, it).samples) epoch.push_back(s.text_tokens);
  std::sort(epoch.begin(), epoch.end());
  for (int i = 0; i < 10; ++i) CHECK(epoch[static_cast<std::size_t>(i)] == 100 + i);

  { std::ofstream(dir / "bad.jsonl") << "{\"text_tokens\": 5}\n{\"text_tokens\": -1}\n{oops\n"; }
  Diagnostics bad;
  parse(R"({"global_batch": 5, "max_seq_len": 512, "manifest": "bad.jsonl"})", bad, dir.string());
  const std::string text = bad.format();
  INFO(text);
  CHECK(text.find("bad.jsonl: line 2.text_tokens: must be >= 0, got -1") != std::string::npos);
  CHECK(text.find("bad.jsonl:3: invalid JSON at line 1, column 2") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("workload errors") {
  Diagnostics diag;
  parse(R"({"global_batch": 0, "max_seq_len": -5, "samples": {"text_tokens": 10, "imag": {}}})",
        diag);
  parse(R"({"global_batch": 4, "max_seq_len": 8})", diag);
  const std::string text = diag.format();
  INFO(text);
  CHECK(text.find("workload.global_batch: must be > 0, got 0") != std::string::npos);
  CHECK(text.find("workload.max_seq_len: must be > 0, got -5") != std::string::npos);
  CHECK(text.find("workload.samples.imag: unknown key (did you mean 'image'?)") !=
        std::string::npos);
  CHECK(text.find("required: samples (distributions) or manifest") != std::string::npos);
}

TEST_CASE("workload quantities past their limits are refused") {
  Diagnostics diag;
  parse(R"({"global_batch": 100000000, "max_seq_len": 8, "samples": {
    "text_tokens": {"dist": "uniform", "min": 1, "max": 6.9e99},
    "image": {"count": 5000, "width": 224, "height": {"dist": "choice", "values": [1, 70000]}}}})",
        diag);
  Sample s;
  read_sample(Json::parse(R"({"text_tokens": 1e9, "images": [[224, 100000]]})"), "m.jsonl",
              "line 1", s, diag);
  const std::string text = diag.format();
  INFO(text);
  CHECK(text.find("workload.global_batch: 100000000 samples; at most 16777216") !=
        std::string::npos);
  CHECK(text.find("workload.samples.text_tokens: draws up to 6.9e+99; at most 16777216") !=
        std::string::npos);
  CHECK(text.find("workload.samples.image.count: draws up to 5000; at most 4096") !=
        std::string::npos);
  CHECK(text.find("workload.samples.image.height: draws up to 70000") != std::string::npos);
  CHECK(text.find("line 1.text_tokens: at most") != std::string::npos);
  CHECK(text.find("line 1.images[0]: expected [width, height], each 1 to 65536") !=
        std::string::npos);
}

TEST_CASE("sample_tokens routes media through the model's encoders") {
  Diagnostics diag;
  ModelSpec model;
  ModuleSpec vision;
  vision.name = "vision";
  vision.role = ModuleRole::kEncoder;
  vision.modality = Modality::kImage;
  vision.patching = Patching{};
  vision.patching->image_size = 336;
  vision.patching->class_token = true;
  model.modules.push_back(vision);
  Sample s;
  s.text_tokens = 100;
  s.images = {{640, 480}, {1024, 1024}};
  const SampleTokens t = sample_tokens(model, s);
  CHECK(t.image_llm == 2 * 576);
  CHECK(t.image_encoder == 2 * 577);
  CHECK(t.llm_sequence == 100 + 2 * 576);
}

namespace {

// Two sources told apart by their constant text lengths; media only in the first.
const char* kMixture = R"({"global_batch": 400, "max_seq_len": 4096, "seed": 5, "samples": [
  {"name": "captions", "weight": 3, "group": "image", "text_tokens": 10, "image": {"count": 1, "width": 336, "height": 336}},
  {"name": "vqa", "weight": 1, "group": "image", "text_tokens": 20, "image": {"count": 1, "width": 336, "height": 336}},
  {"name": "chat", "weight": 1, "text_tokens": 1000}]})";

}  // namespace

TEST_CASE("a mixture draws each source in proportion to its weight") {
  Diagnostics diag;
  const WorkloadSpec w = parse(kMixture, diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  REQUIRE(w.sources.size() == 3);
  CHECK(w.sources[2].group == "chat");  // a source's group defaults to its name
  std::map<int64_t, int> drawn;
  for (int it = 0; it < 5; ++it)
    for (const Sample& s : draw_batch(w, it).samples) {
      ++drawn[s.text_tokens];
      CHECK(s.images.size() == (s.text_tokens == 1000 ? 0u : 1u));
    }
  // 2,000 samples at 3:1:1; each share within five standard deviations.
  CHECK(std::abs(drawn[10] - 1200) < 5 * 22);
  CHECK(std::abs(drawn[20] - 400) < 5 * 18);
  CHECK(std::abs(drawn[1000] - 400) < 5 * 18);
  // Read back from its JSON, the workload is the same.
  Diagnostics again;
  CHECK(read_workload(to_json(w), "w.json", "workload", ".", again) == w);
  CHECK(again.ok());
}

TEST_CASE("group_batches: every batch comes from one group, chosen by the group's weight") {
  Diagnostics diag;
  Json j = Json::parse(kMixture);
  j["group_batches"] = true;
  j["global_batch"] = 16;
  const WorkloadSpec w = read_workload(j, "w.json", "workload", ".", diag);
  REQUIRE(diag.ok());
  int chat_batches = 0, mixed_image_batches = 0;
  for (int it = 0; it < 400; ++it) {
    std::set<int64_t> lengths;
    for (const Sample& s : draw_batch(w, it).samples) lengths.insert(s.text_tokens);
    if (lengths.count(1000) != 0) {
      CHECK(lengths.size() == 1);  // text-only samples never share a batch with images
      ++chat_batches;
    } else if (lengths.size() == 2) {
      ++mixed_image_batches;  // within a group, its sources mix
    }
  }
  CHECK(std::abs(chat_batches - 80) < 5 * 8);  // the chat group holds 1/5 of the weight
  CHECK(mixed_image_batches > 250);
  Diagnostics again;
  CHECK(read_workload(to_json(w), "w.json", "workload", ".", again) == w);
}

TEST_CASE("a one-source workload draws as before: pinned values") {
  Diagnostics diag;
  const WorkloadSpec w = parse(kWorkload, diag);
  REQUIRE(diag.ok());
  const Batch b = draw_batch(w, 3);
  // Literal values: a change of the generator, of the distributions' sampling or of the
  // mixture's pick reaching one-source workloads shows up here.
  CHECK(b.samples[0].text_tokens == 485);
  CHECK(b.samples[1].text_tokens == 200);
  CHECK(b.samples[0].images.size() == 1);
  CHECK(b.samples[63].text_tokens == 292);
}

TEST_CASE("mixture errors name the source and key") {
  Diagnostics diag;
  parse(
      R"({"global_batch": 4, "max_seq_len": 8, "group_batches": true, "samples": {"text_tokens": 4}})",
      diag);
  parse(R"({"global_batch": 4, "max_seq_len": 8, "samples": [
    {"name": "a", "weight": 0, "text_tokens": 4},
    {"name": "a", "weight": 1, "text_tokens": 4, "group": ""},
    {"weight": 1, "text_tokens": 4, "imag": {}}]})",
        diag);
  const std::string text = diag.format();
  INFO(text);
  CHECK(text.find("workload.group_batches: needs samples given as a mixture") != std::string::npos);
  CHECK(text.find("workload.samples[0].weight: must be above 0") != std::string::npos);
  CHECK(text.find("workload.samples[1].name: 'a' names an earlier source too") !=
        std::string::npos);
  CHECK(text.find("workload.samples[1].group: must not be empty") != std::string::npos);
  CHECK(text.find("workload.samples[2].name: required key is missing") != std::string::npos);
  CHECK(text.find("workload.samples[2].imag: unknown key") != std::string::npos);
}

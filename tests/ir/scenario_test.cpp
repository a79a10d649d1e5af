#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include "shared/layout/scenario.hpp"
#include "shared/model/batch.hpp"
#include "shared/model/model_math.hpp"
#include "shared/search/scenario_report.hpp"

using namespace tessera;
namespace fs = std::filesystem;

static const std::string kScenarios = std::string(TESSERA_SOURCE_DIR) + "/scenarios";

TEST_CASE("every library model matches its published parameter count") {
  // A reference is exact (a safetensors total, or the sum of exact component counts and computed
  // projectors) unless it holds a rounded published size: then the model matches it within that
  // rounding, half a unit of the last digit published.
  const std::map<std::string, double> rounded = {
      {"llava-1.5-13b", 0.05e9},       // "13.4B" on its model card
      {"cornstarch-vlm-large", 5e6},   // InternViT-6B-448px-V1-5's "5.54B" on its card
      {"cornstarch-valm-large", 5e6},  // the same
      {"internvl-style-14b", 5e6}};    // the same
  int checked = 0, exactly = 0;
  for (const auto& entry : fs::directory_iterator(kScenarios + "/models")) {
    Diagnostics diag;
    const auto model = load_model(entry.path().string(), diag);
    INFO(entry.path().string() << "\n" << diag.format());
    REQUIRE(model.has_value());
    REQUIRE(model->reference.has_value());
    const double ours = static_cast<double>(model_parameters(*model));
    const double published = model->reference->params;
    INFO(model->name << ": ours " << ours << ", published " << published);
    if (const auto r = rounded.find(model->name); r != rounded.end()) {
      CHECK(std::fabs(ours - published) <= r->second);
    } else {
      CHECK(model_parameters(*model) == static_cast<int64_t>(published));
      ++exactly;
    }
    ++checked;
  }
  CHECK(exactly == 16);
  // LLaVA-1.5 7B/13B, Qwen2-VL-7B, Qwen2-Audio-7B, Llama-3.2-11B-Vision, Llama 4 Scout,
  // Kimi-VL-A3B (its published total counts 27 x 64 rotary buffer values besides the
  // parameters), 9 Cornstarch pairs, the InternViT-style 14B of the data-variability scenarios,
  // the GPU machine's ~1B and ~3B VLMs
  CHECK(checked == 20);
}

TEST_CASE("every library scenario and cluster loads, and each part round-trips through JSON") {
  int checked = 0;
  std::vector<fs::path> files;
  for (const std::string& dir :
       {kScenarios, kScenarios + "/cornstarch", kScenarios + "/variability"})
    for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  for (const fs::path& path : files) {
    const fs::directory_entry entry(path);
    if (entry.path().extension() != ".json") continue;
    Diagnostics diag;
    const auto s = load_scenario(entry.path().string(), diag);
    INFO(entry.path().string() << "\n" << diag.format());
    REQUIRE(s.has_value());
    CHECK(read_model(to_json(s->model), "", "", diag) == s->model);
    CHECK(read_cluster(to_json(s->cluster), "", "", diag) == s->cluster);
    const WorkloadSpec w = read_workload(to_json(s->workload), "", "", kScenarios, diag);
    CHECK(w == s->workload);
    if (s->plan) CHECK(read_plan(to_json(*s->plan), "", "", diag) == *s->plan);
    CHECK(diag.ok());
    // The whole scenario, written with its paths, reads back identically.
    const auto again = read_scenario(to_json(*s), entry.path().string(), diag);
    REQUIRE(again.has_value());
    CHECK(again->model == s->model);
    CHECK(again->freeze == s->freeze);
    CHECK(again->plan == s->plan);
    CHECK(again->search == s->search);
    // And the report renders.
    CHECK(!scenario_report(*s, ReportOptions{}).empty());
    ++checked;
  }
  CHECK(checked >= 7);
  for (const auto& entry : fs::directory_iterator(kScenarios + "/clusters")) {
    Diagnostics diag;
    INFO(entry.path().string());
    CHECK(load_cluster(entry.path().string(), diag).has_value());
  }
}

TEST_CASE("the default scenario: LLaVA-1.5-7B on 64 H100s with a variable multi-image workload") {
  Diagnostics diag;
  const auto s = load_scenario(kScenarios + "/default.json", diag);
  REQUIRE(s.has_value());
  CHECK(s->model.name == "llava-1.5-7b");
  CHECK(device_count(s->cluster) == 64);
  REQUIRE(s->workload.sources.size() == 1);
  const auto& image = s->workload.sources[0].image;
  REQUIRE(image.has_value());
  CHECK(dist_upper_bound(image->count) > dist_lower_bound(image->count));
}

TEST_CASE(
    "paths in a scenario resolve relative to the scenario file, and errors name the part's file") {
  const fs::path dir =
      fs::temp_directory_path() / ("tessera-scenario-" + std::to_string(::getpid()));
  fs::create_directories(dir / "parts");
  {
    std::ofstream(dir / "parts" / "cluster.json")
        << R"({"name": "c", "nodes": 1, "devices_per_node": 2,
      "device": {"name": "g", "peak_flops": {"bf16": 1e15}, "memory_bytes": 8e10, "memory_bandwith_bytes_per_s": 3e12},
      "intra_node": {"bandwidth_bytes_per_s": 4.5e11, "latency_s": 3e-6}})";
    std::ofstream(dir / "s.json") << R"({"model": ")" << kScenarios
                                  << R"(/models/llava-1.5-7b.json",
      "workload": {"global_batch": 8, "max_seq_len": 4096, "samples": {"text_tokens": 10}},
      "cluster": "parts/cluster.json"})";
  }
  Diagnostics diag;
  CHECK_FALSE(load_scenario((dir / "s.json").string(), diag).has_value());
  const std::string text = diag.format();
  INFO(text);
  CHECK(text.find((dir / "parts" / "cluster.json").string() +
                  ": device.memory_bandwith_bytes_per_s: unknown key (did you mean "
                  "'memory_bandwidth_bytes_per_s'?)") != std::string::npos);
  CHECK(text.find("device.memory_bandwidth_bytes_per_s: required key is missing") !=
        std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a scenario's freeze list freezes modules of its model; an unknown name is an error") {
  Diagnostics diag;
  const auto s = load_scenario(kScenarios + "/cornstarch/valm-medium.json", diag);
  REQUIRE(s.has_value());
  for (const ModuleSpec& m : s->model.modules)
    CHECK(m.frozen == (m.role == ModuleRole::kEncoder || m.role == ModuleRole::kLlm));
  Json j = inline_scenario_json(*s);
  j["freeze"] = Json::array({"llm", "speech"});
  Diagnostics bad;
  CHECK(!read_scenario(j, "x.json", bad).has_value());
  REQUIRE(bad.errors().size() == 1);
  CHECK(bad.errors().front().path == "freeze[1]");
  CHECK(bad.errors().front().message.find("no module named 'speech'") != std::string::npos);
}

TEST_CASE("set_json_path: sets a field by its path; starts the optional search space") {
  Json root =
      Json::parse(R"({"plan": {"layout": {"tp": 1}}, "model": {"modules": [{"name": "a"}]}})");
  CHECK(set_json_path(root, "plan.layout.tp", 4).empty());
  CHECK(root["plan"]["layout"]["tp"] == 4);
  CHECK(set_json_path(root, "model.modules[0].name", "b").empty());
  CHECK(root["model"]["modules"][0]["name"] == "b");
  // A scenario without a search space takes its defaults; setting a key of it starts one.
  CHECK(set_json_path(root, "search.fp8", Json::parse(R"(["none", "delayed"])")).empty());
  CHECK(root["search"]["fp8"].size() == 2);
  // Elsewhere a missing key is a mistake, named.
  CHECK(set_json_path(root, "workload.global_batch", 8) ==
        "'workload.global_batch': no key 'workload'");
  CHECK(set_json_path(root, "plan.nope.tp", 2) == "'plan.nope.tp': no key 'nope'");
}

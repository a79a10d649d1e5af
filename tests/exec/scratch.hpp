// Scratch folders, plan files and recorded losses of tessera-train runs, for the executor
// tests: each test process writes under one temporary folder, removed when it exits.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include "shared/base/json_reader.hpp"

namespace {

namespace fs = std::filesystem;
using tessera::Json;

// The checkout whose scenarios the tests read: the build's, or TESSERA_SOURCE_DIR's where a build
// made on another machine was carried to this one (scripts/gpu-check.sh sets it).
inline std::string source_dir() {
  const char* carried = std::getenv("TESSERA_SOURCE_DIR");
  return carried != nullptr && *carried != '\0' ? carried : TESSERA_SOURCE_DIR;
}

// The test process's scratch folder, removed when it exits (not when a forked child does).
const pid_t kTestProcess = ::getpid();
void remove_scratch() {
  if (::getpid() != kTestProcess) return;
  std::error_code ignored;
  fs::remove_all(fs::temp_directory_path() / ("tessera-train-test-" + std::to_string(kTestProcess)),
                 ignored);
}
const int kScratchCleanup = std::atexit(remove_scratch);

// Where a run named `name` writes (its loss.jsonl stays there until the test process exits).
fs::path out_dir(const std::string& name) {
  return fs::temp_directory_path() / ("tessera-train-test-" + std::to_string(::getpid())) / name;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = out_dir(name);
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

std::string plan_file(const std::string& layout) {
  const fs::path path = out_dir("plans");  // kept: each file is named by its content
  fs::create_directories(path);
  const fs::path file = path / (std::to_string(std::hash<std::string>{}(layout)) + ".json");
  // `layout` may carry more plan fields after the layout object.
  std::ofstream(file)
      << R"({"placement": "homogeneous", "micro_batch_size": 1, "layout": )" << layout
      << (layout.find("\"schedule\"") == std::string::npos ? R"(, "schedule": "1f1b")" : "") << "}";
  return file.string();
}

// One field of every step's line in loss.jsonl ("loss", "grad_norm", ...).
std::vector<double> losses(const fs::path& out, const std::string& field = "loss") {
  std::vector<double> v;
  std::ifstream in(out / "loss.jsonl");
  std::string line;
  while (std::getline(in, line)) v.push_back(Json::parse(line).at(field).get<double>());
  return v;
}

// The scenario file `file` with `edit` applied to its JSON (its cluster made an absolute path),
// written under out_dir(name); returns the new file.
std::string edited_scenario(const std::string& file, const std::function<void(Json&)>& edit,
                            const std::string& name) {
  Json s = Json::parse(std::ifstream(file));
  s["cluster"] = source_dir() + "/scenarios/clusters/cpu-local.json";
  edit(s);
  const fs::path path = fresh_dir(name) / "scenario.json";
  fs::create_directories(path.parent_path());
  std::ofstream(path) << s.dump(2);
  return path.string();
}

}  // namespace

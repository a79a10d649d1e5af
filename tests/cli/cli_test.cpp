// Runs the real `tessera` binary the way a user does and checks exit codes and messages.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kTessera = TESSERA_CLI;
const std::string kSource = TESSERA_SOURCE_DIR;
const std::string kBad = kSource + "/tests/data/bad/";

struct Run {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// A shell command line, stdout and stderr together unless it redirects stderr itself.
Run shell(const std::string& line) {
  Run r;
  const std::string command = line + (line.find("2>") == std::string::npos ? " 2>&1" : "");
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer{};
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    r.output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Run run(const std::string& args) {
  return shell(kTessera + " " + args);
}

fs::path scratch() {
  const fs::path dir = fs::temp_directory_path() / ("tessera-cli-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("validate and show accept the default scenario") {
  const Run v = run("validate " + kSource + "/scenarios/default.json");
  CHECK(v.code == 0);
  CHECK(v.output.find("ok: default") == 0);
  const Run s = run("show " + kSource + "/scenarios/default.json");
  CHECK(s.code == 0);
  CHECK(s.output.find("model llava-1.5-7b") != std::string::npos);
  CHECK(s.output.find("LLM sequence") != std::string::npos);
  CHECK(s.output.find("tp: 16 groups of 4 ranks: [0,1,2,3]") != std::string::npos);
}

TEST_CASE("a cluster names its GPU; a GPU without kernel data is estimated with a warning") {
  const fs::path dir = scratch() / "devices";
  fs::create_directories(dir);
  const auto scenario = [&](const std::string& name, const std::string& device) {
    const fs::path file = dir / (name + ".json");
    std::ofstream(file) << R"({"model": ")" << kSource << R"(/scenarios/models/llava-1.5-7b.json",
      "workload": {"global_batch": 8, "max_seq_len": 2048,
                   "samples": {"text_tokens": 500}},
      "cluster": {"name": "c", "kind": "gpu", "nodes": 1, "devices_per_node": 8,
                  "device": )"
                        << device << R"(,
                  "intra_node": {"bandwidth_bytes_per_s": 4.5e11, "latency_s": 3e-6}},
      "plan": {"placement": "homogeneous", "layout": {"tp": 8}, "micro_batch_size": 1}})";
    return file.string();
  };
  const Run named = run("estimate " + scenario("named", R"("NVIDIA H200")"));
  INFO(named.output);
  CHECK(named.code == 0);
  CHECK(named.output.find("warning") == std::string::npos);
  const Run flat =
      run("estimate " + scenario("flat", R"({"name": "H200-SXM-141GB", "kernels": null})"));
  INFO(flat.output);
  CHECK(flat.code == 0);
  CHECK(flat.output.find("warning: " + (dir / "flat.json").string() +
                         ": cluster.device: 'H200-SXM-141GB' has no kernel data: its compute is "
                         "priced at a flat share of peak") != std::string::npos);
  const Run unknown = run("validate " + scenario("unknown", R"("Gaudi3")"));
  CHECK(unknown.code == 2);
  CHECK(unknown.output.find("cluster.device: no shipped device is named 'Gaudi3'") !=
        std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("lower prints the per-rank op lists; estimate prints a prediction") {
  const Run l = run("lower " + kSource + "/scenarios/default.json --rank 32");
  INFO(l.output);
  CHECK(l.code == 0);
  CHECK(l.output.find("rank 32: ") == 0);
  CHECK(l.output.find("recv:llm.s1.mb0.F<r0") != std::string::npos);
  CHECK(l.output.find("rank 0:") == std::string::npos);
  const Run j = run("lower " + kSource + "/scenarios/cpu-tiny.json --json --rank 1");
  CHECK(j.code == 0);
  CHECK(j.output.find("\"name\": \"llm.s1.mb0.F\"") != std::string::npos);
  const Run e = run("estimate " + kSource + "/scenarios/default.json");
  CHECK(e.code == 0);
  CHECK(e.output.find("step time") != std::string::npos);
  CHECK(e.output.find("MFU") != std::string::npos);
  // An infeasible plan is a prediction, not an error: exit 0 with the reason and the numbers.
  const Run big = run("estimate " + kSource + "/scenarios/qwen2-vl-7b-video.json");
  CHECK(big.code == 0);
  CHECK(big.output.find("infeasible: rank") != std::string::npos);
}

TEST_CASE("estimate prints MFU and HFU apart, and calls idle time a bubble only with a pipeline") {
  const Run full = run("estimate " + kSource + "/scenarios/published/korthikanti-22b-full.json");
  INFO(full.output);
  CHECK(full.code == 0);
  CHECK(full.output.find("MFU") != std::string::npos);
  CHECK(full.output.find("HFU") != std::string::npos);
  CHECK(full.output.find("no pipeline") != std::string::npos);  // TP 8, no PP
  const Run pp = run("estimate " + kSource + "/scenarios/published/zerobubble-1.5b-1f1b-m24.json");
  CHECK(pp.output.find("pipeline bubble") != std::string::npos);
}

TEST_CASE("a plan the lowering refuses exits 2 from estimate and simulate, saying so") {
  const std::string refused = kSource +
                              "/scenarios/cpu-tiny-variable.json --set plan.schedule=dip "
                              "--set plan.layout.cp=2";
  const Run e = run("estimate " + refused);
  INFO(e.output);
  CHECK(e.code == 2);
  CHECK(e.output.find("refused: schedule dip with context parallelism") != std::string::npos);
  const Run s = run("simulate " + refused + " --iterations 1");
  INFO(s.output);
  CHECK(s.code == 2);
}

TEST_CASE("fidelity: published vs predicted per row and series, the fit and leave-one-source-out") {
  const std::string rows = kSource + "/scenarios/published/zerobubble-1.5b-1f1b-m24.json " +
                           kSource + "/scenarios/published/korthikanti-22b-full.json " + kSource +
                           "/scenarios/published/nvidia-llama3.1-8b-h100-8.json";
  const Run plain = run("fidelity " + rows + " 2>/dev/null");
  INFO(plain.output);
  CHECK(plain.code == 0);
  CHECK(plain.output.find("zerobubble-1.5b-1f1b-m24") != std::string::npos);
  CHECK(plain.output.find("suite (fitted sources): 3 rows") != std::string::npos);
  // By kind: these three are dense BF16 runs; an FP8 and a fully sharded one, held out, apart.
  CHECK(plain.output.find("\ndense                      3") != std::string::npos);
  const Run kinds =
      run("fidelity " + kSource + "/scenarios/published/nvidia-llama3.1-8b-fp8-h100-8.json " +
          kSource + "/scenarios/published/fms-fsdp-llama2-13b-h100-96.json " + kSource +
          "/scenarios/published/llmfoundry-mpt-7b-fsdp-h100-8.json 2>/dev/null");
  INFO(kinds.output);
  CHECK(kinds.output.find("\nfsdp                       1") != std::string::npos);
  CHECK(kinds.output.find("\nfp8 (held out)             1") != std::string::npos);
  CHECK(kinds.output.find("\nfsdp (held out)            1") != std::string::npos);
  const Run fit = run("fidelity --fit " + rows + " 2>/dev/null");
  INFO(fit.output);
  CHECK(fit.code == 0);
  CHECK(fit.output.find("fitted on the suite") != std::string::npos);
  // Leave-one-source-out as a Markdown table (docs/FIDELITY.md's generated block).
  CHECK(fit.output.find("| source left out | rows | mean \\|error\\| | fit on the others |") !=
        std::string::npos);
  CHECK(std::regex_search(fit.output, std::regex(R"(\| nvidia-dgxc \| 1 \| [0-9.]+% \| launch )")));
  CHECK(std::regex_search(fit.output, std::regex(R"(\| \*\*all\*\* \| 3 \| \*\*[0-9.]+%\*\* \|)")));
  // Per series, as Markdown: a series with held-out rows gets a line of its own for them.
  const Run series = run("fidelity --markdown --series " + rows + " " + kSource +
                         "/scenarios/published/narayanan-1.7b.json 2>/dev/null");
  INFO(series.output);
  CHECK(series.code == 0);
  CHECK(series.output.find("| series | rows |") == 0);
  CHECK(series.output.find("| korthikanti-full | 1 | ") != std::string::npos);
  CHECK(series.output.find("| narayanan, held out | 1 | ") != std::string::npos);
  CHECK(series.output.find("| **suite (3 rows)** |") != std::string::npos);
  for (const auto& [wrong, said] :
       {std::pair<std::string, std::string>{"--series", "--series goes with --markdown"},
        {"--markdown --fit", "--markdown goes without --fit"}}) {
    const Run refused = run("fidelity " + wrong + " " + rows);
    CHECK(refused.code == 2);
    CHECK(refused.output.find(said) != std::string::npos);
  }
  // Rows larger than --max-gpus are left out, and said so.
  const Run small = run("fidelity --max-gpus 8 " + rows + " " + kSource +
                        "/scenarios/published/korthikanti-175b-full.json 2>/dev/null");
  CHECK(small.output.find("1 rows of more than 8 GPUs left out") != std::string::npos);
  // A scenario without a published block: exit 2, naming the file and the key.
  const Run bad = run("fidelity " + kSource + "/scenarios/default.json");
  CHECK(bad.code == 2);
  CHECK(bad.output.find("default.json") != std::string::npos);
  CHECK(bad.output.find("published") != std::string::npos);
}

TEST_CASE("fidelity: the published suite's headline figures, pinned (docs/FIDELITY.md)") {
  // A change of the cost model that moves them shows here, to be reviewed and the docs updated.
  const Run all = run("fidelity " + kSource + "/scenarios/published/*.json 2>/dev/null");
  INFO(all.output);
  CHECK(all.code == 0);
  CHECK(all.output.find("suite (fitted sources): 47 rows, mean |error| 6.7%, max 34.7%, within "
                        "10%: 37, within 15%: 43") != std::string::npos);
  CHECK(all.output.find("held out: 32 rows, mean |error| 6.8%, max 30.8%, within 10%: 25, within "
                        "15%: 30") != std::string::npos);
  CHECK(all.output.find("\ndense                     29       4.3%") != std::string::npos);
  CHECK(all.output.find("\nfp8 (held out)             9       5.3%") != std::string::npos);
  CHECK(all.output.find("\nfsdp                       8       5.0%") != std::string::npos);
  CHECK(all.output.find("\nfsdp (held out)            6       4.3%") != std::string::npos);
  // Every published plan ran, and the memory model fits each on its GPUs (docs/FIDELITY.md).
  CHECK(all.output.find("memory: 79 of 79 published plans predicted to fit their GPUs (every one "
                        "ran)\n") != std::string::npos);
  CHECK(all.output.find("predicted over capacity") == std::string::npos);
}

TEST_CASE("fidelity predicts a row of variable data as the mean step of its drawn iterations") {
  // The LLaVA instruction-tuning row over 3 iterations, its files named by absolute path.
  nlohmann::ordered_json row = nlohmann::ordered_json::parse(
      std::ifstream(kSource + "/scenarios/published/llava-1.5-13b-instruct-a100-8.json"));
  const std::string dir = kSource + "/scenarios/published/";
  for (const char* key : {"model", "cluster", "workload"})
    row[key] = dir + row[key].get<std::string>();
  row["published"]["iterations"] = 3;
  const fs::path file = scratch() / "llava-instruct-3.json";
  std::ofstream(file) << row.dump();
  double sum = 0;
  for (int it = 0; it < 3; ++it) {
    const Run e = run("estimate " + file.string() + " --iteration " + std::to_string(it));
    const std::size_t at = e.output.find("step time");
    REQUIRE(at != std::string::npos);
    sum += std::stod(e.output.substr(at + 9));
  }
  const Run f = run("fidelity " + file.string() + " 2>/dev/null");
  INFO(f.output);
  REQUIRE(f.code == 0);
  const std::size_t at = f.output.find("llava-1.5-13b-instruct-a100-8");
  REQUIRE(at != std::string::npos);
  std::istringstream line(f.output.substr(at));
  std::string name, series, published, predicted;
  line >> name >> series >> published >> predicted;
  CHECK(std::stod(predicted) == doctest::Approx(sum / 3).epsilon(0.002));
  // `show` names the mixture's sources, their shares and groups.
  const Run show = run("show " + file.string());
  INFO(show.output);
  CHECK(show.output.find("mixture of 10 sources, each batch drawn from one group") !=
        std::string::npos);
  CHECK(show.output.find("sharegpt 6.1% (text)") != std::string::npos);
  // Out of range: exit 2, naming the key.
  row["published"]["iterations"] = 0;
  std::ofstream(file) << row.dump();
  const Run bad = run("fidelity " + file.string());
  CHECK(bad.code == 2);
  CHECK(bad.output.find("published.iterations: must be 1 to 1024, got 0") != std::string::npos);
}

TEST_CASE("simulate prints the metrics and writes a Chrome trace per rank") {
  const fs::path dir = scratch() / "trace";
  const Run r =
      run("simulate " + kSource + "/scenarios/default.json --iterations 2 --trace " + dir.string());
  INFO(r.output);
  CHECK(r.code == 0);
  for (const char* part :
       {"step time over 2 iterations", "MFU", "critical path", "busy per module", "exposed comm"})
    CHECK(r.output.find(part) != std::string::npos);
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  CHECK(files == 64);
  std::ifstream in(dir / "rank0.json");
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("\"traceEvents\"") != std::string::npos);
  const Run json = run("simulate " + kSource +
                       "/scenarios/cpu-tiny.json --iterations 1 --json --contention off");
  CHECK(json.code == 0);
  CHECK(json.output.find("\"step_p95_s\"") != std::string::npos);
  const Run infeasible =
      run("simulate " + kSource + "/scenarios/qwen2-vl-7b-video.json --iterations 1");
  CHECK(infeasible.code == 0);
  CHECK(infeasible.output.find("infeasible: rank") != std::string::npos);
  CHECK(run("simulate " + kSource + "/scenarios/cpu-tiny.json --contention maybe").code == 2);
  const Run periodic = run("simulate " + kSource + "/scenarios/cpu-tiny.json --periodic maybe");
  CHECK(periodic.code == 2);
  CHECK(periodic.output.find("--periodic on|off") != std::string::npos);
  fs::remove_all(dir.parent_path());
}

TEST_CASE("sweep: --set grids, --emit-plan, and results.jsonl#R handed to simulate") {
  const fs::path dir = scratch() / "sweep";
  const std::string sweep =
      "sweep " + kSource + "/scenarios/cpu-tiny.json --gpus 2 --top 2 -j 2 --out " + dir.string();
  const Run r = run(sweep + " --set workload.global_batch=4,8 --emit-plan 1 2>/dev/null");
  INFO(r.output);
  CHECK(r.code == 0);
  // stdout is exactly the plan, as JSON
  CHECK(r.output.rfind("{", 0) == 0);
  CHECK(r.output.find("\"placement\"") != std::string::npos);
  CHECK(fs::exists(dir / "results.jsonl"));
  CHECK(fs::exists(dir / "results.csv"));
  CHECK(fs::exists(dir / "report.html"));
  const Run table = run(sweep + " --set workload.global_batch=4,8 --resume");
  CHECK(table.code == 0);
  CHECK(table.output.find("at workload.global_batch=4:") != std::string::npos);
  CHECK(table.output.find("at workload.global_batch=8:") != std::string::npos);
  const Run handed = run("simulate " + kSource + "/scenarios/cpu-tiny.json --iterations 1 --plan " +
                         (dir / "results.jsonl").string() + "#2");
  INFO(handed.output);
  CHECK(handed.code == 0);
  CHECK(handed.output.find("step time over 1 iterations") != std::string::npos);
  const Run missing = run("simulate " + kSource + "/scenarios/cpu-tiny.json --plan " +
                          (dir / "results.jsonl").string() + "#99");
  CHECK(missing.code == 2);
  CHECK(missing.output.find("no successful row ranked 99") != std::string::npos);
  const Run bad_path = run(sweep + " --set model.modules[7].frozen=true");
  CHECK(bad_path.code == 2);
  CHECK(bad_path.output.find("index 7 out of range") != std::string::npos);
  const Run bad_value = run(sweep + " --set workload.global_batch=0");
  CHECK(bad_value.code == 2);
  CHECK(bad_value.output.find("workload.global_batch: must be > 0, got 0") != std::string::npos);
  CHECK(run(sweep + " --set nope").code == 2);
  // A value may be a JSON list: commas inside brackets do not split the grid. Two points, the
  // first trying fully sharded twins of the plans (marked fsdp), the second not.
  const Run lists = run("sweep " + kSource + "/scenarios/cpu-tiny-variable.json -j 2 --top 20 " +
                        "--set 'search.pp=[2]' --set 'search.fully_sharded=[false,true],[false]' " +
                        "--out " + dir.string() + "-lists 2>/dev/null");
  INFO(lists.output);
  CHECK(lists.code == 0);
  const std::size_t both =
      lists.output.find("at search.pp=[2], search.fully_sharded=[false,true]:");
  const std::size_t off = lists.output.find("at search.pp=[2], search.fully_sharded=[false]:");
  REQUIRE(both != std::string::npos);
  REQUIRE(off != std::string::npos);
  // Each point's rows run to the next point's (or the end).
  const auto rows = [&](std::size_t at, std::size_t other) {
    return lists.output.substr(at, other > at ? other - at : std::string::npos);
  };
  CHECK(rows(both, off).find(" dopt fsdp ") != std::string::npos);
  CHECK(rows(off, both).find(" fsdp ") == std::string::npos);
  // Shards and merge.
  const fs::path s1 = dir.parent_path() / "shard1", s2 = dir.parent_path() / "shard2";
  CHECK(run(sweep + " --shard 1/2 --out " + s1.string()).code == 0);
  CHECK(run(sweep + " --shard 2/2 --out " + s2.string()).code == 0);
  const Run merged = run("merge " + s1.string() + " " + s2.string() + " --out " +
                         (dir.parent_path() / "merged").string());
  INFO(merged.output);
  CHECK(merged.code == 0);
  CHECK(merged.output.find("report:") != std::string::npos);
  CHECK(run(sweep + " --shard 3/2").code == 2);
  CHECK(run("merge /nonexistent/shard").code == 2);
  fs::remove_all(dir.parent_path());
}

TEST_CASE("stages: frozen-aware vs freeze-unaware stage counts, simulated; -o writes the plan") {
  const fs::path dir = scratch() / "stages";
  fs::create_directories(dir);
  const fs::path plan = dir / "plan.json";
  const Run r = run("stages " + kSource +
                    "/scenarios/cornstarch/vlm-small.json --tp 2 --simulate -o " + plan.string());
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("frozen-aware choice     vision ") != std::string::npos);
  CHECK(r.output.find("freeze-unaware choice   vision 2 + llm 6") != std::string::npos);
  CHECK(r.output.find("simulated gain: ") != std::string::npos);
  CHECK(r.output.find("simulated LLM-centric: ") != std::string::npos);
  // The written plan is the frozen-aware choice, and the other commands take it.
  const Run e =
      run("estimate " + kSource + "/scenarios/cornstarch/vlm-small.json --plan " + plan.string());
  INFO(e.output);
  CHECK(e.code == 0);
  CHECK(e.output.find("non_colocated plan on 16 ranks") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("--set changes the scenario, and a --plan given beside it, before validation") {
  const fs::path dir = scratch() / "set";
  fs::create_directories(dir);
  const fs::path plan = dir / "pp4.json";
  std::ofstream(plan) << R"({"placement": "homogeneous", "layout": {"pp": 4}, "micro_batch_size": 1,
                             "schedule": "1f1b", "stage_split": "frozen_aware"})";
  const std::string base =
      "estimate " + kSource + "/scenarios/cpu-tiny-big-vit.json --plan " + plan.string();
  const Run aware = run(base);
  CHECK(aware.code == 0);
  CHECK(aware.output.find("stage layers     llm 1,3,2,2 (frozen_aware)") != std::string::npos);
  const Run uniform = run(base + " --set plan.stage_split=uniform");
  INFO(uniform.output);
  CHECK(uniform.code == 0);
  CHECK(uniform.output.find("stage layers     llm even (uniform)") != std::string::npos);
  // 105 virtual stages of one layer each, in a model with nothing frozen.
  const Run long_pipeline = run("estimate " + kSource +
                                "/scenarios/published/narayanan-529.6b.json --set "
                                "plan.stage_split=frozen_aware");
  CHECK(long_pipeline.output.find(
            "stage layers     llm 1×105 (cost-balanced; nothing is frozen)") != std::string::npos);
  // A change that makes the plan invalid is reported like any bad input.
  const Run bad = run(base + " --set plan.layout.pp=16");
  CHECK(bad.code == 2);
  CHECK(bad.output.find("plan.layout") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("lower and estimate: bad input exits 2") {
  CHECK(run("estimate " + kSource + "/scenarios/llama-3.2-11b-vision.json")
            .output.find("plan: no plan") != std::string::npos);
  CHECK(run("estimate " + kSource + "/scenarios/llama-3.2-11b-vision.json").code == 2);
  const Run rank = run("lower " + kSource + "/scenarios/cpu-tiny.json --rank 9");
  CHECK(rank.code == 2);
  CHECK(rank.output.find("--rank 9 out of range: the plan has 2 ranks") != std::string::npos);
  const Run plan =
      run("estimate " + kSource + "/scenarios/default.json --plan " + kBad + "unknown-enum.json");
  CHECK(plan.code == 2);
  const Run missing =
      run("estimate " + kSource + "/scenarios/default.json --plan /nonexistent/plan.json");
  CHECK(missing.code == 2);
  CHECK(missing.output.find("/nonexistent/plan.json: file not found") != std::string::npos);
}

TEST_CASE("every subcommand has --help") {
  for (const char* c : {"validate", "show", "import-hf", "lower", "estimate", "simulate", "sweep",
                        "merge", "calibrate", "replay", "fidelity", "stages", "export"}) {
    const Run r = run(std::string(c) + " --help");
    CHECK(r.code == 0);
    CHECK(r.output.find("Usage:") != std::string::npos);
  }
  CHECK(run("--help").code == 0);
  CHECK(run("").code == 2);
  CHECK(run("frobnicate").code == 2);
}

// Bad input: exit 2, a message naming the file and JSON path, nothing written.
TEST_CASE("bad inputs exit 2 with a message naming the file and the JSON path") {
  struct Case {
    const char* args;
    const char* expected;  // a part of the message
  };
  const Case cases[] = {
      {"validate BAD/malformed.json", "malformed.json: invalid JSON at line 4, column"},
      {"validate BAD/wrong-type.json",
       "wrong-type.json: workload.global_batch: expected an integer, got string"},
      {"validate BAD/unknown-key.json",
       "unknown-key.json: workload.max_seq_length: unknown key (did you mean 'max_seq_len'?)"},
      {"validate BAD/missing-file.json",
       "missing-file.json: cluster: file not found: 'no-such-cluster.json'"},
      {"validate BAD/no-such-scenario.json", "no-such-scenario.json: file not found"},
      {"validate BAD/zero-batch.json",
       "zero-batch.json: workload.global_batch: must be > 0, got 0"},
      {"validate BAD/negative-layers.json",
       "negative-layers.json: model.modules[2].transformer.layers: must be > 0, got -4"},
      {"validate BAD/tp-heads.json", "tp-heads.json: plan.layout.tp: 3 does not divide"},
      {"validate BAD/world-mismatch.json",
       "world-mismatch.json: plan.layout: plan uses 4 ranks, cluster cpu-local-2"},
      {"validate BAD/spans-overlap.json",
       "spans-overlap.json: plan.modules.llm.ranks: span [1, 3) overlaps another module"},
      {"validate BAD/unknown-enum.json",
       "unknown-enum.json: plan.schedule: unknown value '1f1c' (did you mean '1f1b'?)"},
      {"validate BAD/modality.json",
       "modality.json: workload.samples.audio: workload draws audio but model tiny has no audio "
       "encoder"},
      {"validate BAD/not-object.json", "not-object.json: expected an object, got array"},
      {"validate BAD/bad-distribution.json",
       "bad-distribution.json: workload.samples.text_tokens.max: must be >= min"},
      {"validate BAD/empty.json", "empty.json: invalid JSON at line 1, column 1"},
      {"validate BAD/stage-layers.json",
       "stage-layers.json: plan.layout.stage_layers: has 3 entries, expected pp*vpp=2"},
      {"validate BAD/batch.json",
       "batch.json: plan.num_micro_batches: micro_batch_size*num_micro_batches*dp = 1*3*2 != "
       "global_batch=8"},
      {"import-hf BAD/hf-unknown-type.json",
       "hf-unknown-type.json: model_type: unsupported model_type 'bert'"},
      {"import-hf BAD/hf-wrong-type.json",
       "hf-wrong-type.json: vision_config.depth: expected an integer, got string"},
      {"show BAD/tp-heads.json", "tp-heads.json: plan.layout.tp"},
      {"show", "missing scenario file"},
      {"show --batches=0 SRC/scenarios/default.json", "--batches and --groups must be >= 1"},
      {"validate --frobnicate x.json", "Option ‘frobnicate’ does not exist"},
      {"stages --gpus 15 --tp 2 SRC/scenarios/cornstarch/vlm-small.json",
       "--gpus: 15 devices do not make whole stages of tp 2 x dp 1"},
      {"stages --set workload.global_batch=24,48 SRC/scenarios/cornstarch/vlm-small.json",
       "--set workload.global_batch: one value here, not a list"},
      {"stages --set workload.global_batch=0 SRC/scenarios/cornstarch/vlm-small.json",
       "workload.global_batch: must be > 0"},
  };
  for (const Case& c : cases) {
    std::string args = c.args;
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{"BAD/", kBad}, {"SRC/", kSource + "/"}}) {
      for (std::size_t at = args.find(from); at != std::string::npos; at = args.find(from))
        args.replace(at, from.size(), to);
    }
    const Run r = run(args);
    INFO(args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
  }
}

TEST_CASE("a file with several problems lists all of them") {
  const Run r = run("validate " + kBad + "many-problems.json");
  CHECK(r.code == 2);
  CHECK(r.output.find("4 problems found") != std::string::npos);
}

TEST_CASE("import-hf writes a loadable model atomically, and writes nothing on bad input") {
  const fs::path dir = scratch();
  const std::string out = (dir / "llava.json").string();
  const Run ok =
      run("import-hf " + kSource + "/tests/data/hf/llava-1.5-7b-hf.json --freeze vision -o " + out);
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK(fs::exists(out));
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("\"frozen\": true") != std::string::npos);

  const std::string bad_out = (dir / "never.json").string();
  const Run bad = run("import-hf " + kBad + "hf-unknown-type.json -o " + bad_out);
  CHECK(bad.code == 2);
  CHECK_FALSE(fs::exists(bad_out));
  const Run bad_freeze = run("import-hf " + kSource +
                             "/tests/data/hf/llava-1.5-7b-hf.json --freeze visoin -o " + bad_out);
  CHECK(bad_freeze.code == 2);
  CHECK_FALSE(fs::exists(bad_out));
  // Nothing else was left behind (no temporary files).
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  CHECK(files == 1);
  fs::remove_all(dir);
}

TEST_CASE("every imported family plans: its model estimates on 8 GPUs as a user's scenario") {
  const fs::path dir = scratch();
  // Llama 4 Scout's 16 experts over 4 EP ranks: 27 GB of routed experts per rank.
  const std::string dense = R"({"pp": 2, "dp": 4})", experts = R"({"pp": 2, "dp": 4, "ep": 4})";
  for (const auto& [config, workload, layout] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gemma-3-4b-it", "llava-instruct", dense},
           {"paligemma2-3b-ft-docci-448", "llava-instruct", dense},
           {"phi-3.5-vision-instruct", "llava-instruct", dense},
           {"smolvlm2-500m-video-instruct", "llava-instruct", dense},
           {"qwen2-audio-7b-instruct", "audio-text", dense},
           {"qwen2.5-omni-7b", "audio-visual", dense},
           {"llama-4-scout-17b-16e-instruct", "llava-instruct", experts},
           {"deepseek-vl2-tiny", "llava-instruct", experts},
           {"kimi-vl-a3b-instruct", "llava-instruct", experts},
           {"qwen3-vl-8b-instruct", "llava-instruct", dense},
           {"llava-onevision-qwen2-0.5b-ov-hf", "llava-instruct", dense}}) {
    INFO(config);
    const std::string model = (dir / (config + ".model.json")).string();
    const Run imported =
        run("import-hf " + kSource + "/tests/data/hf/" + config + ".json -o " + model);
    INFO(imported.output);
    REQUIRE(imported.code == 0);
    const fs::path scenario = dir / (config + ".scenario.json");
    std::ofstream(scenario) << R"({"name": "imported", "model": ")" << model
                            << R"(", "workload": ")" << kSource << "/scenarios/workloads/"
                            << workload << R"(.json", "cluster": ")" << kSource
                            << R"(/scenarios/clusters/dgx-h100-8.json", "plan": {"placement":
        "homogeneous", "layout": )"
                            << layout << R"(, "micro_batch_size": 1}})";
    const Run estimated = run("estimate " + scenario.string());
    INFO(estimated.output);
    CHECK(estimated.code == 0);
    CHECK(estimated.output.find("step time") != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("the shipped H100 and H200 runs: their fitted profiles replay and predict them") {
  // traces/<gpu>/profile.json was fitted (tessera calibrate) on every second of the runs, in
  // scripts/gpu-check.sh's order; the others are held out. docs/PERFORMANCE.md reports these
  // errors; the bounds sit just above them, so that a change of the cost model that loses
  // accuracy shows here.
  struct Errors {
    double per_iteration = 0;  // mean |error| of single warm iterations
    double of_mean = 0;        // |error| of the mean warm step
  };
  const auto errors = [&](const std::string& gpu, const std::vector<std::string>& names) {
    const std::string runs = kSource + "/traces/" + gpu + "/";
    Errors sum;
    for (const std::string& name : names) {
      const Run r = run("replay " + runs + "vlm-" + name + " --profile " + runs + "profile.json");
      INFO(r.output);
      REQUIRE(r.code == 0);
      std::smatch m;
      REQUIRE(std::regex_search(
          r.output, m,
          std::regex(R"(mean \|error\| ([0-9.]+)%, max \|error\| [0-9.]+%, mean ([-+0-9.]+)%)")));
      sum.per_iteration += std::stod(m[1].str()) / static_cast<double>(names.size());
      sum.of_mean += std::abs(std::stod(m[2].str())) / static_cast<double>(names.size());
      // Every iteration trained on the same samples: the replay names the run's own noise.
      CHECK(r.output.find("the measured steps' own noise") != std::string::npos);
    }
    return sum;
  };
  // As measured (docs/PERFORMANCE.md): H100 fitting runs 4.2% per iteration (the goal, 3%, is
  // not met) and 2.0% on the mean step, held-out runs 3.2% (goal 8%); H200 4.5%, 3.0% and 6.7%;
  // the H100 runs recorded again pinned 3.7%, 3.1% and 7.9%; and with working copies on a fourth
  // lease 4.9%, 2.7% and 9.5% (the held-out goal missed by the trainable encoder alone).
  // The H100 runs, recorded three times (h100/, h100-pinned/, h100-copies/), split alike.
  const std::vector<std::string> h100_fitting = {
      "1b-h100-s1024-m1", "1b-h100-s1024-m4", "1b-h100-s2048-m1", "1b-h100-s2048-m4",
      "1b-h100-s4096-m1", "1b-h100-s4096-m4", "3b-h100-s2048-m1"};
  const std::vector<std::string> h100_held_out = {
      "1b-h100-s1024-m2", "1b-h100-s1024-m8", "1b-h100-s2048-m2",
      "1b-h100-s2048-m8", "1b-h100-s4096-m2", "1b-h100-s2048-m1-trainable-encoder",
      "3b-h100-s2048-m2"};
  const struct {
    std::string gpu;
    std::vector<std::string> fitting, held_out;
    double fitting_pct, fitting_mean_pct, held_out_pct;
  } sets[] = {
      {"h100", h100_fitting, h100_held_out, 4.6, 2.4, 3.6},
      {"h200",
       {"1b-h200-s1024-m1", "1b-h200-s1024-m4", "1b-h200-s2048-m1", "1b-h200-s2048-m4",
        "1b-h200-s4096-m1", "1b-h200-s4096-m4", "1b-h200-s2048-m1-trainable-encoder",
        "3b-h200-s2048-m2"},
       {"1b-h200-s1024-m2", "1b-h200-s1024-m8", "1b-h200-s2048-m2", "1b-h200-s2048-m8",
        "1b-h200-s4096-m2", "1b-h200-s4096-m8", "3b-h200-s2048-m1"},
       4.9,
       3.4,
       7.1},
      {"h100-pinned", h100_fitting, h100_held_out, 4.1, 3.5, 8.3},
      {"h100-copies", h100_fitting, h100_held_out, 5.3, 3.1, 9.9},
  };
  for (const auto& set : sets) {
    INFO(set.gpu);
    const Errors fitting = errors(set.gpu, set.fitting);
    CHECK(fitting.per_iteration <= set.fitting_pct);
    CHECK(fitting.of_mean <= set.fitting_mean_pct);
    CHECK(errors(set.gpu, set.held_out).per_iteration <= set.held_out_pct);
  }
}

TEST_CASE(
    "calibrate writes a profile that replay and simulate take; bad input exits 2, writes nothing") {
  const fs::path dir = scratch() / "calibrate";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string runs = kSource + "/traces/cpu-local/";
  const std::string profile = (dir / "profile.json").string();
  const Run c =
      run("calibrate " + runs + "cpu-tiny-tp2-pp2 " + runs + "cpu-tiny-colocated -o " + profile);
  INFO(c.output);
  CHECK(c.code == 0);
  CHECK(c.output.find("llm F small") != std::string::npos);
  CHECK(c.output.find("allreduce x2 intra_node") != std::string::npos);
  CHECK(c.output.find("profile written to " + profile) != std::string::npos);
  REQUIRE(fs::exists(profile));

  const Run r = run("replay " + runs + "cpu-tiny-dp2-pp2 --profile " + profile + " --trace " +
                    (dir / "replay-trace").string() + " --html " + (dir / "replay.html").string());
  INFO(r.output);
  CHECK(r.code == 0);
  {
    // The measured and the predicted step, op by op, on the same ranks.
    std::ifstream page(dir / "replay.html");
    const std::string html((std::istreambuf_iterator<char>(page)),
                           std::istreambuf_iterator<char>());
    CHECK(html.find("measured (the run's trace)") != std::string::npos);
    CHECK(html.find("predicted (simulated with the cost model)") != std::string::npos);
    CHECK(html.find("<rect class='op'") != std::string::npos);
    CHECK(html.find("rank 2: llm s1") != std::string::npos);  // PP2: the second stage's lane
  }
  // A page that cannot be written: exit 2, named.
  const Run no_page = run("replay " + runs + "cpu-tiny-dp2-pp2 --html " +
                          (dir / "missing" / "replay.html").string());
  CHECK(no_page.code == 2);
  CHECK(no_page.output.find("--html " + (dir / "missing" / "replay.html").string()) !=
        std::string::npos);
  CHECK(r.output.find("step time error over the warm iterations") != std::string::npos);
  CHECK(r.output.find("op class") != std::string::npos);
  CHECK(fs::exists(dir / "replay-trace" / "rank3.json"));

  // The VALM's trainable audio encoder runs backward ops no fitted run had: named in a note.
  const Run s =
      run("simulate " + kSource + "/scenarios/cpu-tiny-valm.json --plan " + kSource +
          "/scenarios/plans/cpu-tiny-valm-non-colocated.json --iterations 1 --profile " + profile);
  INFO(s.output);
  CHECK(s.code == 0);
  CHECK(s.output.find("class \"encoder B small\" have no fit") != std::string::npos);

  // A GPU scenario with a profile of this machine is refused.
  const Run g = run("simulate " + kSource + "/scenarios/default.json --profile " + profile);
  CHECK(g.code == 2);
  CHECK(g.output.find(profile + ": machine: the profile was measured on a cpu-local cluster") !=
        std::string::npos);

  // Not a run folder; a missing profile; no -o: exit 2 and no profile written.
  const std::string out = (dir / "never.json").string();
  const Run bad = run("calibrate " + kSource + "/scenarios -o " + out);
  CHECK(bad.code == 2);
  CHECK(bad.output.find(kSource + "/scenarios/run.json") != std::string::npos);
  CHECK(run("calibrate " + runs + "cpu-tiny-tp2-pp2").code == 2);
  CHECK(run("replay " + runs + "cpu-tiny-tp2-pp2 --profile " + (dir / "missing.json").string())
            .code == 2);
  CHECK_FALSE(fs::exists(out));

  // Several runs: one table with --markdown, each run's role by the profile that was fitted on
  // it; --json, --trace and --html take one run.
  const Run table = run("replay " + runs + "cpu-tiny-tp2-pp2 " + runs +
                        "cpu-tiny-dp2-pp2 --profile " + runs + "profile.json --markdown");
  INFO(table.output);
  CHECK(table.code == 0);
  CHECK(table.output.find("| cpu-tiny-tp2-pp2 | fitting |") != std::string::npos);
  CHECK(table.output.find("| cpu-tiny-dp2-pp2 | held out |") != std::string::npos);
  CHECK(table.output.find("| **fitting runs (1)** |") != std::string::npos);
  const Run two = run("replay " + runs + "cpu-tiny-tp2-pp2 " + runs + "cpu-tiny-dp2-pp2 --json");
  CHECK(two.code == 2);
  CHECK(two.output.find("take one run folder") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE(
    "schedule dip: estimate searches a schedule, simulate re-plans per iteration, sweep explores "
    "it") {
  const std::string variable = kSource + "/scenarios/cpu-tiny-variable.json";
  const Run e = run("estimate " + variable + " --set plan.schedule=dip");
  INFO(e.output);
  CHECK(e.code == 0);
  CHECK(e.output.find("note: dip: 1 encoder segment(s) on the LLM's 4 stages") !=
        std::string::npos);
  CHECK(e.output.find("note: dip schedule search: ") != std::string::npos);
  const Run s = run("simulate " + variable + " --set plan.schedule=dip --iterations 2");
  INFO(s.output);
  CHECK(s.code == 0);
  CHECK(s.output.find("dip re-planned every iteration: search ") != std::string::npos);
  // DIP shares the LLM's pipeline ranks: other placements and a single stage are refused.
  const Run one = run("estimate " + variable + " --set plan.schedule=dip --set plan.layout.pp=1");
  CHECK(one.code == 2);
  CHECK(one.output.find("dip needs the LLM to have pp > 1") != std::string::npos);
  // The sweep tries DIP and Entrain beside 1F1B and arrival order when the space lists them.
  const std::string out = (scratch() / "dip-sweep").string();
  const Run w = run("sweep " + variable + " --out " + out);
  INFO(w.output);
  CHECK(w.code == 0);
  CHECK(w.output.find("4 plans considered") != std::string::npos);
  CHECK(w.output.find(" dip entrain ") != std::string::npos);
  const Run bad =
      run("sweep " + variable + " --set 'search.homogeneous_schedules=[\"gpipe\"]' --out " + out);
  CHECK(bad.code == 2);
  CHECK(bad.output.find(
            "search.homogeneous_schedules[0]: must be 1f1b (interleaved where vpp > 1) or dip") !=
        std::string::npos);
}

TEST_CASE(
    "bad inputs across every command: exit 2, the file or option and JSON path named, nothing "
    "written") {
  // Beside the table above (scenario files): flags, --set values, plans, profiles, recorded runs
  // and sweeps, each through the command that reads it. OUT/ is a fresh folder; `writes` names
  // what the command would have written, which must not exist afterwards.
  const fs::path out = scratch() / "bad-everywhere";
  fs::remove_all(out);
  fs::create_directories(out);
  // A recorded run whose trace and run.json are cut short (a crash while writing them).
  const fs::path cut = out / "cut-run";
  fs::copy(kSource + "/traces/cpu-local/cpu-tiny-tp2-pp2", cut, fs::copy_options::recursive);
  for (const fs::path& f : {cut / "trace" / "rank1.json", cut / "run.json"}) {
    std::ifstream in(f);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(f, std::ios::trunc) << text.substr(0, text.size() / 2);
  }
  const fs::path cut_trace = out / "cut-trace";
  fs::copy(kSource + "/traces/cpu-local/cpu-tiny-tp2-pp2", cut_trace, fs::copy_options::recursive);
  {
    const fs::path f = cut_trace / "trace" / "rank1.json";
    std::ifstream in(f);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(f, std::ios::trunc) << text.substr(0, text.size() / 2);
  }
  struct Case {
    std::string args;
    std::string expected;
    std::string writes;  // "" when the command writes nothing anyway
  };
  const std::string tiny = kSource + "/scenarios/cpu-tiny.json";
  const std::string variable = kSource + "/scenarios/cpu-tiny-variable.json";
  const std::string vlm = kSource + "/scenarios/cornstarch/vlm-small.json";
  const std::string o = out.string() + "/";
  const std::vector<Case> cases = {
      {"validate /tmp", "/tmp: is a directory, expected a JSON file", ""},
      {"estimate " + tiny + " --set plan.layout.pp=0", "plan.layout.pp: must be > 0, got 0", ""},
      {"estimate " + tiny + " --set plan.micro_batch_size=x",
       "plan.micro_batch_size: expected an integer, got string", ""},
      {"estimate " + tiny + " --set plan.placement=colocated",
       "plan.modules: required key is missing", ""},
      {"estimate " + tiny + " --set model.dtype=fp7", "model.dtype: unknown value 'fp7'", ""},
      {"estimate " + tiny + " --set workload.seed=-1", "workload.seed: must be >= 0, got -1", ""},
      {"estimate " + tiny + " --set plan.no_such_option=1", "plan.no_such_option: unknown key", ""},
      {"estimate " + variable + " --set plan.schedule=three_phase",
       "plan.schedule: three_phase is the colocated schedule; placement is homogeneous", ""},
      {"estimate " + tiny + " --plan " + o + "no-plan.json", o + "no-plan.json: file not found",
       ""},
      {"estimate " + tiny + " --plan " + kBad + "malformed.json",
       "malformed.json: invalid JSON at line 4", ""},
      {"estimate " + tiny + " --iteration -1", "--iteration must be >= 0", ""},
      {"lower " + tiny + " --rank 99", "--rank 99 out of range: the plan has 2 ranks", ""},
      {"lower " + tiny + " --set workload.max_seq_len=-5",
       "workload.max_seq_len: must be > 0, got -5", ""},
      {"simulate " + tiny + " --iterations 0", "--iterations >= 1", ""},
      {"simulate " + tiny + " --set plan.recompute=some", "plan.recompute: unknown value 'some'",
       ""},
      {"simulate " + tiny + " --set cluster.nodes=0", "cluster.nodes: not used with kind cpu-local",
       ""},
      {"simulate " + tiny + " --profile " + o + "no-profile.json",
       "no-profile.json: file not found", ""},
      {"simulate " + tiny + " --profile " + kBad + "malformed.json", "malformed.json: invalid JSON",
       ""},
      {"simulate " + tiny + " --iterations 1 --trace " + o + "trace --set plan.layout.tp=3",
       "plan.layout.tp: 3 does not divide", o + "trace"},
      {"sweep " + tiny + " --top 0 --out " + o + "sweep-top", "--top, --jobs", o + "sweep-top"},
      {"sweep " + variable + " --set 'search.homogeneous_schedules=[\"gpipe\"]' --out " + o +
           "sweep-space",
       "search.homogeneous_schedules[0]: must be 1f1b (interleaved where vpp > 1) or dip",
       o + "sweep-space"},
      {"sweep " + variable + " --set 'search.microbatching=[\"lifo\"]' --out " + o + "sweep-mb",
       "search.microbatching[0]: unknown value 'lifo'", o + "sweep-mb"},
      {"sweep " + kBad + "unknown-key.json --out " + o + "sweep-key",
       "unknown-key.json: workload.max_seq_length: unknown key", o + "sweep-key"},
      {"merge " + o + "no-sweep --out " + o + "merged", o + "no-sweep/summary.json: file not found",
       o + "merged"},
      {"stages " + vlm + " --tp 0 -o " + o + "stages.json",
       "the budget needs gpus, tp, dp and micro-batch size >= 1", o + "stages.json"},
      {"stages " + vlm + " --tp 2 --set plan.schedule=three_phase -o " + o + "stages2.json",
       "--set: plan.schedule: 'plan.schedule': no key 'plan'", o + "stages2.json"},
      {"replay " + o + "no-run", o + "no-run/run.json: file not found", ""},
      {"replay " + cut.string(), cut.string() + "/run.json: invalid JSON", ""},
      {"calibrate " + cut_trace.string() + " -o " + o + "profile.json",
       cut_trace.string() + "/trace/rank1.json: invalid JSON", o + "profile.json"},
      {"calibrate " + o + "no-run -o " + o + "profile2.json", "run.json: file not found",
       o + "profile2.json"},
      {"import-hf " + kBad + "malformed.json -o " + o + "model.json",
       "malformed.json: invalid JSON", o + "model.json"},
      // Found by the fuzzers (fuzz/regressions): each crashed a command before its fix.
      {"simulate " + tiny + " --profile " + kSource +
           "/fuzz/regressions/profile/number-overflow.json",
       "number-overflow.json: invalid JSON at line 1, column 357: number overflow parsing", ""},
      {"estimate " + kSource + "/fuzz/regressions/scenario/text-tokens-6.9e99.json",
       "workload.samples.text_tokens: draws up to 6.88888888889e+99", ""},
      {"estimate " + tiny + " --set workload.global_batch=100000000",
       "workload.global_batch: 100000000 samples; at most 16777216 are taken", ""},
      {"estimate " + tiny + " --set plan.layout.dp=100000000", "plan.layout: tp*cp*pp*dp is over",
       ""},
  };
  for (const Case& c : cases) {
    const Run r = run(c.args);
    INFO(c.args << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(c.expected) != std::string::npos);
    if (!c.writes.empty()) CHECK_FALSE(fs::exists(c.writes));
  }
  fs::remove_all(out);
}

TEST_CASE(
    "determinism: the same scenario gives byte-identical Programs, simulations and sweep results") {
  const std::string variable = kSource + "/scenarios/cpu-tiny-variable.json";
  const std::string llava = kSource + "/scenarios/variability/llava-7b-64.json";
  // Lowered Programs, DIP's list-scheduled orders and searched schedules included.
  for (const std::string& args :
       {"lower " + variable + " --json --set plan.schedule=dip --set plan.microbatching=entrain",
        "lower " + llava + " --json --rank 40 --set plan.microbatching=entrain"}) {
    // stdout only: the product (a sanitizer build adds warnings with process ids on stderr).
    const Run a = run(args + " 2>/dev/null"), b = run(args + " 2>/dev/null");
    INFO(args);
    REQUIRE(a.code == 0);
    CHECK(a.output.size() > 1000);
    CHECK(a.output == b.output);
  }
  // Simulations: everything but the measured wall time of the simulation and of DIP's search.
  auto without_wall_time = [](const std::string& json) {
    static const std::regex wall(R"re("(wall_s|seconds)": *[-+0-9.eE]+)re");
    return std::regex_replace(json, wall, "\"$1\":0");
  };
  const std::string simulate =
      "simulate " + variable + " --iterations 2 --json --set plan.schedule=dip 2>/dev/null";
  const Run s1 = run(simulate), s2 = run(simulate);
  REQUIRE(s1.code == 0);
  CHECK(s1.output.find("\"dip_search\"") != std::string::npos);
  CHECK(without_wall_time(s1.output) == without_wall_time(s2.output));
  // Sweeps: the same results.jsonl and results.csv with one job or two, twice.
  std::vector<std::string> results, tables;
  for (const char* jobs : {"1", "2", "2"}) {
    const fs::path dir =
        scratch() / ("determinism-j" + std::string(jobs) + "-" + std::to_string(results.size()));
    fs::remove_all(dir);
    const Run w = run("sweep " + variable + " -j " + jobs + " --out " + dir.string());
    REQUIRE(w.code == 0);
    std::ifstream jsonl(dir / "results.jsonl"), csv(dir / "results.csv");
    results.emplace_back((std::istreambuf_iterator<char>(jsonl)), std::istreambuf_iterator<char>());
    tables.emplace_back((std::istreambuf_iterator<char>(csv)), std::istreambuf_iterator<char>());
    fs::remove_all(dir);
  }
  CHECK(results[0].size() > 100);
  CHECK(results[0] == results[1]);
  CHECK(results[1] == results[2]);
  CHECK(tables[0] == tables[1]);
  CHECK(tables[1] == tables[2]);
}

TEST_CASE(
    "a sweep killed with SIGKILL leaves no orphans; --resume ends with the uninterrupted results") {
  const std::string tiny = kSource + "/scenarios/cpu-tiny.json";
  const fs::path whole = scratch() / "kill-whole", killed = scratch() / "kill-resumed";
  fs::remove_all(whole);
  fs::remove_all(killed);
  const std::string sweep = "sweep " + tiny + " --top 16 --iterations 300 -j 2 --out ";
  REQUIRE(run(sweep + whole.string()).code == 0);
  auto lines_of = [](const fs::path& file) {
    std::vector<std::string> lines;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };
  const std::vector<std::string> expected = lines_of(whole / "results.jsonl");
  REQUIRE(expected.size() >= 8);

  // Start the same sweep, kill it once a few rows are written.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string command =
        "exec " + kTessera + " " + sweep + killed.string() + " >/dev/null 2>&1";
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Polled until a few rows are written, however long that takes (seconds here; a sanitizer
  // build on a busy machine takes minutes), or until the sweep ends by itself (a failure).
  bool some_rows = false, ended = false;
  int status = 0;
  while (!some_rows && !ended) {
    some_rows = lines_of(killed / "results.jsonl").size() >= 3;
    if (some_rows) break;
    ended = ::waitpid(pid, &status, WNOHANG) == pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!ended) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  REQUIRE(some_rows);
  CHECK(lines_of(killed / "results.jsonl").size() < expected.size());  // it was cut short
  // Its simulation children die with it (they are forks: the same command line). Each runs
  // ~0.7 s here; within 2 s of the kill none may be left.
  auto orphans = [&] {
    int n = 0;
    for (const auto& entry : fs::directory_iterator("/proc")) {
      std::ifstream cmdline(entry.path() / "cmdline");
      const std::string text((std::istreambuf_iterator<char>(cmdline)),
                             std::istreambuf_iterator<char>());
      if (text.find(killed.string()) != std::string::npos) ++n;
    }
    return n;
  };
  int left = orphans();
  for (int i = 0; i < 200 && left > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    left = orphans();
  }
  CHECK(left == 0);
  // Resumed: every row once, the same rows and the same ranking as the uninterrupted sweep.
  const Run resumed = run(sweep + killed.string() + " --resume");
  REQUIRE(resumed.code == 0);
  std::vector<std::string> got = lines_of(killed / "results.jsonl"), want = expected;
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got == want);
  std::ifstream a(whole / "results.csv"), b(killed / "results.csv");
  CHECK(std::string((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>()) ==
        std::string((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>()));
  fs::remove_all(whole);
  fs::remove_all(killed);
}

TEST_CASE("a full disk or an unwritable folder: a clear error, exit 1, earlier results intact") {
  // A full disk, emulated: files may not grow past `kib` KiB (the signal that limit sends
  // ignored, so writes fail as on a full disk).
  auto full = [](int kib, const std::string& args) {
    return shell("sh -c \"trap '' XFSZ; ulimit -f " + std::to_string(kib) + "; exec " + kTessera +
                 " " + args + "\"");
  };
  auto read = [](const fs::path& file) {
    std::ifstream in(file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const fs::path dir = scratch() / "disk-full";
  fs::remove_all(dir);
  const std::string sweep =
      "sweep " + kSource + "/scenarios/cpu-tiny.json --top 16 --out " + dir.string();
  REQUIRE(run(sweep).code == 0);
  const std::string csv = read(dir / "results.csv"), summary = read(dir / "summary.json");
  const Run r = full(4, sweep);
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(r.output.find("results.jsonl (disk full?); the rows before stay, --resume continues") !=
        std::string::npos);
  CHECK(read(dir / "results.csv") == csv);  // the last complete sweep's files, untouched
  CHECK(read(dir / "summary.json") == summary);
  const Run resumed = run(sweep + " --resume");
  CHECK(resumed.code == 0);
  CHECK(read(dir / "results.csv") == csv);

  // A calibration profile is replaced whole or not at all.
  const std::string profile = (dir / "profile.json").string();
  std::ofstream(profile) << "{\"earlier\": true}\n";
  const Run c =
      full(1, "calibrate " + kSource + "/traces/cpu-local/cpu-tiny-tp2-pp2 -o " + profile);
  CHECK(c.code == 1);
  CHECK(c.output.find("(disk full?)") != std::string::npos);
  CHECK(read(profile) == "{\"earlier\": true}\n");
  // Not a regular file (a device): refused, not replaced.
  const Run device =
      run("calibrate " + kSource + "/traces/cpu-local/cpu-tiny-tp2-pp2 -o /dev/null");
  CHECK(device.code == 1);
  CHECK(device.output.find("/dev/null: exists and is not a regular file") != std::string::npos);
  // An output folder that cannot be made.
  const Run unwritable =
      run("sweep " + kSource + "/scenarios/cpu-tiny.json --out /proc/tessera-no");
  CHECK(unwritable.code == 1);
  CHECK(unwritable.output.find("cannot create directories") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("a simulation child that crashes is one failed row; the sweep completes") {
  const fs::path dir = scratch() / "child-crash";
  fs::remove_all(dir);
  // The third simulation segfaults (an injected failpoint, shared/base/failpoint.hpp).
  const Run r = shell("TESSERA_FAILPOINT=sweep-simulation-crash:2 " + kTessera + " sweep " +
                      kSource + "/scenarios/cpu-tiny.json --top 16 -j 2 --out " + dir.string());
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("failed: killed by signal 11 (Segmentation fault)") != std::string::npos);
  std::ifstream in(dir / "results.jsonl");
  int rows = 0, failed = 0;
  for (std::string line; std::getline(in, line); ++rows)
    failed += line.find("\"ok\":false") != std::string::npos ? 1 : 0;
  CHECK(rows == 16);  // the best 16 of 12 plans and their 24 second-stage variants
  CHECK(failed == 1);
  CHECK(fs::exists(dir / "report.html"));
  fs::remove_all(dir);
}

// At registration, outside any test: no doctest assertion may run here.
bool have_chromium() {
  return std::system("command -v chromium >/dev/null 2>&1") == 0;
}

// Reported as skipped without the Debian package chromium (scripts/setup.sh --browser).
TEST_CASE(
    "the default sweep's report, rendered in headless Chromium, shows results.jsonl's figures" *
    doctest::skip(!have_chromium())) {
  const fs::path dir = scratch() / "report";
  fs::remove_all(dir);
  const Run sweep =
      run("sweep " + kSource + "/scenarios/default.json --gpus 64 --top 4 --refine 0 --out " +
          dir.string() + " 2>/dev/null");
  INFO(sweep.output);
  REQUIRE(sweep.code == 0);
  const Run dom = shell(
      "chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync "
      "--user-data-dir=" +
      (dir / "browser").string() + " --dump-dom file://" + (dir / "report.html").string() +
      " 2>/dev/null");
  REQUIRE(dom.code == 0);
  // The table of simulated plans as the browser laid it out, a row of cells per plan.
  const std::size_t table = dom.output.find("<h2>Simulated plans</h2>");
  REQUIRE(table != std::string::npos);
  const std::string body = dom.output.substr(table, dom.output.find("</table>", table) - table);
  std::vector<std::vector<std::string>> cells;
  const std::regex row(R"(<tr><td>([\s\S]*?)</tr>)"), cell(R"(<td[^>]*>([^<]*)</td>)");
  for (auto r = std::sregex_iterator(body.begin(), body.end(), row); r != std::sregex_iterator();
       ++r) {
    const std::string text = "<td>" + (*r)[1].str();
    std::vector<std::string> one;
    for (auto c = std::sregex_iterator(text.begin(), text.end(), cell); c != std::sregex_iterator();
         ++c)
      one.push_back((*c)[1].str());
    cells.push_back(one);
  }
  // results.jsonl's rows, best first, as the report ranks them.
  std::vector<nlohmann::json> results;
  std::ifstream in(dir / "results.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) results.push_back(nlohmann::json::parse(line));
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) {
    return a["step_s"].template get<double>() < b["step_s"].template get<double>();
  });
  REQUIRE(results.size() >= 3);
  REQUIRE(cells.size() == results.size());
  const auto formatted = [](const char* format, double v) {
    char text[64];
    std::snprintf(text, sizeof text, format, v);
    return std::string(text);
  };
  std::set<std::string> placements;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& want = results[i];
    const auto& got = cells[i];
    INFO("rank " << i + 1 << ": " << want.dump());
    REQUIRE(got.size() == 17);
    CHECK(got[0] == std::to_string(i + 1));
    CHECK(got[3] == want["plan"]["placement"].get<std::string>());
    CHECK(got[11] == formatted("%.4g", want["step_s"].get<double>()));
    CHECK(got[12] == formatted("%.4g", want["tokens_per_s"].get<double>()));
    CHECK(got[14] == formatted("%.1f", 100 * want["mfu"].get<double>()) + "%");
    // Every percentage a share of the step: at most 100.
    const double idle = std::stod(got[16]);
    CHECK(idle >= 0);
    CHECK(idle <= 100);
    CHECK(got[16] == formatted("%.1f", 100 * want["idle_share"].get<double>()) + "%");
    placements.insert(got[3]);
  }
  CHECK(placements.size() == 3);  // every family's best simulated
  fs::remove_all(dir);
}

TEST_CASE("the docs' generated blocks are what their commands print now") {
  // scripts/docs-tables.sh writes each block between "<!-- generated: tessera ARGS -->" (or
  // "<!-- generated: bench NAME table N -->", the N-th markdown table of `scripts/bench.sh NAME`)
  // and "<!-- end generated -->"; a cost-model change that moves a figure shows here until rerun.
  // --check compares every block with what its command prints now and writes nothing (long
  // benches' blocks, minutes to hours each, only with --long). Timed blocks (wall-clock figures)
  // are never compared, only required to hold a measurement and say where it was taken.
  const Run r =
      shell("cd " + kSource + " && TESSERA=" + kTessera + " scripts/docs-tables.sh --check");
  INFO(r.output);
  CHECK(r.code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(
      r.output, m,
      std::regex(
          R"(docs-tables: (\d+) blocks, (\d+) of them from benches, .*\((\d+) from long benches.*; (\d+) timings not compared\))")));
  CHECK(std::stoi(m[1].str()) >= 1);
  CHECK(std::stoi(m[2].str()) >= 2);
  CHECK(std::stoi(m[3].str()) >= 4);   // the heterogeneous regime's at 64 and 256 GPUs
  CHECK(std::stoi(m[4].str()) >= 13);  // PERFORMANCE's wall-clock tables

  // Rerunning a timed bench rewrites; it cannot be part of a check.
  const Run both = shell("cd " + kSource + " && TESSERA=" + kTessera +
                         " scripts/docs-tables.sh --check --timed lower");
  CHECK(both.code == 2);
  CHECK(both.output.find("not with --check") != std::string::npos);
}

TEST_CASE("a timed block is not compared, but one that holds no run fails the check") {
  // The script on a tree of its own: one doc, one timed block, with a run and without one.
  const fs::path root = scratch() / "timed-docs";
  fs::create_directories(root / "scripts");
  fs::create_directories(root / "docs");
  fs::copy_file(kSource + "/scripts/docs-tables.sh", root / "scripts/docs-tables.sh",
                fs::copy_options::overwrite_existing);
  const std::string check =
      "TESSERA=" + kTessera + " bash " + (root / "scripts/docs-tables.sh").string() + " --check";
  std::ofstream(root / "docs/x.md") << "<!-- generated: timed bench lower table 1 -->\n"
                                       "| run | lower |\n|---|---|\n| 1 | 0.5 s |\n\n"
                                       "(Measured 2026-01-01 on 2 cores of a CPU.)\n"
                                       "<!-- end generated -->\n";
  const Run measured = shell(check + " 2>&1");
  INFO(measured.output);
  CHECK(measured.code == 0);
  CHECK(measured.output.find("1 timings not compared") != std::string::npos);

  std::ofstream(root / "docs/x.md") << "<!-- generated: timed bench lower table 1 -->\n"
                                       "<!-- end generated -->\n";
  const Run empty = shell(check + " 2>&1");
  INFO(empty.output);
  CHECK(empty.code == 1);
  CHECK(empty.output.find("docs/x.md: the timed block of bench lower table 1 holds no "
                          "measurement") != std::string::npos);
  fs::remove_all(root);
}

TEST_CASE("docs/CLI.md documents every option each command's --help lists") {
  std::ifstream in(kSource + "/docs/CLI.md");
  REQUIRE(in.good());
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A command's section: from the "## " heading that names it to the next heading.
  const auto section = [&](const std::string& command) {
    const std::string named = "`tessera " + command;
    for (std::size_t at = doc.find("\n## "); at != std::string::npos;
         at = doc.find("\n## ", at + 1)) {
      const std::size_t eol = doc.find('\n', at + 1);
      if (doc.substr(at, eol - at).find(named) == std::string::npos) continue;
      return doc.substr(at, doc.find("\n## ", at + 1) - at);
    }
    return std::string();
  };
  const std::regex option(R"(\n +(?:-\w, )?--([a-z][a-z0-9-]*))");
  int options = 0;
  for (const std::string command :
       {"validate", "show", "import-hf", "lower", "estimate", "simulate", "stages", "sweep",
        "merge", "calibrate", "replay", "fidelity", "export", "tune"}) {
    const Run help = run(command + " --help");
    REQUIRE(help.code == 0);
    const std::string text = section(command);
    INFO(command);
    REQUIRE_FALSE(text.empty());
    for (auto it = std::sregex_iterator(help.output.begin(), help.output.end(), option);
         it != std::sregex_iterator(); ++it) {
      const std::string name = (*it)[1].str();
      if (name == "help") continue;
      ++options;
      INFO("--" << name);
      CHECK(text.find("--" + name) != std::string::npos);
    }
  }
  CHECK(options > 50);  // the options were found at all
}

TEST_CASE("export: a plan as Megatron-LM's arguments, what it cannot express said in notes") {
  // The default scenario: its frozen-aware stage split as a pipeline layout, its encoders named.
  const Run text = run("export " + kSource + "/scenarios/default.json");
  INFO(text.output);
  CHECK(text.code == 0);
  for (const char* flag :
       {"pretrain_gpt.py", "--num-layers 32", "--tensor-model-parallel-size 4",
        "--pipeline-model-parallel-size 2", "--swiglu", "--global-batch-size 256", "--bf16",
        "--pipeline-model-parallel-layout 'Et", "# module vision (encoder, frozen)"})
    CHECK(text.output.find(flag) != std::string::npos);
  // JSON: megatron-core's keyword arguments beside the flags.
  const Run json =
      run("export --json " + kSource + "/scenarios/published/deepseek-v3-report-h800-2048.json");
  REQUIRE(json.code == 0);
  const nlohmann::json j = nlohmann::json::parse(json.output);
  CHECK(j["transformer_config"]["mtp_num_layers"] == 1);
  CHECK(j["transformer_config"]["multi_latent_attention"] == true);
  CHECK(j["transformer_config"]["num_moe_experts"] == 256);
  CHECK(j["transformer_config"]["moe_layer_freq"].size() == 61);
  CHECK(j["transformer_config"]["moe_layer_freq"][2] == 0);
  CHECK(j["transformer_config"]["moe_layer_freq"][3] == 1);
  CHECK(j["transformer_config"]["expert_model_parallel_size"] == 64);
  CHECK(j["batch"]["data_parallel_size"] == 128);
  // DualPipe's overlap without virtual stages is not Megatron-LM's: said, not dropped.
  CHECK(json.output.find("plan.moe_a2a_overlap") != std::string::npos);
  CHECK(!j["transformer_config"].contains("overlap_moe_expert_parallel_comm"));
  // A non-colocated plan: the LLM's grid, the encoders' grids in notes.
  const Run nc = run("export " + kSource + "/scenarios/cpu-tiny.json --plan " + kSource +
                     "/scenarios/plans/cpu-tiny-non-colocated.json");
  CHECK(nc.code == 0);
  CHECK(nc.output.find("MIMO") != std::string::npos);
  // One encoder from rank 0: its grid and the LLM's span as the MIMO example takes them.
  for (const char* flag : {"examples/mimo/pretrain_mimo.py", "--encoder-tp 1", "--encoder-dp 2",
                           "--llm-offset 2", "--llm-pp 2", "--llm-dp 1"})
    CHECK(nc.output.find(flag) != std::string::npos);
  CHECK(nc.output.find("plan.placement non_colocated") != std::string::npos);
  // Written whole to a file with -o.
  const fs::path out = scratch() / "megatron.sh";
  CHECK(run("export " + kSource + "/scenarios/default.json -o " + out.string()).code == 0);
  std::ifstream written(out);
  const std::string body((std::istreambuf_iterator<char>(written)), {});
  CHECK(body == text.output);
  // A model Megatron-LM's GPT cannot hold, and an unknown target: exit 2, said why.
  const fs::path plan = scratch() / "tp8-dp8.json";
  std::ofstream(plan) << R"({"placement": "homogeneous", "layout": {"tp": 8, "dp": 8}})";
  const Run mllama =
      run("export " + kSource + "/scenarios/llama-3.2-11b-vision.json --plan " + plan.string());
  CHECK(mllama.code == 2);
  CHECK(mllama.output.find("cross-attention") != std::string::npos);
  const Run target = run("export " + kSource + "/scenarios/default.json --to torchtitan");
  CHECK(target.code == 2);
  CHECK(target.output.find("megatron") != std::string::npos);
}

#ifdef TESSERA_TRAIN
TEST_CASE(
    "tune: sweep, train the finalists, calibrate, re-rank; resumed, it trains nothing again") {
  const fs::path dir = scratch() / "tune";
  fs::remove_all(dir);
  const std::string base = "tune " + kSource +
                           "/scenarios/cpu-tiny.json --gpus 2 --top 2 --steps 3 -j 2 --train " +
                           std::string(TESSERA_TRAIN) + " --out " + dir.string();
  const Run r = run(base);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("recommended after calibration (") != std::string::npos);
  CHECK(r.output.find("train it:  tessera-train ") != std::string::npos);
  for (const char* written : {"sweep/results.jsonl", "sweep-calibrated/results.jsonl",
                              "profile.json", "tune.json", "runs/rank-1/run.json"})
    CHECK(fs::exists(dir / written));
  const auto tune = nlohmann::json::parse(std::ifstream(dir / "tune.json"));
  int measured = 0;
  for (const auto& f : tune["finalists"]) {
    INFO(f.dump());
    if (f["status"] != "measured") continue;
    ++measured;
    CHECK(f["measured_s"].get<double>() > 0);
    CHECK(f["analytic_s"].get<double>() > 0);
    CHECK(f["calibrated_s"].get<double>() > 0);
    // Two runs: each is also predicted by a profile fitted to the other one alone.
    CHECK(f.contains("held_out_error_pct"));
  }
  CHECK(measured == 2);
  CHECK(tune["analytic_first_rank"].get<int>() >= 1);
  CHECK(tune["gain_over_analytic_first_pct"].get<double>() >= 0);
  // Tune's choice measured (trained to check it where it was no finalist).
  REQUIRE(tune.contains("recommended"));
  CHECK(tune["recommended"]["measured_s"].get<double>() > 0);
  CHECK(fs::exists(tune["recommended"]["run"].get<std::string>() + "/run.json"));
  // The recommended plan is one `tessera-train --plan results.jsonl#1` takes.
  const Run plan = run("export " + kSource + "/scenarios/cpu-tiny.json --plan " +
                       (dir / "sweep-calibrated" / "results.jsonl#1").string());
  CHECK(plan.code == 0);

  const Run again = run(base + " --resume");
  INFO(again.output);
  REQUIRE(again.code == 0);
  CHECK(again.output.find("recorded already") != std::string::npos);
  CHECK(again.output.find("trained in") == std::string::npos);
  const auto tune2 = nlohmann::json::parse(std::ifstream(dir / "tune.json"));
  CHECK(tune2["finalists"][0]["measured_s"] == tune["finalists"][0]["measured_s"]);

  CHECK(run("tune " + kSource + "/scenarios/cpu-tiny.json --top 0 --gpus 2").code == 2);
  CHECK(run("tune " + kSource + "/scenarios/cpu-tiny.json").code == 2);  // cpu-local: --gpus
  CHECK(run("tune " + kBad + "missing.json --gpus 2").code == 2);
  fs::remove_all(dir);
}
#endif

TEST_CASE("gemms sets measured products beside the model; a bad measurement file exits 2") {
  const Run r = run("gemms " + kSource + "/traces/h200/gemm-rates.jsonl");
  CHECK(r.code == 0);
  CHECK(r.output.find("measured on NVIDIA H200 (torch 2.11.0+cu130), priced as H200-SXM-141GB") ==
        0);
  CHECK(r.output.find("grouped bf16                 14 products") != std::string::npos);
  const Run md = run("gemms " + kSource + "/traces/h200/gemm-rates.jsonl --markdown");
  CHECK(md.code == 0);
  CHECK(md.output.find("| fp8 per tensor | 8192 | 8192 | 8192 | 1 | 0.7529 ms | 1460 |") !=
        std::string::npos);
  const Run other = run("gemms " + kSource + "/traces/h200/gemm-rates.jsonl --device nosuch");
  CHECK(other.code == 2);
  CHECK(other.output.find("nosuch: no shipped device is named so") != std::string::npos);
  const Run bad = run("gemms " + kBad + "gemm-rates.jsonl");
  CHECK(bad.code == 2);
  CHECK(bad.output.find("gemm-rates.jsonl: line 2.m: must be > 0, got -1") != std::string::npos);
  CHECK(bad.output.find("gemm-rates.jsonl: line 3: column 3: syntax error") != std::string::npos);
  // A product the device has no peak for is named by its line, blank lines counted.
  const fs::path fp8 = scratch() / "fp8-rates.jsonl";
  std::ofstream(fp8) << R"({"device": "NVIDIA H200", "torch": "2.11"})"
                     << "\n\n"
                     << R"({"kind": "dense", "what": "f", "dtype": "fp8", "scaling": "tensor", )"
                     << R"("m": 128, "n": 128, "k": 128, "groups": 1, "seconds": 1e-5})"
                     << "\n";
  const Run a100 = run("gemms " + fp8.string() + " --device A100-SXM4-80GB");
  CHECK(a100.code == 2);
  CHECK(
      a100.output.find("fp8-rates.jsonl: line 3.dtype: A100-SXM4-80GB has no peak at this dtype") !=
      std::string::npos);
}

// The `gpu` label: tessera-train on a GPU against its CPU runs. The tiny models train 3 steps on
// the device and on the CPU: fp32 losses and gradient norms within 1e-4, a bf16 model within
// 1e-2 of the CPU's fp32 run, never NaN; then the parallel plans on the device, several ranks
// sharing its one GPU over Gloo, against the device's one-rank run.
// TESSERA_TEST_DEVICE names the device (default cuda); scripts/gpu-check.sh --device cpu runs the
// same checks on the CPU, so that they keep working where no GPU is lent.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "tests/exec/run_train.hpp"
#include "tests/exec/scratch.hpp"

namespace {

const std::string kSource = source_dir();

std::string device() {
  const char* d = std::getenv("TESSERA_TEST_DEVICE");
  return d != nullptr && *d != '\0' ? d : "cuda";
}

struct Trained {
  std::vector<double> loss, norm;
};

Trained trained(const std::string& scenario, const std::string& layout, const std::string& name,
                const std::string& on) {
  const fs::path out = fresh_dir(name);
  const Run r = run(scenario + " --plan " + plan_file(layout) + " --steps 3 --device " + on +
                    " --no-checkpoint --out " + out.string());
  INFO(r.output);
  REQUIRE(r.code == 0);
  return {losses(out), losses(out, "grad_norm")};
}

void check_close(const Trained& got, const Trained& want, double tolerance,
                 const std::string& what) {
  REQUIRE(got.loss.size() == want.loss.size());
  REQUIRE(got.norm.size() == want.norm.size());
  for (std::size_t i = 0; i < got.loss.size(); ++i) {
    INFO(what << " step " << i << ": loss " << got.loss[i] << " vs " << want.loss[i] << ", norm "
              << got.norm[i] << " vs " << want.norm[i]);
    CHECK(std::isfinite(got.loss[i]));
    CHECK(std::isfinite(got.norm[i]));
    CHECK(std::abs(got.loss[i] - want.loss[i]) <= tolerance * std::abs(want.loss[i]));
    CHECK(std::abs(got.norm[i] - want.norm[i]) <= tolerance * std::abs(want.norm[i]));
  }
}

}  // namespace

TEST_CASE("the tiny models on the device against the CPU: fp32 within 1e-4, bf16 within 1e-2") {
  const std::string on = device();
  for (const std::string name : {"cpu-tiny", "cpu-tiny-valm", "cpu-tiny-moe"}) {
    const std::string fp32 = kSource + "/scenarios/" + name + ".json";
    const std::string bf16 = edited_scenario(
        fp32, [](Json& s) { s["model"]["dtype"] = "bf16"; }, name + "-bf16-scenario");
    const Trained cpu = trained(fp32, R"({"tp": 1})", name + "-cpu", "cpu");
    check_close(trained(fp32, R"({"tp": 1})", name + "-" + on, on), cpu, 1e-4,
                name + " fp32 on " + on);
    check_close(trained(bf16, R"({"tp": 1})", name + "-bf16-" + on, on), cpu, 1e-2,
                name + " bf16 on " + on);
  }
}

TEST_CASE("parallel plans on the device agree with its one rank (ranks share the GPU)") {
  const std::string on = device();
  const std::string tiny = kSource + "/scenarios/cpu-tiny.json";
  const Trained one = trained(tiny, R"({"tp": 1})", "one-" + on, on);
  for (const auto& [layout, name] : std::vector<std::pair<std::string, std::string>>{
           {R"({"tp": 2})", "tp2"},
           {R"({"pp": 2})", "pp2"},
           {R"({"dp": 2})", "dp2"},
           {R"({"cp": 2})", "cp2"},
           {R"({"dp": 2, "tp": 2}, "distributed_optimizer": true)", "zero1"}})
    check_close(trained(tiny, layout, name + "-" + on, on), one, 1e-5, name + " on " + on);
}

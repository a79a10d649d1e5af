// Fuzz target: a recorded run's run.json (what `tessera calibrate` and `tessera replay` read),
// joined to a fixed set of traces (fuzz/fixtures/trace: iteration 4 of the cpu-tiny-dp2-pp2
// recording). Properties: a refusal gives a reason; every iteration of an accepted run lowers
// again (replay does that); the traces are joined or refused with a reason.
#include <cstdint>
#include <filesystem>

#include "fuzz/support.hpp"
#include "shared/records/run_record.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const std::string& run_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::path(fuzz::scratch_dir()) / "run";
    fs::create_directories(d / "trace");
    const fs::path fixture = fs::path(TESSERA_SOURCE_DIR) / "fuzz";
    fs::copy_file(fixture / "corpus/trace/dp2-pp2-rank0.json", d / "trace/rank0.json");
    for (int r = 1; r < 4; ++r) {
      const std::string name = "rank" + std::to_string(r) + ".json";
      fs::copy_file(fixture / "fixtures/trace" / name, d / "trace" / name);
    }
    return d.string();
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  fuzz::write_text(run_dir() + "/run.json", fuzz::as_text(data, size));
  Diagnostics diag;
  const std::optional<RunRecord> run = load_run(run_dir(), diag);
  if (!run) {
    fuzz::refused("a run", diag);
    return 0;
  }
  fuzz::accepted("a run", diag);
  // Replay lowers every recorded iteration; a few are enough to show that it can.
  for (std::size_t i = 0; i < run->iterations.size() && i < 4; ++i)
    for (const std::string& problem : check_program(lower_recorded(*run, run->iterations[i])))
      fuzz::fail("a recorded iteration lowers to a broken Program: " + problem);
  if (load_traces(*run, diag))
    fuzz::accepted("its traces", diag);
  else
    fuzz::refused("its traces", diag);
  return 0;
}

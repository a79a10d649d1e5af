// Fuzz target: rank 0's Chrome trace of a recorded run (the cpu-tiny-dp2-pp2 recording's
// iteration 4; fuzz/fixtures/trace holds the other ranks), as `tessera calibrate` joins it to
// the Program. Properties: a refusal gives a reason; an accepted trace gives every op a finite
// measured span that does not end before it starts.
#include <cmath>
#include <cstdint>
#include <filesystem>

#include "fuzz/support.hpp"
#include "shared/records/run_record.hpp"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

const RunRecord& recorded_run() {
  static const RunRecord run = [] {
    const fs::path d = fs::path(fuzz::scratch_dir()) / "trace-run";
    fs::create_directories(d / "trace");
    const fs::path source = fs::path(TESSERA_SOURCE_DIR);
    fs::copy_file(source / "traces/cpu-local/cpu-tiny-dp2-pp2/run.json", d / "run.json");
    for (int r = 1; r < 4; ++r) {
      const std::string name = "rank" + std::to_string(r) + ".json";
      fs::copy_file(source / "fuzz/fixtures/trace" / name, d / "trace" / name);
    }
    Diagnostics diag;
    std::optional<RunRecord> loaded = load_run(d.string(), diag);
    if (!loaded) fuzz::fail("the fixture run does not load:\n" + diag.format());
    return *loaded;
  }();
  return run;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const RunRecord& run = recorded_run();
  fuzz::write_text(run.dir + "/trace/rank0.json", fuzz::as_text(data, size));
  Diagnostics diag;
  const std::optional<std::vector<TracedIteration>> traced = load_traces(run, diag);
  if (!traced) {
    fuzz::refused("a trace", diag);
    return 0;
  }
  fuzz::accepted("a trace", diag);
  for (const TracedIteration& it : *traced)
    for (const auto& rank : it.timeline.ops)
      for (const auto& span : rank)
        if (!std::isfinite(span.start_s) || !std::isfinite(span.finish_s) ||
            span.finish_s < span.start_s)
          fuzz::fail("an accepted trace has an op from " + std::to_string(span.start_s) + " s to " +
                     std::to_string(span.finish_s) + " s");
  return 0;
}

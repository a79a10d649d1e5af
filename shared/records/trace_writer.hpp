// Chrome Trace Event JSON, one file per rank (docs/ALGORITHMS.md §8): pid = rank,
// tid = stream, "X" slices carrying op id, module, stage, micro-batch and phase; flow events
// joining each send to its receive; a ProfilerStep#N slice per iteration; communication slices
// named nccl:/gloo:<op>; distributedInfo for trace-analysis tools. The simulator and the
// executor write through this one writer, so Perfetto opens both the same way.
#pragma once

#include <string>
#include <vector>

#include "shared/cost/evaluator.hpp"
#include "shared/program/program.hpp"

namespace tessera {

struct TraceIteration {
  const Program* program = nullptr;
  const Timeline* timeline = nullptr;
  double offset_s = 0;  // where this iteration starts on the trace's clock
};

// Writes DIR/rank<r>.json for every rank (atomically: temporary file, then rename). `backend`
// names the communication library in slice names ("nccl", "gloo", or "sim"). Returns an error
// message, or "" on success.
std::string write_chrome_traces(const std::string& dir,
                                const std::vector<TraceIteration>& iterations,
                                const std::string& backend);

}  // namespace tessera

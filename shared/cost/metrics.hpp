// Metrics of one executed iteration — from a Program and the Timeline of its execution, whoever
// produced it (the in-order evaluator, the SimGrid simulator, or a recorded run).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/cost/evaluator.hpp"
#include "shared/model/batch.hpp"
#include "shared/program/program.hpp"
#include "shared/spec/cluster_spec.hpp"

namespace tessera {

struct Contributor {
  std::string what;  // "llm F", "llm B", "pp send", "dp allreduce", ...
  double seconds = 0;
};

// How much one module's stage time varies between the micro-batches of an iteration (Entrain's
// metric): per rank, the compute time each micro-batch spends in the module's ops there; the
// coefficient of variation (std/mean) and max/mean over the micro-batches, averaged over the
// module's ranks.
struct MicrobatchVariability {
  std::string module;
  double cv = 0;
  double max_over_mean = 1;
  int64_t microbatches = 0;
};

struct IterationMetrics {
  double step_s = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;  // LLM sequence tokens
  double text_tokens_per_s = 0, image_tokens_per_s = 0, audio_tokens_per_s = 0,
         video_tokens_per_s = 0;
  // Model FLOPs (F+B+W, no recomputation; attention over the query-key pairs its mask keeps,
  // causal: about half) per second per device, and that over the device's dense peak (MFU).
  double tflops_per_device = 0;
  double mfu = 0;
  // Hardware FLOPs: the same with recomputation's repeated forward (HFU).
  double hardware_tflops_per_device = 0;
  double hfu = 0;
  bool pipelined = false;      // some module runs on more than one pipeline stage
  std::vector<double> bubble;  // per rank: idle / busy, busy = computing (transfers are idle)
  double bubble_mean = 0;
  // per rank: the time its transfers run while it computes nothing — sends, receives,
  // data-parallel reductions and gathers, the gradient norm (nested TP/CP/EP collectives count as
  // part of their compute op)
  std::vector<double> exposed_comm_s;
  double exposed_comm_mean_s = 0;
  double exposed_boundary_mean_s = 0;  // the part of it that module-boundary transfers take
  std::vector<std::pair<std::string, double>> module_busy_s;  // per module, summed over ranks
  // per module with two micro-batches or more on some rank (whole-batch ops do not count)
  std::vector<MicrobatchVariability> microbatch_variability;
  std::vector<RankMemory> memory;  // per rank, activations from the timeline's stash walk
  int64_t peak_rank = 0;
  std::vector<Contributor> critical_path;  // largest contributors first
};

// Memory per rank: the program's parameter state plus the peak of activations stashed along each
// rank's compute stream (which runs in program order, so no timeline is needed).
std::vector<RankMemory> memory_per_rank(const Program& program);

// REQUIRES: timeline.error empty; timeline produced from `program`.
IterationMetrics compute_metrics(const Program& program, const Timeline& timeline,
                                 const ModelSpec& model, const ClusterSpec& cluster,
                                 const Batch& batch);

// The critical path: walk back from the op that finished last through whatever it waited for
// (a dependency, the previous op of its stream, the send of a receive, the last member of a
// collective) and sum the time per kind of op.
std::vector<Contributor> critical_path(const Program& program, const Timeline& timeline);

}  // namespace tessera

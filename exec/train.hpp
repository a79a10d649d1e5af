// `tessera-train <scenario>`: real training of a scenario's model with a plan. One worker per
// rank (launcher.hpp); each runs the Program interpreter (runtime.hpp) step by step, rank 0
// prints progress, and with --out the job records loss.jsonl (as it goes), run.json, one Chrome
// trace per rank and checkpoints (per-rank shards + manifest, written atomically).
#pragma once

#include <string>

#include "exec/device.hpp"
#include "exec/launcher.hpp"
#include "exec/runtime.hpp"
#include "shared/layout/scenario.hpp"

namespace tessera::exec {

struct TrainJob {
  Scenario scenario;  // validated, with its plan
  std::string scenario_file;
  int64_t steps = 10;
  std::string out_dir;  // "": record nothing. Rank 0's value (and --resume) holds for all ranks
  bool resume = false;  // continue from out_dir/checkpoint/manifest.json
  int64_t checkpoint_every = 0;  // also checkpoint every N steps (always at the end with --out)
  bool checkpoint = true;        // false: no checkpoints at all
  int64_t trace_steps = 20;      // steps recorded in the Chrome traces
  int64_t profile_step = -1;     // this step's kernels into out_dir/profile/ (-1: none)
  double timeout_s = 120;        // rendezvous and every collective
  TrainOptions options;
  // cpu, or cuda: each rank on GPU (local rank mod the GPUs it sees).
  torch::DeviceType device = torch::kCPU;
  Precision precision = Precision::kFp32;  // the model's dtype: fp32, or bf16 mixed precision
  // How ranks talk: "gloo", "nccl", or "auto" (NCCL on GPUs when every rank of a node has a GPU
  // of its own, Gloo otherwise). Rank 0's choice holds for every rank.
  std::string transport = "auto";
  int local_ranks = 1;  // ranks per node, for "auto" (the launcher's --nproc)
};

// The body of one worker: trains, records, returns 0 (or throws with the reason).
int train_worker(const WorkerEnv& env, const TrainJob& job);

}  // namespace tessera::exec

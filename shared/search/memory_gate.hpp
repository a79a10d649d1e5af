// Estimates running side by side share this machine's memory. Each takes a share of a budget,
// sized by the Program its plan will lower into, before lowering it, and waits while the others
// hold too much; a plan whose share alone exceeds the budget runs when nothing else does. Two
// 1,024-rank colocated Programs of 6 GB each then never meet on a machine of 24 GB.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "shared/layout/parallel_plan.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

class MemoryGate {
 public:
  explicit MemoryGate(double budget_bytes) : budget_(budget_bytes) {}
  // Admits `bytes` when they fit beside what is held, or when nothing is held.
  bool try_acquire(double bytes);
  // Waits until try_acquire admits `bytes`.
  void acquire(double bytes);
  void release(double bytes);

 private:
  std::mutex mutex_;
  std::condition_variable freed_;
  const double budget_;
  double held_ = 0;
  int64_t holders_ = 0;
};

// The memory this machine can give now (MemAvailable in /proc/meminfo; 8 GiB where unknown).
double available_memory_bytes();

// A rough size of the Program that lowering `plan` builds, known before lowering it: 800 bytes
// per rank, micro-batch, pipeline chunk and phase (measured at 1,024 ranks: 0.89 GB for 1.0 M
// of these, 6.5 GB for 8.4 M). Every rank counts: folding identical ranks only shrinks it.
// REQUIRES: plan validated against model and workload.
double lowering_footprint_bytes(const ParallelPlan& plan, const ModelSpec& model,
                                const WorkloadSpec& workload);

}  // namespace tessera

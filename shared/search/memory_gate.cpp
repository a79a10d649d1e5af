#include "shared/search/memory_gate.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace tessera {

bool MemoryGate::try_acquire(double bytes) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (holders_ > 0 && held_ + bytes > budget_) return false;
  held_ += bytes;
  ++holders_;
  return true;
}

void MemoryGate::acquire(double bytes) {
  std::unique_lock<std::mutex> lock(mutex_);
  freed_.wait(lock, [&] { return holders_ == 0 || held_ + bytes <= budget_; });
  held_ += bytes;
  ++holders_;
}

void MemoryGate::release(double bytes) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    held_ -= bytes;
    --holders_;
    if (holders_ == 0) held_ = 0;  // no rounding left behind
  }
  freed_.notify_all();
}

double available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    double kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024.0;
  }
  return 8.0 * (1 << 30);
}

double lowering_footprint_bytes(const ParallelPlan& plan, const ModelSpec& model,
                                const WorkloadSpec& workload) {
  int64_t chunks = plan.layout.vpp;
  for (const auto& [name, layout] : plan.modules) chunks = std::max(chunks, layout.vpp);
  constexpr double kBytesPerOp = 800;
  constexpr double kPhases = 4;  // forward, recompute, input and weight gradients
  return kBytesPerOp * kPhases * static_cast<double>(world_size(plan, model)) *
         static_cast<double>(micro_batches(plan, model, workload)) *
         static_cast<double>(std::max<int64_t>(1, chunks));
}

}  // namespace tessera

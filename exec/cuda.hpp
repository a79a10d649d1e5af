// What the executor asks of CUDA, in one place: whether this build has it, the GPUs and the
// process's current one, NCCL process groups, op timing by CUDA events, and the caching
// allocator's peak memory. A build against a CPU-only torch (Debian's 1.13) compiles the same
// declarations; there cuda_built() is false and the rest refuse with the reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "exec/torch_compat.hpp"

namespace tessera::exec {

// Compiled against a CUDA build of torch with NCCL (scripts/setup.sh --torch2).
bool cuda_built();
// GPUs this process sees (0 without CUDA, or without a driver).
int cuda_devices();
// Makes `index` this process's current GPU.
void use_cuda_device(int index);
// Waits for the work queued on the current GPU.
void cuda_synchronize();
// The current GPU's name ("NVIDIA H100 80GB HBM3"); empty without CUDA.
std::string cuda_device_name();

// An NCCL process group of `size` ranks over `store` on the current GPU; its collectives fail
// after `timeout` instead of hanging.
c10::intrusive_ptr<CollectiveGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

// The caching allocator's peak since the last reset, on the current GPU.
struct CudaMemory {
  int64_t peak_allocated_bytes = 0;  // held by tensors
  int64_t peak_reserved_bytes = 0;   // held by the allocator (what the GPU sees used)
};
CudaMemory cuda_memory_peak();
void reset_cuda_memory_peak();

// Start and finish times of a step's ops from CUDA events recorded on the current stream as
// each op is queued; read once the step's work is done, without a synchronisation per op.
class CudaOpClock {
 public:
  CudaOpClock();
  ~CudaOpClock();
  void start();              // the step's origin
  void mark(std::size_t i);  // event i: op i / 2 starts (even) or finishes (odd)
  // After the step: each event's seconds from the origin (waits for the last event).
  std::vector<double> seconds(std::size_t events);

 private:
  struct Events;
  std::unique_ptr<Events> events_;
};

}  // namespace tessera::exec

#include "exec/cuda.hpp"

#include <stdexcept>
#include <string>

#include "exec/torch_api.hpp"

#ifdef TESSERA_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace tessera::exec {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw std::runtime_error(std::string(what) +
                           ": this build of the executor has no CUDA (it was built against a "
                           "CPU-only torch; scripts/setup.sh --torch2 installs a CUDA one)");
}
}  // namespace

#ifdef TESSERA_CUDA

bool cuda_built() {
  return true;
}

int cuda_devices() {
  return static_cast<int>(torch::cuda::device_count());
}

void use_cuda_device(int index) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
}

void cuda_synchronize() {
  c10::cuda::device_synchronize();
}

std::string cuda_device_name() {
  return at::cuda::getCurrentDeviceProperties()->name;
}

c10::intrusive_ptr<CollectiveGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

CudaMemory cuda_memory_peak() {
  const auto device = c10::cuda::current_device();
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  const auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return {stats.allocated_bytes[all].peak, stats.reserved_bytes[all].peak};
}

void reset_cuda_memory_peak() {
  c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
}

struct CudaOpClock::Events {
  at::cuda::CUDAEvent origin{cudaEventDefault};
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> marks;
};

CudaOpClock::CudaOpClock() : events_(std::make_unique<Events>()) {}
CudaOpClock::~CudaOpClock() = default;

void CudaOpClock::start() {
  events_ = std::make_unique<Events>();
  events_->origin.record();
}

void CudaOpClock::mark(std::size_t i) {
  auto& marks = events_->marks;
  if (marks.size() <= i) marks.resize(i + 1);
  marks[i] = std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault);
  marks[i]->record();
}

std::vector<double> CudaOpClock::seconds(std::size_t events) {
  std::vector<double> out(events, 0.0);
  auto& marks = events_->marks;
  for (std::size_t i = marks.size(); i-- > 0;)
    if (marks[i]) {
      marks[i]->synchronize();  // the last one recorded: every earlier one is done too
      break;
    }
  for (std::size_t i = 0; i < events && i < marks.size(); ++i)
    if (marks[i]) out[i] = events_->origin.elapsed_time(*marks[i]) / 1000.0;
  return out;
}

#else

bool cuda_built() {
  return false;
}

int cuda_devices() {
  return 0;
}

void use_cuda_device(int) {
  no_cuda("a CUDA device");
}

void cuda_synchronize() {}

std::string cuda_device_name() {
  return "";
}

c10::intrusive_ptr<CollectiveGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int,
                                                    int, std::chrono::milliseconds) {
  no_cuda("NCCL");
}

CudaMemory cuda_memory_peak() {
  return {};
}

void reset_cuda_memory_peak() {}

struct CudaOpClock::Events {};
CudaOpClock::CudaOpClock() {
  no_cuda("CUDA event timing");
}
CudaOpClock::~CudaOpClock() = default;
void CudaOpClock::start() {}
void CudaOpClock::mark(std::size_t) {}
std::vector<double> CudaOpClock::seconds(std::size_t events) {
  return std::vector<double>(events, 0.0);
}

#endif

}  // namespace tessera::exec

#include "exec/kernel_profile.hpp"

#include <set>
#include <stdexcept>

#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

namespace tessera::exec {

#if TORCH_VERSION_MAJOR >= 2

namespace {
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> a{ActivityType::CPU};
  if (cuda) a.insert(ActivityType::CUDA);
  return a;
}
}  // namespace

bool kernel_profile_built() {
  return true;
}

void start_kernel_profile(bool cuda) {
  const ProfilerConfig config(ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities(cuda));
  torch::autograd::profiler::enableProfiler(config, activities(cuda));
}

void stop_kernel_profile(const std::string& path) {
  torch::autograd::profiler::disableProfiler()->save(path);
}

#else

bool kernel_profile_built() {
  return false;
}

void start_kernel_profile(bool) {
  throw std::runtime_error("--profile-step needs a torch 2 build (scripts/setup.sh --torch2)");
}

void stop_kernel_profile(const std::string&) {}

#endif

}  // namespace tessera::exec

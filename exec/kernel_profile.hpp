// Torch's own profiler around one training step: every operator on the host and, on a GPU,
// every kernel with its duration, saved as a Chrome trace (tessera-train --profile-step). The
// Program's traces time ops; this says which kernels an op spent its time in.
#pragma once

#include <string>

namespace tessera::exec {

// Whether this build can profile (torch 2: its Kineto profiler; Debian's LibTorch 1.13 cannot).
bool kernel_profile_built();
// Starts recording this process's operators, and with `cuda` its GPU kernels.
void start_kernel_profile(bool cuda);
// Stops recording and writes the Chrome trace to `path`.
void stop_kernel_profile(const std::string& path);

}  // namespace tessera::exec

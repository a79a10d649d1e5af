// Where a worker's tensors live and the precision its layers compute in. Each rank is a process
// of its own, so this is the process's setting, made once before the Worker builds a tensor (as
// torch's current CUDA device is): CPU and fp32 unless set.
// Mixed precision is Megatron-LM's: parameters, their gradients and the optimizer state stay
// fp32 (the master weights), activations and their gradients flow in bf16, each linear uses its
// fp32 weight's bf16 working copy (working_copies.hpp), and norms, softmax and the loss compute in
// fp32.
#pragma once

#include <string>
#include <vector>

#include <torch/types.h>

namespace tessera::exec {

enum class Precision { kFp32, kBf16 };

struct DeviceSetting {
  torch::Device device{torch::kCPU};
  Precision precision = Precision::kFp32;
  bool grad_reduce_in_fp32 = false;  // the plan's option (parallel_plan.hpp)
};

// Also turns TF32 off: fp32 products and convolutions run in full fp32 on a GPU.
void set_device_setting(const DeviceSetting& setting);
const DeviceSetting& device_setting();

// fp32 (or `dtype`) on this process's device: parameters, gradients, optimizer state.
torch::TensorOptions on_device(torch::ScalarType dtype = torch::kFloat32);
// The dtype activations and their gradients flow in: bf16 under mixed precision, else fp32.
torch::ScalarType activation_dtype();
// Activations (and received activations or gradients) on this process's device.
torch::TensorOptions activation_options();
// The dtype parameter gradients are reduced over data-parallel ranks in, as the Program prices
// those reductions: fp32 under the plan's grad_reduce_in_fp32 (Megatron-LM's default for bf16),
// else the model's (bf16 for a bf16 model).
torch::ScalarType gradient_reduction_dtype();
// Indices on this process's device.
torch::Tensor device_indices(const std::vector<int64_t>& values);
// A tensor built on the CPU (a micro-batch's pixels, token ids, positions, the indices its
// attention and loss use) on this process's device. On a GPU it leaves from pinned memory and
// the host goes on: a copy from pageable memory waits for every kernel queued before it, which
// drains the GPU's queue at each micro-batch and with it the host's lead (nine such waits a
// micro-batch in a profiled step of the ~1B VLM). TESSERA_SYNC_UPLOADS=1 copies from pageable
// memory instead, for an A/B of the two.
torch::Tensor upload(const torch::Tensor& t);

// "cpu", "cuda" or "cuda:N" -> a device. Empty `problem` when the text is understood; it says
// what is wrong otherwise.
torch::Device parse_device(const std::string& text, std::string& problem);
const char* precision_name(Precision precision);

}  // namespace tessera::exec

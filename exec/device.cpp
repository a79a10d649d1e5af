#include "exec/device.hpp"

#include <cstdlib>
#include <cstring>

#include "exec/torch_api.hpp"

namespace tessera::exec {

namespace {
DeviceSetting& setting() {
  static DeviceSetting s;
  return s;
}
}  // namespace

void set_device_setting(const DeviceSetting& s) {
  setting() = s;
  // fp32 means fp32 on a GPU too: no TF32 in matrix products or convolutions (their 10-bit
  // mantissa would put GPU runs 1e-3 from CPU ones).
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
}

const DeviceSetting& device_setting() {
  return setting();
}

torch::TensorOptions on_device(torch::ScalarType dtype) {
  return torch::TensorOptions().device(setting().device).dtype(dtype);
}

torch::ScalarType activation_dtype() {
  return setting().precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat32;
}

torch::ScalarType gradient_reduction_dtype() {
  return setting().grad_reduce_in_fp32 ? torch::kFloat32 : activation_dtype();
}

torch::TensorOptions activation_options() {
  return on_device(activation_dtype());
}

torch::Tensor device_indices(const std::vector<int64_t>& values) {
  return upload(torch::tensor(values, torch::kInt64).view({-1}));
}

torch::Tensor upload(const torch::Tensor& t) {
  static const bool sync = [] {
    const char* v = std::getenv("TESSERA_SYNC_UPLOADS");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  const torch::Device& device = setting().device;
  if (!device.is_cuda() || !t.device().is_cpu() || sync) return t.to(device);
  // The pinned copy stays allocated until the transfer that reads it is done (torch's caching
  // host allocator records it on the stream).
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

torch::Device parse_device(const std::string& text, std::string& problem) {
  problem.clear();
  if (text == "cpu") return torch::kCPU;
  if (text == "cuda") return {torch::kCUDA, 0};
  if (text.starts_with("cuda:")) {
    const std::string index = text.substr(5);
    if (!index.empty() && index.size() < 4 &&
        index.find_first_not_of("0123456789") == std::string::npos)
      return {torch::kCUDA, static_cast<c10::DeviceIndex>(std::stoi(index))};
  }
  problem = "--device " + text + ": expected cpu, cuda or cuda:N";
  return torch::kCPU;
}

const char* precision_name(Precision precision) {
  return precision == Precision::kBf16 ? "bf16" : "fp32";
}

}  // namespace tessera::exec

#include "shared/spec/device_kernels.hpp"

namespace tessera {

namespace {

// A fraction of a peak: (0, 1].
void read_fraction(ObjectReader& r, std::string_view key, double& out) {
  if (!r.optional(key, out)) return;
  if (!(out > 0 && out <= 1)) r.error(key, "must be in (0, 1], got " + std::to_string(out));
}

AttentionKernels read_attention(const Json& json, const std::string& file, const std::string& path,
                                Diagnostics& diag) {
  AttentionKernels a;
  ObjectReader ar(json, file, path, diag);
  if (!ar.valid()) return a;
  read_fraction(ar, "forward_efficiency", a.forward_efficiency);
  read_fraction(ar, "backward_efficiency", a.backward_efficiency);
  if (ar.optional("half_keys", a.half_keys)) ar.check_at_least("half_keys", a.half_keys, 0.0);
  ar.finish();
  return a;
}

void read_training_scale(ObjectReader& r, double& scale) {
  if (r.optional("training_scale", scale) && !(scale > 0 && scale <= 2))
    r.error("training_scale", "must be in (0, 2], got " + std::to_string(scale));
}

Json to_json(const AttentionKernels& a) {
  return {{"forward_efficiency", a.forward_efficiency},
          {"backward_efficiency", a.backward_efficiency},
          {"half_keys", a.half_keys}};
}

}  // namespace

DeviceKernels read_device_kernels(const Json& json, const std::string& file,
                                  const std::string& path, Diagnostics& diag) {
  DeviceKernels k;
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return k;
  if (const Json* g = r.find("gemm")) {
    ObjectReader gr(*g, file, r.path_of("gemm"), diag);
    if (gr.required("sms", k.gemm.sms)) gr.check_positive("sms", k.gemm.sms);
    if (gr.optional("tile_m", k.gemm.tile_m)) gr.check_positive("tile_m", k.gemm.tile_m);
    if (gr.optional("tile_n", k.gemm.tile_n)) gr.check_positive("tile_n", k.gemm.tile_n);
    read_fraction(gr, "efficiency", k.gemm.efficiency);
    if (gr.find("fp8_efficiency") != nullptr)
      read_fraction(gr, "fp8_efficiency", k.gemm.fp8_efficiency);
    if (gr.find("fp8_block_efficiency") != nullptr)
      read_fraction(gr, "fp8_block_efficiency", k.gemm.fp8_block_efficiency);
    gr.finish();
  } else {
    r.missing("gemm");
  }
  if (const Json* a = r.find("attention"))
    k.attention = read_attention(*a, file, r.path_of("attention"), diag);
  read_fraction(r, "memory_efficiency", k.memory_efficiency);
  read_training_scale(r, k.training_scale);
  if (const Json* p = r.find("pytorch")) {
    ObjectReader pr(*p, file, r.path_of("pytorch"), diag);
    if (pr.valid()) {
      PytorchKernels stack;
      if (const Json* a = pr.find("attention"))
        stack.attention = read_attention(*a, file, pr.path_of("attention"), diag);
      read_training_scale(pr, stack.training_scale);
      pr.finish();
      k.pytorch = stack;
    }
  }
  r.finish();
  return k;
}

Json to_json(const DeviceKernels& k) {
  Json j{{"gemm",
          {{"sms", k.gemm.sms},
           {"tile_m", k.gemm.tile_m},
           {"tile_n", k.gemm.tile_n},
           {"efficiency", k.gemm.efficiency}}},
         {"attention", to_json(k.attention)},
         {"memory_efficiency", k.memory_efficiency},
         {"training_scale", k.training_scale}};
  if (k.gemm.fp8_efficiency > 0) j["gemm"]["fp8_efficiency"] = k.gemm.fp8_efficiency;
  if (k.gemm.fp8_block_efficiency > 0)
    j["gemm"]["fp8_block_efficiency"] = k.gemm.fp8_block_efficiency;
  if (k.pytorch) {
    Json p{{"training_scale", k.pytorch->training_scale}};
    if (k.pytorch->attention) p["attention"] = to_json(*k.pytorch->attention);
    j["pytorch"] = p;
  }
  return j;
}

}  // namespace tessera

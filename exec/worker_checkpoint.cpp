// The Worker's checkpoints: its parameters and optimizer state, and what it holds in bytes.
#include "exec/runtime.hpp"

#include "shared/base/check.hpp"

namespace tessera::exec {

int64_t Worker::parameter_bytes() const {
  // fp32 weights, gradients of the trainable ones, and AdamW's two moments for what this
  // rank's optimizer holds (its slice, with the sharded optimizer).
  int64_t bytes = optimizers_->state_bytes();
  for (const auto& [key, st] : stages_)
    for (const Param& p : st->params())
      bytes += p.tensor.numel() * 4 * (p.tensor.requires_grad() ? 2 : 1);
  return bytes;
}

void Worker::save(const std::string& path) {
  torch::serialize::OutputArchive archive;
  for (auto& [key, st] : stages_)
    for (const Param& p : st->params()) archive.write("param/" + p.name, p.tensor.detach());
  optimizers_->save(archive);
  archive.save_to(path);
}

void Worker::load(const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  torch::NoGradGuard no_grad;
  for (auto& [key, st] : stages_)
    for (Param& p : st->params()) {
      torch::Tensor t;
      archive.read("param/" + p.name, t);
      TESSERA_CHECK(t.sizes() == p.tensor.sizes(), path + ": " + p.name + " has another shape");
      p.tensor.copy_(t);
    }
  optimizers_->load(archive, path);
}

}  // namespace tessera::exec

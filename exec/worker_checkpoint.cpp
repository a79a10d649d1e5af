// The Worker's checkpoints: its parameters and optimizer state, and what it holds in bytes.
#include "exec/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "exec/worker_internal.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

int64_t Worker::parameter_bytes() const {
  // fp32 weights, gradients of the trainable ones, and AdamW's two moments for what this
  // rank's optimizer holds (its slice, with the sharded optimizer).
  int64_t bytes = 0;
  for (const auto& [key, st] : stages_)
    for (const Param& p : const_cast<Stage&>(*st).params())
      bytes += p.tensor.numel() * 4 * (p.tensor.requires_grad() ? 2 : 1);
  for (const auto& [m, opt] : optimizers_)
    for (const auto& group : opt->param_groups())
      for (const torch::Tensor& t : group.params()) bytes += t.numel() * 4 * 2;
  for (const auto& [m, sh] : shards_) bytes += sh->master().numel() * 4 * 2;
  return bytes;
}

namespace {

// A distributed optimizer's name in a checkpoint: its module's index, ".experts" for the
// module's routed experts.
std::string shard_name(const std::pair<int, bool>& key) {
  return std::to_string(key.first) + (key.second ? ".experts" : "");
}

}  // namespace

void Worker::save(const std::string& path) {
  torch::serialize::OutputArchive archive;
  for (auto& [key, st] : stages_)
    for (const Param& p : st->params()) archive.write("param/" + p.name, p.tensor.detach());
  for (auto& [m, opt] : optimizers_) {
    torch::serialize::OutputArchive sub;
    opt->save(sub);
    archive.write("optimizer/" + std::to_string(m), sub);
  }
  // The distributed optimizer's slices hold the latest parameters (with overlap_param_gather
  // the parameters above are gathered from them only as the next step begins).
  for (auto& [key, sh] : shards_) {
    torch::serialize::OutputArchive sub;
    sh->adam().save(sub);
    archive.write("optimizer/" + shard_name(key), sub);
    archive.write("shard/" + shard_name(key), sh->master().detach());
  }
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
  for (auto& [m, opt] : optimizers_) {
    torch::serialize::InputArchive sub;
    archive.read("optimizer/" + std::to_string(m), sub);
    opt->load(sub);
  }
  for (auto& [key, sh] : shards_) {
    torch::serialize::InputArchive sub;
    archive.read("optimizer/" + shard_name(key), sub);
    sh->adam().load(sub);
    torch::Tensor master;
    archive.read("shard/" + shard_name(key), master);
    TESSERA_CHECK(
        master.sizes() == sh->master().sizes(),
        path + ": the distributed optimizer's slice " + shard_name(key) + " has another shape");
    sh->master().detach().copy_(master);
  }
}

}  // namespace tessera::exec

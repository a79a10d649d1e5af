// Mixed precision's working copies. The parameters are fp32 master copies; a bf16 model's layers
// use each one in bf16. Cast at every use, a parameter costs one cast kernel per use and micro-
// batch in the forward, and its gradient two in the backward (the cast back to fp32, then the add
// into the master's gradient). With a WorkingCopies in scope, a parameter is cast once and the copy
// reused until the parameter changes, and each use's gradient is added into the fp32 gradient by
// one mixed-dtype add. The arithmetic is the same: the same bf16 values are used, and the same
// bf16 gradients summed in fp32 in the same order.
#pragma once

#include <cstdint>
#include <map>
#include <utility>

#include "exec/torch_api.hpp"

namespace tessera::exec {

// `param` as the layers use it with activations of `dtype`: itself when the dtypes agree; else a
// copy in `dtype` whose gradient goes into param.grad() (in param's dtype). From the WorkingCopies
// in scope on this thread, if any; otherwise a fresh cast (autograd's own).
torch::Tensor working_copy(const torch::Tensor& param, c10::ScalarType dtype);

class WorkingCopies {
 public:
  // While a Scope lives, working_copy() on this thread takes its copies from `copies`.
  class Scope {
   public:
    explicit Scope(WorkingCopies& copies);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WorkingCopies* previous_;
  };

  // The optimizer's step: the copies of trainable parameters go. Their new values may be written
  // without an autograd version (a fully sharded unit's gather); the frozen ones' never change.
  void drop_trainable();
  // `param` in `dtype`, cast again when its autograd version moved since (an optimizer's step).
  torch::Tensor get(const torch::Tensor& param, c10::ScalarType dtype);
  std::size_t size() const { return entries_.size(); }
  int64_t casts() const { return casts_; }  // copies made so far

 private:
  struct Entry {
    torch::Tensor param, copy;
    int64_t version = -1;
  };
  std::map<std::pair<const void*, int>, Entry> entries_;  // by (parameter, dtype)
  int64_t casts_ = 0;
};

}  // namespace tessera::exec

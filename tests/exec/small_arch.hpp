// The small transformer the executor's layer tests build their blocks from.
#pragma once

#include "shared/spec/model_spec.hpp"

namespace tessera::exec::testing {

// One layer, 32 wide, 4 query heads over 2 key/value heads of 8, a dense MLP of 64.
inline TransformerArch small_gqa() {
  TransformerArch a;
  a.layers = 1;
  a.hidden = 32;
  a.heads = 4;
  a.kv_heads = 2;
  a.head_dim = 8;
  a.ffn = 64;
  return a;
}

}  // namespace tessera::exec::testing

// What the Worker's boundary transport (worker_boundary.cpp) keeps within a step: the encoders'
// outputs as the LLM takes them in (leaves whose gradients accumulate while the LLM's
// micro-batches run backward), and the parts they are assembled from. All of it lives for one
// step: start_step() forgets the last.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "exec/torch_api.hpp"

#include "shared/layout/microbatch.hpp"

namespace tessera::exec {

using RowMap = std::map<int32_t, std::pair<int64_t, int64_t>>;  // sample -> (first row, count)

// A producer's output rows at the boundary as the LLM takes them: gathered over the encoder
// replicas that share this rank's LLM replica (fan-in), this rank's own (same data-parallel
// degree), or assembled from the links of one micro-batch.
struct Boundary {
  torch::Tensor leaf;  // (rows, H): the LLM's micro-batches select from it; its grad accumulates
  RowMap rows;
  int64_t mine_first = 0, mine_rows = 0;  // this rank's own rows
  std::vector<int64_t> member_rows;       // rows of each group member (fan-in)
  // Media items (encoder_data_parallel media): the leaf's rows that are this rank's output's,
  // in its order (the gathered rows are put in sample order, so they do not lie together).
  torch::Tensor mine_index;
  // Media items received over links: each item's rows in the leaf, by (sample, item).
  std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> items;
};

class BoundaryState {
 public:
  // Linked: boundary messages go leader to leader (non-colocated, or into an LLM pipeline) and
  // the LLM takes one assembled input per producer and micro-batch; otherwise a colocated LLM
  // takes its micro-batches' rows from one whole-batch boundary per producer.
  void set_linked(bool linked) { linked_ = linked; }
  bool linked() const { return linked_; }

  void start_step() {
    whole.clear();
    assembled.clear();
    link_parts.clear();
    absorbed.clear();
    entrain_leaves.clear();
    media.clear();
  }

  // Colocated: each producer's whole-batch boundary.
  std::map<int, Boundary> whole;
  // Linked: each (producer, micro-batch)'s input, and the parts its links brought, by (producer,
  // micro-batch, link), until it is assembled.
  std::map<std::pair<int, int>, Boundary> assembled;
  std::map<std::tuple<int, int, int32_t>, torch::Tensor> link_parts;
  // Producers whose links to this same rank have had their gradients put in place.
  std::set<int> absorbed;
  // Entrain, colocated: each producer micro-batch's output as a leaf the LLM's micro-batches (its
  // own and the next) take rows from; its gradient accumulates there. By (producer, micro-batch).
  std::map<std::pair<int, int>, torch::Tensor> entrain_leaves;
  // encoder_data_parallel media: this step's items of each module (Worker::media_for).
  std::map<int, MediaAssignment> media;

 private:
  bool linked_ = false;
};

}  // namespace tessera::exec

// The worker's runtime: it lowers the same Program as the simulator for each iteration and
// interprets its own rank's ops in order — compute (F, B, W) on its stages, sends and receives of
// activations and gradients, gradient reductions, optimizer steps. The torch code schedules
// nothing of its own; what runs, and when, is the Program's. The Worker owns the interpreter's
// state (stages, micro-batches, activations, boundary rows); four objects own the rest: the
// ModulePlaces (this rank in each module's grid), the Optimizers (gradients, their reductions and
// norm, the steps), Messages (point-to-point transport in each receiver's order) and the
// DipPrefetcher (schedule dip's batches and their searches).
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/boundary_state.hpp"
#include "exec/comm.hpp"
#include "exec/cuda.hpp"
#include "exec/data.hpp"
#include "exec/dip_prefetch.hpp"
#include "exec/messages.hpp"
#include "exec/module_places.hpp"
#include "exec/optimizers.hpp"
#include "exec/stage.hpp"
#include "exec/working_copies.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/layout/rank_groups.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/program/program.hpp"
#include "shared/search/dip_search.hpp"

namespace tessera::exec {

struct TrainOptions {
  DatasetKind dataset = DatasetKind::kSynthetic;
  uint64_t seed = 1234;  // weights
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double weight_decay = 0.0;
  double clip = 1.0;  // global gradient-norm clipping; 0 turns it off
  // Mixed precision's bf16 weights through working copies (working_copies.hpp); off, each use
  // casts its weight afresh (the yardstick the copies are measured against).
  bool working_copies = true;
};

struct StepResult {
  double loss = 0;       // mean cross-entropy over the batch's predicted tokens (every rank)
  double grad_norm = 0;  // global, before clipping (every rank)
  double step_s = 0;     // this rank: first op start to last op finish
  double started_s = 0;  // when the first op started (steady clock, shared by the host's ranks)
  double prepare_s = 0;  // drawing the batch and lowering the Program, before the first op
  int64_t llm_tokens = 0;
  Program program;                  // the iteration's Program (all ranks)
  std::vector<OpTime> times;        // this rank's ops, seconds from the step's start
  std::vector<NestedSlice> nested;  // collectives inside this rank's compute ops, same clock
  std::vector<Sample> samples;      // what the iteration trained on
  std::optional<DipStepInfo> dip;
};

class Worker {
 public:
  // REQUIRES: scenario validated; plan validated against it; executor_support(model) empty.
  Worker(const Scenario& scenario, const ParallelPlan& plan, Groups& groups,
         const TrainOptions& options);
  StepResult step(int64_t iteration);

  // This rank's parameters and optimizer state.
  void save(const std::string& path);
  void load(const std::string& path);
  // Parameter bytes held by this rank (weights, gradients, optimizer state).
  int64_t parameter_bytes() const;
  // Messages this rank held back so that their receiver takes them in the order sent (SendOrder).
  int64_t reordered_messages() const { return messages_.reordered(); }

 private:
  using Key = std::tuple<int, int, int, int>;  // (module, chunk, micro-batch, sub-micro-batch)
  struct Slot {
    std::vector<torch::Tensor> inputs;       // leaves fed in (B computes the gradients of those
                                             // that require one)
    torch::Tensor output;                    // the activation handed on, or the loss sum
    std::vector<torch::Tensor> input_grads;  // after B, one per input
    torch::Tensor output_grad;               // received, or the consumer's input gradient
    // A backward in gradient-bucket pieces: the forward's cuts, and the gradient at each cut
    // once the piece above it has run.
    Cuts cuts;
    std::map<int64_t, std::vector<torch::Tensor>> cut_grads;
  };
  struct MicroBatch {
    std::vector<int32_t> samples;
    LlmLayout layout;
    std::vector<int64_t> local;  // this CP rank's tokens
    AttentionInputs attention;
  };

  Stage& stage(int module, int chunk) { return find_stage(stages_, module, chunk, rank_); }
  // Builds the stage of (module, chunk) holding `layers`, from the run's seed.
  void hold_stage(int module, int chunk, const ChunkLayers* layers);
  std::vector<int32_t> samples_for(int module, int mb) const;
  // encoder_data_parallel media: the items every replica of `module` encodes (assign_media), or
  // null where the module takes whole samples; the rows an item hands on.
  const MediaAssignment* media_for(int module);
  int64_t item_rows(int producer, const MediaPiece& piece) const;
  // Fan-in of media items: the group's gathered rows put in this LLM replica's sample order.
  void gather_media(const Op& op, const Comm& comm, const MediaAssignment& items);
  Boundary& boundary(int producer);
  void boundary_collective(const Op& op);
  // Non-colocated boundary (per producer module and micro-batch): the samples each link of a
  // leader-to-leader message carries, rows of a module's output per sample, the assembled input.
  int consumer_of(int producer) const;
  std::vector<int32_t> consumer_links(int producer, int mb) const;
  // Entrain: the rows of LLM micro-batch `mb`'s samples from producer `producer`'s micro-batch
  // outputs (this one and the one before), with the leaves they come from added to `leaves`.
  torch::Tensor entrain_rows(int producer, int mb, std::vector<torch::Tensor>& leaves);
  // Lays `samples`' rows of `producer`'s output out from `row` on (each sample's rows together,
  // samples in order) into `where`; returns the row after them.
  int64_t lay_out_rows(int producer, const std::vector<int32_t>& samples, int64_t row,
                       RowMap& where) const;
  std::vector<int64_t> rows_of(int producer, const std::vector<int32_t>& samples,
                               const std::vector<int32_t>& order) const;
  // A link's rows (whole samples, or media items) in this rank's output of `producer` for
  // micro-batch `mb`, in the link's order; how many rows it carries; where they lie in an
  // assembled input.
  std::vector<int64_t> link_output_rows(int producer, int mb, const BoundaryLink& link);
  int64_t link_rows(int producer, const BoundaryLink& link) const;
  static std::vector<int64_t> leaf_rows(const Boundary& b, const BoundaryLink& link);
  Boundary& assembled(int producer, int mb);
  int64_t producer_leader(int producer, int64_t replica) const;
  // The width of the rows a boundary carries from `producer`: a projector's output, or an
  // encoder's hidden state (into a projector on ranks of its own).
  int64_t boundary_width(int producer) const;
  Slot& producer_slot(int producer, int mb);
  void absorb_self_links(int producer);
  void boundary_p2p(const Op& op);
  // schedule dip: the encoder outputs of each sub-micro-batch between the encoder's last stage
  // and the LLM's first (forward), and their gradients back.
  void dip_boundary(const Op& op);
  // An encoder's sub-micro-batch of an LLM micro-batch under DIP: pieces [first, first + count)
  // of micro_batch_pieces(), and the rows they become for the LLM.
  struct DipPiece {
    int64_t first = 0, count = 0, llm_rows = 0;
  };
  const std::vector<DipPiece>& dip_pieces(int encoder, int mb);
  // The audio windows an op of an audio encoder runs: its micro-batch's, under DIP its
  // sub-micro-batch's.
  std::vector<torch::Tensor> audio_windows(const Op& op);
  const MicroBatch& micro_batch(int mb);
  // Stage messages: a received activation (forward) or its gradient (backward) into place.
  void deliver(const Key& key, Phase phase, torch::Tensor t);
  // Scatter-gather (kOpTpScattered): this rank's 1/tp slice of `whole` over the message's TP
  // group; a compute op's nested pipeline all-gather reassembles the slice it consumes.
  torch::Tensor tp_slice(const Op& op, const torch::Tensor& whole) const;
  void gather_slices(const Op& op);
  void compute(const Op& op);
  void forward(const Op& op);
  void backward(const Op& op, bool weights);
  void recompute(const Op& op);  // R: the layers of a checkpointed forward again
  // The gradient the backward of `op`'s stage starts from (its output's).
  torch::Tensor output_gradient(const Op& op, Slot& slot);
  // A collective of the Program's for the gradients and parameters: reductions, the distributed
  // optimizer's gathers (a bucket's in the background, in gathers_), the norm.
  void gradient_collective(const Op& op);
  void gather_parameters(const Op& op);

  const Scenario& scenario_;
  const ParallelPlan& plan_;
  Groups& groups_;
  TrainOptions options_;
  int rank_;
  std::unique_ptr<ModulePlaces> places_;  // this rank in each module's grid
  Stages stages_;
  std::unique_ptr<Optimizers> optimizers_;  // over stages_'s parameters
  WorkingCopies working_copies_;            // the parameters in bf16 under mixed precision

  // Per iteration.
  TrainBatch batch_;
  std::vector<std::vector<int32_t>> my_micro_batches_;
  MicrobatchAssignment assignment_;
  // The encoders' micro-batches: assignment_'s, or Entrain's level 1 (the LLM runs level 2).
  MicrobatchAssignment encoder_assignment_;
  bool entrain_ = false;
  BoundaryState boundary_;  // the boundary transport's, per step
  std::map<int, MicroBatch> micro_batches_;
  std::map<Key, Slot> slots_;
  std::map<Key, torch::Tensor> received_;
  // Received slices awaiting their all-gather: (key, phase) -> (slice, whole-shaped buffer).
  std::map<std::pair<Key, Phase>, std::pair<torch::Tensor, torch::Tensor>> slices_;
  std::set<Key> has_w_;       // (module, chunk, mb) with a W op of its own on this rank
  std::set<Key> sends_grad_;  // ... whose input gradient this rank sends back
  std::vector<char> fused_;   // per op: a B and the W right after it, run as one backward
  std::map<Key, std::vector<int64_t>> cuts_;  // forwards cut for a backward in bucket pieces
  std::set<Key> recomputed_;  // forwards whose layers an R op runs again (full recomputation)
  // overlap_param_gather: parameter buckets being gathered, by the index of their op; an op that
  // depends on one waits for it. The first forward of a chunk runs in pieces: the bottom piece's
  // op runs them all, each waiting for its gather as the layers reach it (key -> the other
  // pieces' first layer -> op), and each piece's op is timed from those crossings.
  std::map<int32_t, std::vector<PendingCollective>> gathers_;
  std::map<Key, std::map<int64_t, int32_t>> forward_pieces_;
  std::map<int32_t, std::pair<double, double>> piece_times_;
  // Fully sharded: a piece's gather that comes after the bottom piece in the Program (the next
  // unit's prefetch waits for the unit before) is posted when the layers reach the piece, and
  // skipped where the loop meets it.
  std::set<int32_t> gathered_early_;
  void gather_ahead(const Op& piece);
  int32_t current_op_ = -1;
  std::unique_ptr<CudaOpClock> cuda_clock_;  // on a GPU: op times from CUDA events
  std::chrono::steady_clock::time_point started_;
  double elapsed() const;
  void await_gathers(const Op& op);
  Messages messages_;
  // schedule dip
  bool dip_ = false;
  std::map<std::pair<int, int>, std::vector<DipPiece>> dip_pieces_;
  std::map<Key, torch::Tensor> dip_received_;    // LLM first stage: each piece's encoder output
  std::unique_ptr<DipPrefetcher> dip_prefetch_;  // each step's schedule, searched ahead
  const Program* program_ = nullptr;
  torch::Tensor loss_sum_;  // this rank's share of the loss, summed on the device (fp64)
};

}  // namespace tessera::exec

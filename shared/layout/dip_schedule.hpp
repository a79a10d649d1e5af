// DIP (docs/ALGORITHMS.md §5): modality-aware pipeline segments on the ranks of a
// homogeneous pipeline. Each encoder runs as a segment of its own — its layers cut over the same
// P ranks as the LLM, its projector with its last stage — and the LLM as a segment of P·V
// virtual stages. A micro-batch's media are cut into sub-micro-batches whose time in the encoder
// segment is about one micro-batch's time in the LLM segment.
//
// This file holds what a per-batch schedule is and how it becomes each stage's order of steps
// (a pure function); lower() emits ops from those orders and dip_search.hpp finds a good
// schedule for each batch.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "shared/base/diagnostics.hpp"
#include "shared/base/json_reader.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

struct DipSchedule {
  // Encoder modules (ModelSpec indices) in the order their ready forwards are preferred; empty:
  // topological order.
  std::vector<int32_t> segment_order;
  bool encoders_first = true;  // a ready encoder forward before a ready LLM forward
  // An encoder forward of micro-batch mb starts only once the LLM's first virtual stage has
  // begun micro-batch mb - lookahead (bounds the encoder outputs waiting for the LLM); >= 1.
  int32_t lookahead = 1;
  // LLM micro-batches a stage holds at once (forward begun, backward not finished); 0: P.
  int32_t in_flight = 0;
  // Layers per virtual stage of a module (ModelSpec index): encoders P entries, the LLM P·V.
  // Absent: the plan's (LLM) or as even as possible, earlier stages taking the remainder.
  std::map<int32_t, std::vector<int64_t>> layers;
  bool operator==(const DipSchedule&) const = default;
  bool operator<(const DipSchedule& o) const {
    return std::tie(segment_order, encoders_first, lookahead, in_flight, layers) <
           std::tie(o.segment_order, o.encoders_first, o.lookahead, o.in_flight, o.layers);
  }
};

// {"segment_order": [names], "encoders_first", "lookahead", "in_flight", "layers": {name: [...]}}
Json dip_schedule_to_json(const DipSchedule& schedule, const ModelSpec& model);
// The inverse, for a run.json read back: module names resolved against `model`, problems
// recorded in `diag` under file and path. Layer counts are checked by lower() against the plan.
std::optional<DipSchedule> read_dip_schedule(const Json& json, const ModelSpec& model,
                                             const std::string& file, const std::string& path,
                                             Diagnostics& diag);
// Why `schedule` does not fit a homogeneous plan of `pp` stages and `vpp` LLM chunks ("" when
// it does): segment_order names encoders; layers are given for encoders (pp counts) and the LLM
// (pp·vpp counts), each >= 1, summing to the module's layers.
std::string dip_schedule_problem(const DipSchedule& schedule, const ModelSpec& model, int64_t pp,
                                 int64_t vpp);
// One line: "vision_tower first, lookahead 1, in-flight 4, layers vision_tower 6/6/6/6 ..."
std::string describe_dip_schedule(const DipSchedule& schedule, const ModelSpec& model);

// A step of one stage: a forward or backward of an LLM chunk for a micro-batch, or of an
// encoder segment's stage for a sub-micro-batch.
struct DipStep {
  int32_t segment = -1;  // index into DipPipeline::segments; -1: the LLM
  int32_t chunk = 0;     // LLM chunk (virtual stage chunk·P + stage); 0 for encoders
  int32_t microbatch = 0;
  int32_t sub = 0;
  bool backward = false;
  bool operator==(const DipStep&) const = default;
};

// One data-parallel replica's pipeline as the order builder sees it.
struct DipPipeline {
  int32_t stages = 1;      // P
  int32_t llm_chunks = 1;  // V
  int32_t microbatches = 1;
  bool llm_backward = true;
  struct Segment {
    std::vector<int32_t> subs;  // sub-micro-batches of each micro-batch (0: no media for it)
    int32_t backward_from = 0;  // first stage with a backward (P: none; P - 1: projector only)
  };
  std::vector<Segment> segments;  // in the schedule's segment order
  // Estimated duration of a step on `stage` (any consistent unit).
  std::function<double(const DipStep&, int32_t stage)> seconds;
  // Bytes of an encoder forward step's output that wait on the LLM's first stage from the end
  // of the encoder's last stage until the LLM's chunk-0 backward (its forward when no gradient
  // flows back); null: none.
  std::function<double(const DipStep&)> output_bytes;
  bool llm_input_grad = true;
};

struct DipOrders {
  std::vector<std::vector<DipStep>> stages;  // per stage, the order its ranks run steps in
  double peak_waiting_bytes = 0;  // most encoder output held on the LLM's first stage at once
};

// Per stage, the order its ranks run their steps in: a list-scheduling run of the pipeline with
// the estimated durations, each idle stage taking the ready step the schedule prefers (backwards
// first, then encoder or LLM forwards as `encoders_first` says, within the in-flight and
// look-ahead bounds). Orders read off an execution are deadlock-free whatever the real
// durations: every step starts after everything it waits for, on its own stage and elsewhere.
DipOrders dip_orders(const DipPipeline& pipeline, const DipSchedule& schedule);

// Sub-micro-batches for one micro-batch's media: a piece's time per encoder stage
// (encoder_forward / (P·k)) about one micro-batch's time per LLM virtual stage
// (llm_forward / (P·V)), so k = round(encoder_forward · V / llm_forward), at least 1 and at most
// `items` (0 without media).
int32_t dip_sub_microbatches(double encoder_forward, double llm_forward, int32_t llm_chunks,
                             int32_t items);
// The media of `samples` that `encoder` takes (its modality's images, videos or audio clips; an
// image encoder also takes video when no video encoder exists), in order, each as a sample of
// its own without text, with the index in `samples` of the sample it came from.
std::vector<std::pair<std::size_t, Sample>> dip_media_items(const ModelSpec& model,
                                                            const ModuleSpec& encoder,
                                                            std::span<const Sample* const> samples);
// DIP's sub-micro-batches of one LLM micro-batch's media for `encoder`: the index of each
// piece's first item among `items` (dip_media_items() of `samples`; empty without media),
// pieces sized by dip_sub_microbatches() from forward FLOPs and cut by split_contiguous(); at
// most 63.
std::vector<std::size_t> dip_piece_starts(const ModelSpec& model, const ModuleSpec& encoder,
                                          std::span<const Sample* const> samples,
                                          const std::vector<std::pair<std::size_t, Sample>>& items,
                                          int64_t llm_chunks, int64_t max_seq_len);

// Cuts items (in order) into k contiguous pieces of about equal weight; returns each piece's
// first item index, k entries. REQUIRES: 1 <= k <= weights.size().
std::vector<std::size_t> split_contiguous(const std::vector<double>& weights, int32_t k);

}  // namespace tessera

// Program: the lowered form of one training iteration, one ordered op list per rank — the
// contract between the simulator and the executor (docs/ALGORITHMS.md). lower() builds it,
// check_program() verifies it, evaluate() and the SimGrid simulator execute it, the executor
// interprets it with real tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/base/json_reader.hpp"

namespace tessera {

enum class OpKind : uint8_t { kCompute, kSend, kRecv, kCollective, kOptimizerStep };
// F forward, B backward for inputs, W backward for weights, R recompute of the forward.
enum class Phase : uint8_t { kF, kB, kW, kR };
// Streams overlap as on a GPU; ops on one stream run in order. Receives are pre-posted (like
// NCCL/Megatron's irecv) and occupy no stream: they complete when their message arrives.
enum class StreamKind : uint8_t { kCompute, kCollective, kP2p };
enum class CollectiveKind : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast
};
// kNorm: the all-reduce of the global gradient norm (and the loss) every rank joins before any
// optimizer step, as global gradient clipping needs.
// kAmax: FP8 delayed scaling's reduction of the current amaxes over a stage's ranks.
enum class Purpose : uint8_t { kTp, kCp, kDp, kEp, kBoundary, kPp, kNorm, kAmax };

// A collective run `count` times inside a Compute op's layers (TP all-reduces, CP K/V exchange,
// EP all-to-all): on the critical path of the op.
// Whose kernels move a collective: NCCL's, or DeepEP's or HybridEP's for an expert dispatch or
// combine (plan.moe_dispatcher deepep, hybridep), which across nodes move at their own rates
// (NetworkSpec::deepep_efficiency, hybridep_efficiency), not NCCL's all-to-all's
// (all_to_all_efficiency).
enum class Transport : uint8_t { kNccl, kDeepEp, kHybridEp };

struct NestedCollective {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  Purpose purpose = Purpose::kTp;
  int32_t group = -1;  // Program::groups index
  int32_t count = 0;
  double bytes = 0;  // per call, per rank (NCCL-tests "size")
  Transport transport = Transport::kNccl;
};

// What a Compute op's layers include besides the layer stack, and how its kernels run (the
// kernel-level cost model reads them); for a send or receive, how its message travels (Op::flags).
enum OpFlag : uint32_t {
  kOpFrontEnd = 1,             // the embedding, or an encoder's patch / audio front end
  kOpHead = 2,                 // the LM head and its loss
  kOpUnfusedAttention = 4,     // attention without a fused (flash) kernel: scores through memory
  kOpSequenceParallel = 8,     // norms and dropout run on 1/tp of the tokens (sequence parallelism)
  kOpAttentionRecompute = 16,  // B: selective recomputation re-runs the attention core first
  kOpEagerElementwise = 32,    // norms, rotary and activation as chains of eager kernels
  kOpTpCommOverlap = 64,       // its nested TP collectives overlap its GEMMs (tp_comm_overlap)
  kOpTpGradOverlap = 128,   // B: its layers' input-gradient TP collectives run beside the weight-
                            // gradient GEMMs of the W op that follows (tp_backward_overlap)
  kOpTpScattered = 256,     // send/recv: this TP rank's 1/tp slice of a stage's activation (or its
                            // gradient); Op::group is the TP group whose all-gather reassembles it
  kOpGradientBucket = 512,  // F, B, W, or a data-parallel reduction or parameter all-gather of
                            // one gradient bucket: only the layers [first_layer, first_layer +
                            // layers) of its chunk, with the chunk's input side (first piece) or
                            // head (last) where it holds them (overlap_grad_reduce; F pieces and
                            // gathers: overlap_param_gather)
  kOpRoutedExperts = 1024,  // a data-parallel reduction, parameter all-gather or optimizer step
                            // of the routed experts alone, over their expert-data-parallel group
                            // (EP > 1: experts are replicated over fewer ranks than the rest of
                            // the module); without it, such an op carries everything else
  kOpKvReplicas = 2048,     // a TP all-reduce of the gradients of key/value heads replicated
                            // over TP ranks (fewer heads than TP), over the ranks sharing each
                            // key/value head
  kOpFullySharded = 4096,   // fully_sharded: a unit's parameter all-gather before its forward
                            // (phase F) or backward (B), or its gradients' reduce-scatter, in
                            // every micro-batch
  kOpFp8 = 8192,            // its transformer layers' linear GEMMs run in FP8 (plan.fp8), their
                            // inputs quantized first
  kOpFp8CurrentScaling = 16384,  // with kOpFp8: scales from the tensor itself (a second read)
  kOpEpCommOverlap = 32768,      // its nested EP all-to-alls run beside other micro-batches'
                                 // compute (plan.moe_a2a_overlap)
  kOpPytorchKernels = 65536,     // its kernels run at a PyTorch-native stack's rates
                                 // (plan.framework pytorch)
  kOpPerOpRecompute = 131072,    // R: per-op selective checkpointing's recomputation, every
                                 // second matmul of its layers and their element-wise kernels
                                 // (attention kept; plan.recompute per_op)
  // B: selective recomputation's submodules (plan.recompute_modules) run again before the
  // backward: the norms, the latent up-projections and rotary, the routed experts' activation,
  // a dense layer's MLP, an MoE layer whole (its all-to-alls too), its shared expert.
  kOpLayernormRecompute = 262144,
  kOpMlaUpProjRecompute = 524288,
  kOpMoeActRecompute = 1048576,
  kOpMlpRecompute = 2097152,
  kOpMoeRecompute = 4194304,
  kOpSharedExpertRecompute = 8388608,
  kOpDeepEpDispatch = 16777216,     // its MoE layers dispatch through DeepEP (plan.moe_dispatcher),
                                    // which hands each rank its tokens without a sort by expert
  kOpExpertsWhole = 33554432,       // its routed experts whole on each TP rank (expert TP 1), each
                                    // rank's experts taking its own 1/tp of the tokens
  kOpFp8BlockScaling = 67108864,    // with kOpFp8: a scale per block (plan.fp8 blockwise), its
                                    // GEMMs at the device's block-scaled FP8 rate
  kOpHybridEpDispatch = 134217728,  // its MoE layers dispatch through HybridEP (with
                                    // kOpDeepEpDispatch: its tokens travel as DeepEP's)
  kOpUnfusedPermute = 268435456,    // its MoE layers permute tokens with PyTorch's kernels
                                    // (plan.moe_permute_fusion false)
  kOpSequencePartial = 536870912,   // a TP all-reduce of the gradients of weights every TP rank
                                    // holds whole but applies to its 1/tp of the tokens under
                                    // sequence parallelism (norms, row-parallel biases, routers)
};

struct Op {
  OpKind kind = OpKind::kCompute;
  StreamKind stream = StreamKind::kCompute;
  Phase phase = Phase::kF;
  CollectiveKind collective = CollectiveKind::kAllReduce;  // kCollective
  Purpose purpose = Purpose::kPp;                          // kCollective, kSend, kRecv
  int16_t module = -1;                                     // Program::modules index; -1 for none
  int16_t stage = 0;                                       // pipeline stage of the module
  int16_t chunk = 0;                                       // virtual pipeline chunk
  int32_t microbatch = -1;                                 // -1: the whole local batch
  int32_t sub_microbatch = 0;
  int16_t tp = 1;           // compute: tensor-parallel shards of its matrices
  int16_t ep = 1;           // compute: expert-parallel ranks its routed experts are dealt over
  uint32_t flags = 0;       // OpFlag bits
  int32_t layers = 0;       // compute: transformer layers in this op
  int32_t first_layer = 0;  // compute: the first of them in its module ([first, first + layers))
  int64_t tokens = 0;       // compute: tokens processed on this rank
  double flops = 0;         // compute: model FLOPs on this rank (recompute: the repeated forward)
  // compute: FLOPs the busiest rank of its expert-parallel group runs beyond its even share of
  // the routed tokens (a skewed router), which this rank waits for at the combining all-to-all;
  // priced as time, never counted as model or hardware FLOPs (negative when dropped tokens leave
  // the busiest rank less than its even share).
  double expert_wait_flops = 0;
  // compute: of `flops`, the work on zero heads that pad its module to its TP (indivisible_heads
  // pad): hardware FLOPs, priced, but not the model's.
  double padded_flops = 0;
  double logits = 0;  // compute: vocabulary logits it computes (tokens × vocab / tp; LM head)
  double attention_pairs = 0;  // compute: query-key pairs its attention scores per layer and head
  // compute: the weight bytes it reads; optimizer step: the parameter state it updates.
  double memory_bytes = 0;
  // send/recv: the message; collective: per rank (NCCL-tests "size").
  double message_bytes = 0;
  double stash_bytes = 0;     // F: activation bytes kept for the backward
  double release_bytes = 0;   // last backward op of a (module, chunk, micro-batch): bytes it frees
  int32_t peer = -1;          // send/recv: the other rank
  int32_t group = -1;         // collective (and a kOpTpScattered send/recv): Program::groups index
  int64_t tag = 0;            // send/recv: matches a send to its receive between two ranks
  int32_t link = -1;          // boundary send/recv of a link: Program::links index (DIP's
                              // messages carry sub-micro-batches instead: -1)
  std::vector<int32_t> deps;  // earlier ops of this rank that must finish before this one starts
  std::vector<NestedCollective> nested;
};

using RankList = std::vector<int64_t>;

// The layers [first_layer, end_layer) a module's chunk holds on a pipeline stage: what the
// executor builds there. A gradient bucket's compute ops run a part of them.
struct ChunkLayers {
  int16_t module = -1;
  int16_t stage = 0;
  int16_t chunk = 0;
  int32_t first_layer = 0, end_layer = 0;
};

// One boundary link: the rows of micro-batch `microbatch` that replica `producer_replica` of a
// producer (its last module, a projector: Op::module of the link's messages) hands to replica
// `consumer_replica` of the module it feeds. With fan-in (more producer than consumer replicas)
// each producer replica's link carries its own samples; with fan-out each consumer replica's
// carries that replica's share. The consumer assembles its input from its links in order of
// producer replica. A link whose two ends are one rank has no message.
struct BoundaryLink {
  int16_t producer = -1, consumer = -1;
  int32_t microbatch = -1;
  int64_t producer_replica = 0, consumer_replica = 0;
  std::vector<int32_t> samples;  // indices into the batch's samples, in row order
  // Under encoder_data_parallel media, each entry of `samples` is one media item of that sample
  // (its index into media_items()), whose rows the link carries; empty: whole samples.
  std::vector<int32_t> items;
};

// What a rank holds in memory: parameter state from the plan, activations from the schedule.
struct RankMemory {
  double weight_bytes = 0;
  double gradient_bytes = 0;
  double optimizer_bytes = 0;
  double activation_bytes = 0;  // peak of activations kept for backward (evaluate() fills it)
  double boundary_bytes = 0;    // encoder outputs held at a module boundary (received, gathered)
  double total() const {
    return weight_bytes + gradient_bytes + optimizer_bytes + activation_bytes + boundary_bytes;
  }
};

struct Program {
  int64_t iteration = 0;
  int32_t world = 0;
  std::vector<std::string> modules;    // module names, indexed by Op::module
  std::vector<RankList> groups;        // collective groups, indexed by Op::group / NestedCollective
  std::vector<std::vector<Op>> ranks;  // ops per rank, in issue order
  std::vector<RankMemory> memory;      // parameter state per rank (activation_bytes left 0)
  // What the iteration computes, for metrics.
  int64_t samples = 0;
  int64_t llm_tokens = 0;  // tokens in the LLM sequences of the global batch
  double model_flops = 0;  // F+B+W FLOPs of the iteration, all ranks (recompute excluded)
  // The micro-batches as lowered: [LLM data-parallel replica][micro-batch] -> indices into the
  // batch's samples; the encoders' are Entrain's level 1 (else the same). The executor runs
  // exactly these.
  std::vector<std::vector<std::vector<int32_t>>> llm_microbatches, encoder_microbatches;
  // Every (module, stage, chunk) a compute op runs, sorted: the layers it holds.
  std::vector<ChunkLayers> chunk_layers;
  // The boundary links of heterogeneous plans, in the order the lowering met them.
  std::vector<BoundaryLink> links;
  // A folded Program (lower() with RankFolding::kIdentical): ranks that would run the same ops
  // at the same times — tensor-parallel shards, and data-parallel replicas whose micro-batches
  // have the same shapes — are a class whose representative (its lowest rank) alone has ops;
  // represented_by[r] names r's (r itself for a representative). A representative's peers are
  // representatives; a collective counts only the representatives among its group's members as
  // arriving, and costs its whole group. Empty: every rank has its own ops.
  std::vector<int32_t> represented_by;
  // A folded Program: for each group a representative's ops name (collectives, nested ones, TP
  // gathers), the group each rank of its class uses in its place, in rank order (the
  // representative's own first); empty where every rank of the class uses the group itself (the
  // gradient norm's). A represented rank's messages go to its representative's peers moved by
  // the difference of the two ranks.
  std::vector<std::vector<int32_t>> member_groups;
};

// The rank whose ops and times stand for `rank`'s: itself unless the Program is folded.
inline int32_t representative(const Program& program, int64_t rank) {
  return program.represented_by.empty() ? static_cast<int32_t>(rank)
                                        : program.represented_by[static_cast<std::size_t>(rank)];
}
// The members of `group` that run their own ops: all of them unless the Program is folded.
int64_t active_members(const Program& program, const RankList& group);
// Ops of all ranks, and ranks with ops of their own (all of them unless the Program is folded).
int64_t op_count(const Program& program);
int64_t lowered_ranks(const Program& program);

// The layers of (module, stage, chunk), or nullptr when no compute op runs it.
const ChunkLayers* find_chunk_layers(const Program& program, int module, int stage, int chunk);

// Readable, stable name: "llm.s1.mb3.F", "llm.s0.c1.mb3.B", "send:llm.s1.mb3.F>r17",
// "dp:allreduce:llm.s1", "optimizer:llm.s0"; a gradient bucket's ops name their layers:
// "llm.s0.mb7.B.L12-16", "dp:allreduce:llm.s0.L12-16".
std::string op_name(const Program& program, const Op& op);
// Op id: "it<iteration>.r<rank>.<index>".
std::string op_id(const Program& program, int32_t rank, int32_t index);

// Whether ops[i] is a W that directly follows its own B (same module, chunk and micro-batch):
// the executor runs such a pair as one backward pass, and calibration measures it as one.
bool fused_with_backward(const std::vector<Op>& ops, std::size_t i);

// Structural checks: dependencies point to earlier ops of the same rank; every send has exactly
// one receive with the same bytes and vice versa; every collective group's members enter the
// group's collectives in the same order with the same kind and size (no deadlock); nested
// collectives name valid groups; each compute op's layers lie within its chunk's (chunk_layers);
// a message that names a boundary link names one of its module's, the same at both ends. A
// folded Program: represented ranks have no ops, their representatives' peers are
// representatives, a group's collectives are entered by its representatives, and member_groups
// names groups. Returns one message per problem (empty = valid).
std::vector<std::string> check_program(const Program& program);

// Machine-readable op list of one rank (or all when rank < 0).
Json program_to_json(const Program& program, int32_t rank);
std::string phase_name(Phase phase);
extern const EnumTable<Phase> kPhases;
extern const EnumTable<CollectiveKind> kCollectiveKinds;  // "allreduce", ...
std::string collective_name(CollectiveKind kind);
std::string purpose_name(Purpose purpose);

}  // namespace tessera

// ParallelPlan: how a model is laid out on the ranks, per module, and how it is scheduled.
// Placements (docs/ALGORITHMS.md §3): homogeneous (one layout; encoders in the LLM's first
// pipeline stage with its TP/CP/DP), colocated (every module spans all ranks with its own
// grid), non_colocated (modules own disjoint rank spans that tile the world).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shared/model/model_math.hpp"
#include "shared/spec/cluster_spec.hpp"
#include "shared/spec/model_spec.hpp"
#include "shared/spec/workload_spec.hpp"

namespace tessera {

enum class Placement { kHomogeneous, kColocated, kNonColocated };
enum class Schedule { kGpipe, k1F1B, kInterleaved1F1B, kGraph1F1B, kThreePhase, kDip };
enum class MicrobatchPolicy { kArrival, kSorted, kEntrain };
enum class CpSplit { kUniform, kZigzag, kMakespan };
enum class StageSplit { kFrozenAware, kUniform };
// Activation recomputation: none; selective (Megatron-LM's: the attention core again before its
// backward); full (each checkpointed layer's forward again); per_op (torchtitan's per-op selective
// checkpointing: every second matrix multiplication of a layer and its element-wise kernels again,
// attention kept).
enum class Recompute { kNone, kSelective, kFull, kPerOp };
// What a module whose attention heads its TP does not divide runs as (InternViT-6B's 25 heads
// at TP 2, 4 or 8). kRefuse: the plan is invalid. kPad: zero heads pad it to a multiple of TP,
// each rank computing its share of them (Megatron-LM, as NVLM runs InternViT-6B at TP 8 with 7
// dummy heads): the padded work and weights are priced, the model's FLOPs count the real heads.
// kReplicate: a homogeneous plan's encoders and projectors run whole on every TP rank of the
// LLM's grid, as they run whole on every CP rank (the LLM itself must split).
enum class IndivisibleHeads { kRefuse, kPad, kReplicate };
// What an encoder's data parallelism deals out where it has more replicas than the LLM (a
// colocated fan-in). kSamples: each replica takes whole samples of the LLM replica it feeds, so a
// step needs at least as many samples as encoder replicas. kMedia: the samples' media items
// (images, video clips, audio recordings) are dealt to the replicas by their encoder work, so a
// few long samples with many images still spread over every replica (Megatron-LM's MIMO feeds
// its encoder grid with the step's images); the boundary puts each item's tokens back in its
// sample's place.
enum class EncoderDataParallel { kSamples, kMedia };
// How a mixture-of-experts layer's tokens travel to their experts' EP ranks. kAllToAll: one
// copy of a token's hidden vector for each of its top-k experts (Megatron-LM's all-to-all
// dispatcher). kDeepEp: one copy for each other node that holds any of its experts, forwarded
// to the experts' ranks inside that node over NVLink (DeepEP's internode kernels, Megatron-LM's
// flex dispatcher). kHybridEp: the flex dispatcher's HybridEP backend, moving tokens as DeepEP
// does but all-gathering every rank's routing map first to plan the transfer.
enum class MoeDispatcher { kAllToAll, kDeepEp, kHybridEp };
// FP8 training of the transformer layers' linear GEMMs, as Transformer Engine runs it (E4M3
// forward, E5M2 gradients): forward, input-gradient and weight-gradient GEMMs in FP8, their
// inputs quantized first; attention, norms, embeddings, the head and projectors in the model's
// dtype. kDelayed: per-tensor scales from an amax history (one read of a tensor to quantize it);
// kCurrent: per-tensor scales from the tensor itself (NeMo's H100 recipes; a second read);
// kBlockwise: a scale per block, from the block itself as it is cast (one read), 1x128 for
// activations and gradients, 128x128 for weights (DeepSeek-V3's fine-grained quantization;
// Megatron-LM's `--fp8-recipe blockwise`), its GEMMs slower than per-tensor ones.
enum class Fp8Recipe { kNone, kDelayed, kCurrent, kBlockwise };
// The training software that runs the plan, for the kernel rates it reaches. kMegatron:
// Megatron-LM or NeMo with Transformer Engine (cuDNN fused attention; the device's `attention`
// rates and `training_scale`). kPytorch: a PyTorch-native stack (torchtitan and FSDP2,
// Composer/llm-foundry, fms-fsdp, Hugging Face with DeepSpeed): attention through SDPA's
// FlashAttention-2 kernels and the stack's own share of the rates in a training step (the
// device file's `pytorch` block; docs/FIDELITY.md).
enum class Framework { kMegatron, kPytorch };

extern const EnumTable<Placement> kPlacements;
extern const EnumTable<Schedule> kSchedules;
extern const EnumTable<MicrobatchPolicy> kMicrobatching;
extern const EnumTable<Recompute> kRecomputes;
extern const EnumTable<RecomputeModule> kRecomputeModules;
extern const EnumTable<StageSplit> kStageSplits;
extern const EnumTable<CpSplit> kCpSplits;
extern const EnumTable<IndivisibleHeads> kIndivisibleHeads;
extern const EnumTable<EncoderDataParallel> kEncoderDataParallel;
extern const EnumTable<Fp8Recipe> kFp8Recipes;
extern const EnumTable<MoeDispatcher> kMoeDispatchers;
extern const EnumTable<Framework> kFrameworks;

// Consecutive ranks [first, first + count).
struct RankSpan {
  int64_t first = 0;
  int64_t count = 0;
  bool operator==(const RankSpan&) const = default;
};

// One module's parallel grid. Megatron order: rank = tp + TP·(cp + CP·(dp + DP·pp)).
struct ModuleLayout {
  int64_t tp = 1;  // tensor parallel
  int64_t cp = 1;  // context parallel
  int64_t pp = 1;  // pipeline stages
  int64_t dp = 1;  // data parallel replicas
  int64_t ep = 1;  // expert parallel, carved out of cp·dp (MoE layers only)
  // Expert tensor parallelism: the TP of the routed experts, tp (0, the default) or 1. At 1 each
  // rank holds whole experts and routes its own 1/tp of the tokens (sequence parallelism), and EP
  // is carved out of tp·cp·dp (Megatron-LM's expert_tensor_parallel_size).
  int64_t etp = 0;
  int64_t vpp = 1;                    // virtual pipeline chunks per stage (interleaved 1F1B)
  std::optional<RankSpan> ranks;      // non_colocated: Default: consecutive in plan order
  std::vector<int64_t> stage_layers;  // layers per (virtual) stage, pp·vpp entries. Default: even

  int64_t size() const { return tp * cp * pp * dp; }
  int64_t expert_tp() const { return etp > 0 ? etp : tp; }
  bool operator==(const ModuleLayout&) const = default;
};

struct ParallelPlan {
  Placement placement = Placement::kHomogeneous;
  ModuleLayout layout;  // homogeneous
  // colocated / non_colocated, in plan order. A projector or generator without an entry runs
  // with the module that feeds it (same ranks, that module's last stage).
  std::vector<std::pair<std::string, ModuleLayout>> modules;
  int64_t micro_batch_size = 1;   // samples per micro-batch
  int64_t num_micro_batches = 0;  // Default (0): global_batch / (micro_batch_size · LLM dp)
  Schedule schedule = Schedule::k1F1B;
  MicrobatchPolicy microbatching = MicrobatchPolicy::kArrival;
  CpSplit cp_split = CpSplit::kUniform;
  StageSplit stage_split = StageSplit::kFrozenAware;
  Recompute recompute = Recompute::kNone;
  // What selective recomputation runs again (RecomputeModule bits; Megatron-LM's
  // recompute_modules, whose default is the attention core alone).
  uint32_t recompute_modules = kRecomputeCoreAttn;
  // Full recomputation of only the first N transformer layers of each pipeline chunk (Megatron-
  // LM's block method, recompute_num_layers); the others keep their activations. 0: every layer.
  int64_t recompute_layers = 0;
  // Sequence parallelism of the LLM's layers (Megatron-LM's); with encoder_sequence_parallel,
  // of the encoders' layers too (Megatron-LM's multimodal models keep it off there).
  bool sequence_parallel = false;
  bool encoder_sequence_parallel = false;
  bool distributed_optimizer = false;
  // Attention through a fused (flash) kernel; false: unfused, the score matrix written to memory
  // and kept for the backward (Megatron before FlashAttention).
  bool flash_attention = true;
  // Norms, rotary embeddings and the MLP activation as fused kernels (Megatron, Transformer
  // Engine); false: PyTorch eager, as Hugging Face Transformers runs them (chains of element-wise
  // kernels, norms in fp32).
  bool fused_kernels = true;
  Framework framework = Framework::kMegatron;
  // Tensor-parallel all-gathers and reduce-scatters overlapped with the GEMMs they feed
  // (Transformer Engine's user buffers, Megatron/NeMo `tp_comm_overlap`); needs sequence
  // parallelism. Priced by the cost model; the executor runs them without overlap.
  bool tp_comm_overlap = false;
  // A layer's input-gradient TP collective (all-reduce; reduce-scatter with sequence parallelism)
  // runs while the layer computes its weight gradients, as Megatron-LM does by default
  // (`async_tensor_model_parallel_allreduce`). Priced by the kernel-level cost model; the executor
  // runs the collective before the weight gradients.
  bool tp_backward_overlap = true;
  // Without sequence parallelism every TP rank of a pipeline stage holds the whole activation;
  // each sends only its 1/tp slice to its peer of the next stage, over its own link, and the
  // receiving stage all-gathers the slices over its TP group (Megatron-LM's
  // `scatter_gather_tensors_in_pipeline`, on by default there too).
  bool pipeline_scatter_gather = true;
  // Each sample of an LLM micro-batch padded to the micro-batch's longest, as Hugging Face's
  // collator batches them (`padding="longest"`): the LLM's matrices, norms and head run on the
  // pads too; its attention does not (flash attention unpads). false: samples packed back to
  // back, each attending within itself (Megatron with variable-length attention).
  bool pad_to_longest = false;
  // Data-parallel gradient reduction overlapped with the backward, as PyTorch DDP and
  // Megatron-LM's `overlap_grad_reduce` run it: gradients accumulate locally over the
  // micro-batches, and during each pipeline chunk's last backward every bucket of about
  // `grad_bucket_mb` megabytes of gradients is reduced as soon as its layers are done
  // (reduce-scattered with the distributed optimizer). false: one reduction per module after
  // the rank's last backward.
  bool overlap_grad_reduce = false;
  double grad_bucket_mb = 80;  // Megatron-LM's 40M-parameter buckets in 16 bits; DDP uses 25
  // The distributed optimizer's parameter all-gather overlapped with the next forward, as
  // Megatron-LM's `overlap_param_gather` runs it (needs distributed_optimizer and
  // overlap_grad_reduce, whose buckets it gathers): the parameters a step updated are gathered
  // bucket by bucket while the next step's first forward of each chunk runs, each bucket's layers
  // waiting for their own gather. false: one all-gather per module after the optimizer step.
  bool overlap_param_gather = false;
  // Fully sharded data parallelism (ZeRO-3; PyTorch FSDP2, DeepSpeed stage 3): every module's
  // weights, gradients and optimizer state sharded over its dp·cp replicas. Each gradient bucket
  // (about `grad_bucket_mb`; a transformer layer of a large model) is the unit: its parameters
  // are all-gathered before its forward and again before its backward of every micro-batch, the
  // next unit's gather running while one computes (FSDP2's prefetch), and its gradients
  // reduce-scattered after each backward. Needs distributed_optimizer; homogeneous and
  // non_colocated pipelines.
  bool fully_sharded = false;
  // FP8 linear GEMMs (see Fp8Recipe). With fp8_param_gather the layers' weights are kept in FP8
  // only (no 16-bit copy beside the FP8 one) and the data-parallel parameter all-gathers carry
  // them in FP8 (Megatron-LM's --fp8-param-gather; needs distributed_optimizer).
  Fp8Recipe fp8 = Fp8Recipe::kNone;
  bool fp8_param_gather = false;
  MoeDispatcher moe_dispatcher = MoeDispatcher::kAllToAll;
  // A mixture-of-experts layer's dispatch and combine all-to-alls run while another micro-batch
  // computes (Megatron-LM's overlap_moe_expert_parallel_comm, pairing one micro-batch's forward
  // with another's backward; DeepSeek-V3's DualPipe): they hide behind the compute, as far as
  // it lasts.
  bool moe_a2a_overlap = false;
  // The all-to-alls that carry tokens to their experts (the forward's dispatch, the backward's
  // output gradients) in FP8, one byte a value and an fp32 scale per 128 (DeepSeek-V3's
  // low-precision communication); the combines stay 16-bit. Needs fp8.
  bool moe_fp8_dispatch = false;
  // Megatron-LM's fused token permutation (moe_permute_fusion, Transformer Engine's kernels);
  // without it the permutation runs as PyTorch's sort, gather and scatter kernels.
  bool moe_permute_fusion = true;
  // Data-parallel gradient reductions (and the sums of replicated key/value gradients before
  // them) in fp32, as Megatron-LM reduces a bf16 model's gradients by default
  // (`accumulate_allreduce_grads_in_fp32`, DDP's `grad_reduce_in_fp32`): twice the bytes of a
  // 16-bit reduction. false: in the model's dtype (Megatron-LM's `--grad-reduce-in-bf16`,
  // FSDP2's default). The distributed optimizer's parameter gathers stay in the model's dtype
  // either way, and the gradients a rank keeps are fp32 in both (the memory model's 4 bytes).
  bool grad_reduce_in_fp32 = false;
  // Modules whose heads their TP does not divide (see IndivisibleHeads). Default: refuse.
  IndivisibleHeads indivisible_heads = IndivisibleHeads::kRefuse;
  // How encoders with more replicas than the LLM share its samples (colocated plans only; see
  // EncoderDataParallel). Default: whole samples.
  EncoderDataParallel encoder_data_parallel = EncoderDataParallel::kSamples;

  bool operator==(const ParallelPlan&) const = default;
};

// The TP degree module `module` runs at under `plan` (homogeneous: the one layout's; else its
// own or its host's), before replication: see replicated_over_tp().
int64_t module_tp(const ParallelPlan& plan, const ModelSpec& model, const ModuleSpec& module);
// Whether `module` runs whole on every TP rank (indivisible_heads replicate, heads its TP does
// not divide).
bool replicated_over_tp(const ParallelPlan& plan, const ModelSpec& model, const ModuleSpec& module);
// Whether `module`'s layers run under plan.sequence_parallel: the LLM's, as Megatron-LM's
// multimodal models keep their vision encoder and projection without it; and the encoders'
// under plan.encoder_sequence_parallel.
bool sequence_parallel_for(const ParallelPlan& plan, const ModuleSpec& module);
// `model` as `plan` runs it: with indivisible_heads pad, every module whose heads its TP does
// not divide gets zero heads up to a multiple of TP (key/value heads too where they equal the
// heads); otherwise `model` itself.
ModelSpec heads_padded(const ModelSpec& model, const ParallelPlan& plan);

// Whether `plan` deals `module`'s work to its replicas by media item (encoder_data_parallel media,
// a colocated encoder or projector with more replicas than the LLM).
bool media_parallel(const ParallelPlan& plan, const ModelSpec& model, const ModuleSpec& module);

// Bytes per value of a plan's data-parallel gradient reductions for a model of `dtype`.
int64_t reduced_gradient_bytes(const ParallelPlan& plan, DType dtype);
// Bytes per trainable parameter of the gradients a rank keeps from the backward to the optimizer
// step. Megatron-LM accumulates them in the dtype it reduces them in (its gradient buffer: fp32
// with grad_reduce_in_fp32, else the model's); fully sharded plans and the PyTorch-native stacks
// keep fp32 gradients beside their fp32 parameters.
int64_t kept_gradient_bytes(const ParallelPlan& plan, DType dtype);

ParallelPlan read_plan(const Json& json, const std::string& file, const std::string& path,
                       Diagnostics& diag);
Json to_json(const ParallelPlan& plan);
Json to_json(const ModuleLayout& layout);

// A module with its resolved layout and rank span.
struct PlacedModule {
  const ModuleSpec* module = nullptr;
  ModuleLayout layout;
  int64_t first_rank = 0;
  std::string host;  // module whose ranks this one borrows ("" = its own layout)
};

// Resolves every module of `model` to a layout and span. Problems (unknown module, missing
// layout) go to `diag` under `path`. Homogeneous: all modules get plan.layout.
std::vector<PlacedModule> place_modules(const ParallelPlan& plan, const ModelSpec& model,
                                        const std::string& file, const std::string& path,
                                        Diagnostics& diag);
// Ranks the plan uses. REQUIRES: plan validated.
int64_t world_size(const ParallelPlan& plan, const ModelSpec& model);
// Whether the frozen-aware stage split still has to choose `layout`'s stage boundaries for
// `module` (a transformer in several pipeline chunks with none given): stage_split.hpp resolves
// them with the cost model, once, before anything lowers the plan.
bool stage_split_pending(const ParallelPlan& plan, const ModuleLayout& layout,
                         const ModuleSpec& module);
// No layout of the plan has its stage split pending.
bool stage_split_resolved(const ParallelPlan& plan, const ModelSpec& model);
// Layers of each of `chunks` (virtual) stages when the plan gives none: as even as possible,
// earlier stages taking the remainder.
std::vector<int64_t> even_stage_layers(int64_t layers, int64_t chunks);
// Whether every layout's stage boundaries are the even ones (given as such, or none given): a
// resolved frozen-aware plan that is the same plan as its uniform twin.
bool splits_evenly(const ParallelPlan& plan, const ModelSpec& model);
// Micro-batches per iteration (explicit or derived). REQUIRES: plan validated.
int64_t micro_batches(const ParallelPlan& plan, const ModelSpec& model,
                      const WorkloadSpec& workload);

// Every rule a plan must satisfy against its model, workload and cluster.
void validate_plan(const ParallelPlan& plan, const ModelSpec& model, const WorkloadSpec& workload,
                   const ClusterSpec& cluster, const std::string& file, const std::string& path,
                   Diagnostics& diag);

}  // namespace tessera

// The cost model: pure functions from an op to seconds and from a rank's state to bytes.
// Defaults are analytic and documented here; a calibration profile overrides any of
// the parameters.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shared/cost/kernel_cost.hpp"
#include "shared/program/program.hpp"
#include "shared/spec/cluster_spec.hpp"

namespace tessera {

// How large a module's matrices are, which sets how efficiently its kernels run: by the width of
// its layers (transformer hidden size, projector output). small < 1024 <= medium < 4096 <= large.
enum class SizeClass : uint8_t { kSmall, kMedium, kLarge };
SizeClass size_class(const ModuleSpec& module);
std::string size_class_name(SizeClass size);

// What a calibration fit reports about itself (docs/ALGORITHMS.md §9).
struct FitStats {
  int64_t samples = 0;          // medians the fit used (each over the warm iterations of one op)
  double residual = 0;          // RMS error of the fit on its samples over their mean
  double min_x = 0, max_x = 0;  // the measured range of FLOPs or bytes
  // How single instances vary around the fit: quantiles, at (k + 0.5) / K, of measured / fitted
  // seconds over every measured instance, scaled to mean 1 (so totals stay the fit's). A
  // simulation draws each op's factor from it: on a shared machine the waits that noise adds to
  // a synchronous program are part of its step time. Empty: no variation.
  std::vector<double> spread;
};

// Collective calls among a compute op's layers (Σ NestedCollective::count), each a stall between
// its kernels. A received activation's pipeline all-gather runs before the first kernel: its
// time is all its own, and it is not counted.
double nested_calls(const Op& op);

// A uniform number in [0, 1) that depends only on its arguments (an op instance's coordinates).
double spread_draw(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
// The factor of `spread` at the uniform draw `u` (1 when `spread` is empty).
double spread_factor(const std::vector<double>& spread, double u);

// A compute class fitted from traces: seconds = overhead + flops · seconds_per_flop +
// tokens · layers · seconds_per_token_layer (the work that does not shrink with tensor
// parallelism: norms, rotary embeddings, softmax bookkeeping) + logits · seconds_per_logit (the
// loss's softmax over the vocabulary) + calls · seconds_per_nested_call (the compute side of
// each collective inside the op: a host thread that blocked in it resumes with cold caches; a
// GPU stream waits on an event) + layers · seconds_per_layer (each layer's small kernels,
// whatever the tokens), on one dedicated core or device; and never less than
// layers · host_seconds_per_layer, the host's time to issue the op's kernels: a GPU whose
// kernels finish faster than the host launches them waits for the host (small micro-batches).
// A W with no fit of its own runs fused into its B (the executor does that): it costs the B
// class's FLOP rate and nothing else.
struct ComputeFit {
  ModuleRole role = ModuleRole::kLlm;
  Phase phase = Phase::kF;
  SizeClass size = SizeClass::kSmall;
  double overhead_s = 0;
  double seconds_per_flop = 0;
  double seconds_per_token_layer = 0;
  double seconds_per_logit = 0;
  double seconds_per_nested_call = 0;
  double seconds_per_layer = 0;
  double host_seconds_per_layer = 0;
  FitStats stats;
};

// The work of one compute op as a ComputeFit prices it.
struct ComputeWork {
  double flops = 0;
  double token_layers = 0;  // tokens · layers
  double logits = 0;
  double calls = 0;   // collective calls inside the op
  double layers = 0;  // transformer layers (at least one is charged the host floor)
};
// Seconds of `work` under `f`: the larger of the device's time and the host's floor.
double fitted_compute_s(const ComputeFit& f, const ComputeWork& work);
// The host's floor of an op of `layers` layers at `per_layer` seconds each (at least one layer's:
// an op without layers still launches kernels).
double host_floor_s(double per_layer, double layers);

// A communication class fitted from traces: a collective of `group_size` ranks takes
// steps(kind, n) · latency_s + bus_factor(kind, n) · bytes / bandwidth (NCCL-tests' bus
// bandwidth); a point-to-point message latency_s + bytes / bandwidth (group_size 2, kind unused).
struct LinkFit {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int64_t group_size = 2;
  bool local = true;  // all members in one node
  double latency_s = 0;
  double bandwidth_bytes_per_s = 0;
  FitStats stats;
};

// The optimizer step: overhead + bytes / bandwidth.
struct OptimizerFit {
  double overhead_s = 0;
  double bandwidth_bytes_per_s = 0;
  FitStats stats;
};

// The mean slowdown of GPU compute beside a collective, as published (default_cost_params).
inline constexpr double kMeasuredOverlapSlowdown = 1.189;

struct CostParams {
  // Fraction of the device's dense peak a Compute op sustains, by (module role, phase).
  // Default: kDefaultEfficiency for every class.
  std::map<std::pair<ModuleRole, Phase>, double> efficiency;
  double default_efficiency = 0.6;
  // Fixed cost per transformer layer of a Compute op (kernel launches, norms, small ops).
  double overhead_per_layer_s = 25e-6;
  // Fixed cost of any Compute op (framework dispatch).
  double overhead_per_op_s = 10e-6;
  // Scale of the link bandwidths taken from the cluster (NCCL reaches ~80-90% of the wire).
  double bandwidth_efficiency = 0.85;
  // Kernel-level pricing (devices with kernel data): the launch cost fitted on the published
  // suite (docs/FIDELITY.md; `tessera fidelity --fit`), and a scale on every device's own
  // fitted training_scale (1).
  KernelTuning kernel_tuning;

  // Fitted by `tessera calibrate` (profile.hpp); each overrides the analytic defaults above for
  // its class. Ops of classes with no fit keep the defaults.
  std::vector<ComputeFit> compute_fits;
  std::vector<LinkFit> collective_fits;
  std::vector<LinkFit> p2p_fits;
  std::optional<OptimizerFit> optimizer_fit;
  // Compute runs this much slower while its rank's collective stream runs beside it
  // (overlap_slowdown.hpp; 1 = none). Kernel-priced GPUs: kMeasuredOverlapSlowdown; a
  // calibration profile with overlapped samples sets its fit.
  double overlap_slowdown = 1;
};

// Analytic defaults for a cluster kind: GPUs sustain 60% of dense peak in large matmuls
// (Megatron's GPT runs: 52% MFU end to end), CPUs 50% with larger per-layer overheads.
// A GPU whose device file has kernel data is priced kernel by kernel instead (kernel_cost.hpp),
// and a node with measured bus-bandwidth curves prices collectives as NCCL (collective_cost.hpp);
// calibration fits still take precedence for their classes.
CostParams default_cost_params(const ClusterSpec& cluster);

class CostModel {
 public:
  // REQUIRES: the program's groups and ranks were built for `cluster`.
  CostModel(const ClusterSpec& cluster, DType dtype, CostParams params, const ModelSpec& model);

  // Seconds of a Compute op, nested collectives included; or of an optimizer step.
  double compute_s(const Program& program, const Op& op) const;
  // The same without the nested collectives (a simulator runs those itself). cpu-local: a rank's
  // even share of the cores when the program has more ranks than cores.
  double compute_only_s(const Program& program, const Op& op) const;
  // Seconds of a B op's input-gradient TP collectives that run beside the weight-gradient GEMMs
  // (kOpTpGradOverlap; kernel-level pricing only, else 0).
  double hidden_input_gradient_s(const Program& program, const Op& op) const;
  // Seconds of a B op's second gathers of its sequence-parallel inputs (Megatron-LM's, for the
  // weight gradients) that run beside the input-gradient GEMMs (kernel-level pricing only).
  double hidden_regather_s(const Program& program, const Op& op) const;
  // Seconds of the op's nested collectives (of `purpose`), each at its own time.
  double nested_s(const Program& program, const Op& op,
                  std::optional<Purpose> purpose = std::nullopt) const;
  // The same for op `index` of `rank`, as the executor runs it: a W fused into its B
  // (fused_with_backward) is priced with the B as one call, so that a fitted host floor covers
  // both, and costs nothing itself. Alike for every fit without a floor.
  double compute_s(const Program& program, int32_t rank, std::size_t index) const;
  double compute_only_s(const Program& program, int32_t rank, std::size_t index) const;
  // The same on a core or device of its own (a simulator that shares cores itself).
  double dedicated_compute_s(const Op& op) const;
  double dedicated_compute_s(const std::vector<Op>& ops, std::size_t index) const;
  // The part of dedicated_compute_s that does not grow with the op's work: a Compute op's fixed
  // cost (the fit's overhead, none for a W fused into its B; else the analytic per-op overhead).
  double fixed_compute_s(const Op& op) const;
  // Seconds of one collective of `bytes` (NCCL-tests size) over `group`, moved by `transport`'s
  // kernels.
  double collective_s(CollectiveKind kind, const RankList& group, double bytes,
                      Transport transport = Transport::kNccl) const;
  // Seconds of one call of a compute op's nested collective.
  double collective_s(const Program& program, const NestedCollective& nested) const;
  // Seconds for a point-to-point message between two ranks.
  double p2p_s(int64_t from, int64_t to, double bytes) const;

  // Bus bandwidth and latency between the members of a group: inside one node, or across.
  bool same_node(const RankList& group) const;
  // The calibration fit that prices an op, a collective or a message (nullptr: the analytic
  // defaults do). Compute: the op's (role, phase) in the nearest size class; a W with no fit of
  // its own takes its B's. Collectives: the kind and locality at the nearest group size.
  const ComputeFit* compute_fit(const Op& op) const;
  // Whether `op` is priced kernel by kernel: a device with kernel data, a module of the model,
  // no calibrated fit of its class. Only then are its GEMMs' times known apart.
  bool kernel_priced(const Op& op) const;
  const LinkFit* collective_fit(CollectiveKind kind, int64_t n, bool local) const;
  const LinkFit* p2p_fit(bool local) const;
  // The spread of the fit that prices the op, the collective or the message (FitStats::spread);
  // nullptr when no fit with a spread applies.
  const std::vector<double>* compute_spread(const Op& op) const;
  const std::vector<double>* collective_spread(CollectiveKind kind, const RankList& group) const;
  const std::vector<double>* p2p_spread(int64_t from, int64_t to) const;
  // Whether a calibration profile fitted this class of communication.
  bool calibrated_collective(CollectiveKind kind, const RankList& group) const;
  bool calibrated_p2p(int64_t from, int64_t to) const;
  const ClusterSpec& cluster() const { return cluster_; }
  const CostParams& params() const { return params_; }

 private:
  double efficiency(const Op& op) const;
  double nic_efficiency() const;
  // compute_only_s's overlaps and core share applied to `dedicated` seconds of `op`.
  double shared_compute_s(const Program& program, const Op& op, double dedicated) const;
  ClusterSpec cluster_;
  DType dtype_;
  CostParams params_;
  std::vector<ModuleSpec> modules_;  // for the kernel-level pricing (cluster.device.kernels)
  std::vector<ModuleRole> roles_;
  std::vector<SizeClass> sizes_;
};

// Latency steps of a collective over n ranks: rings take n-1 (all-reduce 2(n-1)); broadcast
// pipelines (1).
double latency_steps(CollectiveKind kind, int64_t n);

// NCCL-tests bus-bandwidth factor of a collective over n ranks: time = factor · S / B.
double bus_factor(CollectiveKind kind, int64_t n);

// Mixed-precision Adam per parameter: a weight of `dtype`; trainable ones add `gradient_bytes`
// of gradient (kept_gradient_bytes: 4, or 2 where Megatron-LM reduces in bf16) and 12 bytes of
// fp32 master weight and moments (divided over `optimizer_shards` ranks with a distributed
// optimizer) — 18 bytes (16), or 6 + 12/dp (ALGORITHMS.md §6). Fully sharded, the weights and
// gradients are divided over the shards too: 18/dp.
RankMemory parameter_memory(double parameters, bool trainable, int64_t optimizer_shards,
                            DType dtype, bool fully_sharded, int64_t gradient_bytes);

}  // namespace tessera

#include "shared/cost/kernel_cost.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "shared/base/check.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

namespace {

struct Gemm {
  double m = 0, n = 0, k = 0;
  double count = 1;   // layers that run it
  double groups = 1;  // equal GEMMs run as one grouped kernel (a rank's routed experts)
  double flops() const { return 2 * m * n * k * groups; }
};

// The forward GEMMs of one layer of `a` for `tokens` rows, matrices split over `tp`, run by
// `count` layers: Q/K/V, the attention output, and the MLP's input (gate and up together) and
// output projections. A dense MLP is one GEMM each; a mixture of experts' routed experts are
// grouped GEMMs, one per expert of this rank (its experts / `ep`), each of the rows routed to it
// (tokens · top_k · ep / experts on average: the EP group's tokens dealt over its experts);
// its shared experts, after every kind's four, in `shared`. `whole_experts`: the routed experts
// are not split over TP (expert TP 1), each rank's taking its own 1/tp of the tokens.
void layer_gemms(const TransformerArch& a, double tokens, double tp, double ep, double count,
                 bool whole_experts, std::vector<Gemm>& out, std::vector<Gemm>& shared) {
  const double h = static_cast<double>(a.hidden);
  const double attention = static_cast<double>(attention_matmul_parameters(a));
  // The attention output's input: the heads' values.
  const double values = static_cast<double>(a.heads * value_head_dim(a));
  const double matrices = a.gated_ffn ? 3 : 2;
  // Q/K/V as one GEMM of the input (multi-head latent attention's down- and up-projections
  // folded into it), and the output projection.
  out.push_back({tokens, (attention - values * h) / h / tp, h, count});
  out.push_back({tokens, h, values / tp, count});
  if (a.experts > 0) {
    const double experts = static_cast<double>(a.experts);
    const double inner = static_cast<double>(a.moe_ffn > 0 ? a.moe_ffn : a.ffn);
    const double etp = whole_experts ? 1.0 : tp;
    const double rows = tokens * etp / tp * static_cast<double>(a.top_k) * ep / experts;
    const double local = std::max(1.0, experts / ep);
    out.push_back({rows, (matrices - 1) * inner / etp, h, count, local});
    out.push_back({rows, h, inner / etp, count, local});
    if (a.shared_expert_ffn > 0) {
      const double s = static_cast<double>(a.shared_expert_ffn);
      shared.push_back({tokens, (matrices - 1) * s / tp, h, count});
      shared.push_back({tokens, h, s / tp, count});
    }
    return;
  }
  const double mlp_params = static_cast<double>(active_layer_matmul_parameters(a)) - attention;
  const double inner = std::max(0.0, mlp_params / matrices / h);
  out.push_back({tokens, (matrices - 1) * inner / tp, h, count});
  out.push_back({tokens, h, inner / tp, count});
}

// The GEMMs of an op's layers, four per kind of layer it holds (MoE, dense), in that order,
// then the MoE layers' shared experts.
std::vector<Gemm> op_layer_gemms(const TransformerArch& a, const Op& op) {
  std::vector<Gemm> out, shared;
  const double tokens = static_cast<double>(op.tokens), tp = std::max<double>(1, op.tp);
  const double ep = std::max<double>(1, op.ep);
  const int64_t moe = moe_layers(a, op.first_layer, op.first_layer + op.layers);
  const bool whole = (op.flags & kOpExpertsWhole) != 0;
  if (moe > 0) layer_gemms(a, tokens, tp, ep, static_cast<double>(moe), whole, out, shared);
  if (op.layers > moe)
    layer_gemms(dense_layer_arch(a), tokens, tp, ep, static_cast<double>(op.layers - moe), whole,
                out, shared);
  out.insert(out.end(), shared.begin(), shared.end());
  return out;
}

// The MLP's inner width per token, averaged over an op's layers (top-k experts and shared
// experts in MoE layers), on one of its TP ranks: what its activation reads and writes.
double mlp_inner_per_token(const TransformerArch& a, const Op& op) {
  const double tp = std::max<double>(1, op.tp), layers = static_cast<double>(op.layers);
  const auto moe = static_cast<double>(moe_layers(a, op.first_layer, op.first_layer + op.layers));
  const auto inner = [&](const TransformerArch& x) {
    const double mlp =
        static_cast<double>(active_layer_matmul_parameters(x) - attention_matmul_parameters(x));
    return mlp / (x.gated_ffn ? 3.0 : 2.0) / static_cast<double>(x.hidden) / tp;
  };
  return layers > 0 ? (moe * inner(a) + (layers - moe) * inner(dense_layer_arch(a))) / layers : 0;
}

// The same GEMM as a phase runs it: B computes the input gradient dX = dY·Wᵀ, W the weight
// gradient dW = Xᵀ·dY (the tokens become the reduction).
Gemm for_phase(const Gemm& g, Phase phase) {
  switch (phase) {
    case Phase::kB:
      return {g.m, g.k, g.n, g.count, g.groups};
    case Phase::kW:
      return {g.k, g.n, g.m, g.count, g.groups};
    case Phase::kF:
    case Phase::kR:
      return g;
  }
  return g;
}

double memory_s(const DeviceSpec& device, double bytes) {
  return bytes / (device.memory_bandwidth_bytes_per_s * device.kernels->memory_efficiency);
}

}  // namespace

// Seconds of one of an op's transformer-layer GEMMs, `p` shaped as its phase runs it: at the
// model dtype's peak, or (kOpFp8) at the FP8 peak and the device's FP8 GEMM efficiency (its
// block-scaled one under kOpFp8BlockScaling), with one-byte operands.
double layer_gemm_s(const DeviceSpec& device, const Op& op, double peak_flops, double m, double n,
                    double k, double bpv, double scale, double groups) {
  if ((op.flags & kOpFp8) == 0) return gemm_s(device, peak_flops, m, n, k, bpv, scale, groups);
  return fp8_gemm_s(device, m, n, k, scale, groups, (op.flags & kOpFp8BlockScaling) != 0);
}

double fp8_gemm_s(const DeviceSpec& device, double m, double n, double k, double efficiency_scale,
                  double groups, bool block_scales) {
  TESSERA_CHECK(device.kernels.has_value());
  const GemmKernels& g = device.kernels->gemm;
  return gemm_s(device, device.peak_flops.at(DType::kFp8), m, n, k, 1.0,
                efficiency_scale * (block_scales ? g.fp8_block() : g.fp8()) / g.efficiency, groups);
}

double gemm_s(const DeviceSpec& device, double peak_flops, double m, double n, double k,
              double bytes_per_value, double efficiency_scale, double groups) {
  TESSERA_CHECK(device.kernels.has_value());
  if (m <= 0 || n <= 0 || k <= 0 || groups <= 0) return 0;
  const GemmKernels& g = device.kernels->gemm;
  // A grouped kernel deals every group's tiles to the SMs together: each group pads its own
  // tiles, the waves are shared.
  const double tiles = groups * std::ceil(m / static_cast<double>(g.tile_m)) *
                       std::ceil(n / static_cast<double>(g.tile_n));
  const double sms = static_cast<double>(g.sms);
  // Every wave runs `sms` tiles' worth of time, full or not.
  const double padded =
      std::ceil(tiles / sms) * sms * static_cast<double>(g.tile_m * g.tile_n) * 2 * k;
  const double compute = padded / (peak_flops * g.efficiency * efficiency_scale);
  const double memory = memory_s(device, groups * bytes_per_value * (m * k + k * n + m * n));
  return std::max(compute, memory);
}

double kernel_compute_s(const ModuleSpec& module, const Op& op, const DeviceSpec& device,
                        double peak_flops, double bpv, const KernelTuning& tuning) {
  TESSERA_CHECK(device.kernels.has_value());
  TESSERA_CHECK(op.kind == OpKind::kCompute);
  const DeviceKernels& dk = *device.kernels;
  const double tokens = static_cast<double>(op.tokens);
  const double tp = std::max<double>(1, op.tp);
  const double layers = static_cast<double>(op.layers);
  const bool pytorch = (op.flags & kOpPytorchKernels) != 0;
  const double scale = tuning.efficiency * dk.training_scale_for(pytorch);
  const AttentionKernels& flash = dk.attention_for(pytorch);
  const bool backward = op.phase == Phase::kB;

  // Matrix work: the op's GEMMs by shape, their rate applied to the op's non-attention FLOPs.
  std::vector<Gemm> gemms;
  double kernels = 0;  // launches
  double elementwise_bytes = 0;
  double attention_counted = 0, attention_s = 0;
  if (const auto& a = module.transformer; a && op.layers > 0) {
    gemms = op_layer_gemms(*a, op);
    const double h = static_cast<double>(a->hidden);
    const double q = static_cast<double>(a->heads * a->head_dim);
    const double kv = static_cast<double>(a->kv_heads * a->head_dim);
    // Per token and layer, forward: two norms and two residual adds over the hidden vector
    // (read, write; 1/tp of the tokens under sequence parallelism), the MLP activation (gated:
    // read two, write one), rotary embeddings on Q and K.
    const double hidden_share = (op.flags & kOpSequenceParallel) != 0 ? h / tp : h;
    const double inner = mlp_inner_per_token(*a, op);
    const bool rotary = a->positions == 0;
    double forward_bytes = 0, forward_kernels = 0;
    if ((op.flags & kOpEagerElementwise) == 0) {
      // Fused: each kernel reads its inputs and writes its output once.
      forward_bytes = bpv * (10.0 * hidden_share + (a->gated_ffn ? 3.0 : 2.0) * inner +
                             (rotary ? 2.0 * (q + kv) / tp : 0.0));
      forward_kernels = 13;  // 4 GEMMs, attention, 8 element-wise
    } else {
      // PyTorch eager (Hugging Face Transformers): a norm casts to fp32, squares, averages,
      // scales, casts back and multiplies by its weight (28 + 4·bpv bytes per value); rotary
      // multiplies by cos, negates and concatenates halves, multiplies by sin and adds (10 values
      // moved per value); a gated activation and its product run apart (5 per value).
      forward_bytes = 2.0 * (28.0 + 4.0 * bpv) * hidden_share + bpv * 6.0 * hidden_share +
                      bpv * (a->gated_ffn ? 5.0 : 2.0) * inner +
                      (rotary ? bpv * 10.0 * (q + kv) / tp : 0.0);
      // 4 GEMMs, attention, two norms of 7 kernels, two residual adds, the activation's 2, and
      // rotary's 6 for each of Q and K.
      forward_kernels = 4 + 1 + 2 * 7 + 2 + 2 + (rotary ? 12 : 0);
    }
    forward_bytes *= tokens * layers;
    // Per-op checkpointing recomputes every element-wise kernel but only every second GEMM and
    // not attention (op.flops holds the recomputed GEMMs' FLOPs alone).
    const bool per_op = (op.flags & kOpPerOpRecompute) != 0;
    if (per_op) forward_kernels -= 3;
    forward_kernels *= layers;
    switch (op.phase) {
      case Phase::kF:
      case Phase::kR:
        elementwise_bytes += forward_bytes;
        kernels += forward_kernels;
        break;
      case Phase::kB:
        elementwise_bytes += 2 * forward_bytes;
        kernels += 2 * forward_kernels;
        break;
      case Phase::kW:
        kernels += 4 * layers;
        break;
    }
    // The op's layers by kind.
    const auto moe =
        static_cast<double>(moe_layers(*a, op.first_layer, op.first_layer + op.layers));
    const double dense = layers - moe;
    // A rank's routed experts; the all-to-all dispatcher sorts what it receives by them (DeepEP
    // and HybridEP hand the tokens over without that sort); recomputing an MoE layer whole routes
    // and permutes again before the backward.
    const double local_experts =
        std::max(1.0, static_cast<double>(a->experts) / std::max<double>(1, op.ep));
    const bool alltoall = (op.flags & kOpDeepEpDispatch) == 0;
    const bool sorted = alltoall && local_experts > 1;
    const bool rerouted = (op.flags & kOpMoeRecompute) != 0;
    if (moe > 0 && op.phase != Phase::kW) {
      // Token permutation around the routed experts, per MoE layer (Megatron-LM's fused permute
      // and unpermute): each token's hidden vector copied to its top_k expert slots before the
      // dispatch (read once, written k times) and the k expert outputs summed back after the
      // combine (read k times, written once); the backward moves the same bytes the other way,
      // and recomputing the MoE layer whole moves them again. The all-to-all dispatcher with
      // several experts on a rank also sorts the tokens it receives by expert and back (read and
      // written k times, twice); DeepEP hands them over without that sort.
      const double k = static_cast<double>(a->top_k);
      const double passes = op.phase == Phase::kB && rerouted ? 2.0 : 1.0;
      elementwise_bytes +=
          passes * bpv * hidden_share * tokens * moe * (2.0 * (k + 1.0) + (sorted ? 4.0 * k : 0.0));
      kernels += passes * moe * (sorted ? 4.0 : 2.0);
    }
    if (moe > 0 && !pytorch) {
      // Megatron-LM's MoE layer (Transformer Engine) launches more than the four GEMMs counted
      // above: the router's GEMM and its fused score and top-k (forward; their gradients in the
      // backward; the router's weight gradient), and for each of the routed experts' two matrices
      // one cuBLAS GEMM per local expert (GroupedLinear's multi-stream backend), where the count
      // above has one. Recomputing the MoE layer whole runs the experts' forward GEMMs again.
      const double per_expert = 2.0 * (local_experts - 1.0);
      // And the small kernels around them, forward and backward (Megatron-LM's router and
      // dispatchers, counted in their code): the load-balancing loss and its bookkeeping (6, 7);
      // the all-to-all dispatcher's tokens-per-expert counts (6 forward) and its third
      // concatenation when it sorts by expert (1, 1); HybridEP's probability cast, routing-map
      // scan and padding (4 forward, 1 backward) and the barrier kernels around each dispatch
      // and combine (3 each way, each pass); the unfused permutation's sort, index and scatter
      // kernels where the fused pair has one each (12, 13).
      const bool hybridep = (op.flags & kOpHybridEpDispatch) != 0;
      const bool unfused = (op.flags & kOpUnfusedPermute) != 0;
      const double small_forward = 6.0 + (alltoall ? 6.0 : 0.0) + (sorted ? 1.0 : 0.0) +
                                   (hybridep ? 10.0 : 0.0) + (unfused ? 12.0 : 0.0);
      const double small_backward =
          7.0 + (sorted ? 1.0 : 0.0) + (hybridep ? 7.0 : 0.0) + (unfused ? 13.0 : 0.0);
      switch (op.phase) {
        case Phase::kF:
        case Phase::kR:
          kernels += moe * (2.0 + per_expert + small_forward);
          break;
        case Phase::kB:
          kernels += moe * (2.0 + per_expert * (rerouted ? 2.0 : 1.0) + small_backward +
                            (rerouted ? small_forward : 0.0));
          break;
        case Phase::kW:
          kernels += moe * (1.0 + per_expert);
          break;
      }
    }
    if (op.phase == Phase::kB) {
      // Selective recomputation's submodules, forward again before the backward (fused
      // kernels; their matrices are in op.flops): the two norms, the latent attention's rotary,
      // the activations of a dense MLP, of the routed experts, of the shared expert.
      const double act = a->gated_ffn ? 3.0 : 2.0, matrices = a->gated_ffn ? 3.0 : 2.0;
      const double routed = static_cast<double>(a->top_k * a->moe_ffn) / tp;
      const double shared = static_cast<double>(a->shared_expert_ffn) / tp;
      double values = 0, launches = 0;
      if ((op.flags & kOpLayernormRecompute) != 0) {
        values += 4.0 * hidden_share * layers;
        launches += 2.0 * layers;
      }
      if ((op.flags & kOpMlaUpProjRecompute) != 0 && a->kv_lora_rank > 0) {
        values += 2.0 * static_cast<double>((a->heads + 1) * a->rope_head_dim) / tp * layers;
        launches += 3.0 * layers;
      }
      if ((op.flags & kOpMlpRecompute) != 0 && dense > 0) {
        values += act * static_cast<double>(a->ffn) / tp * dense;
        launches += (matrices + 1.0) * dense;
      }
      if ((op.flags & kOpMoeRecompute) != 0) {
        values += act * (routed + shared) * moe;
        launches += (2.0 * matrices + 3.0) * moe;  // router, experts, shared expert, activations
      } else {
        if ((op.flags & kOpMoeActRecompute) != 0) {
          values += act * routed * moe;
          launches += moe;
        }
        if ((op.flags & kOpSharedExpertRecompute) != 0 && shared > 0) {
          values += act * shared * moe;
          launches += (matrices + 1.0) * moe;
        }
      }
      elementwise_bytes += bpv * values * tokens;
      kernels += launches;
    }
    // Attention as the lowering counts it (layer_attention_flops, phase_flops).
    const double heads_local = static_cast<double>(a->heads) / tp;
    const double forward_attention = layer_attention_flops(*a, op.attention_pairs) / tp * layers;
    if (forward_attention > 0 && op.phase != Phase::kW && !per_op) {
      attention_counted = phase_flops(0, forward_attention, op.phase);
      if ((op.flags & kOpUnfusedAttention) != 0) {
        // Unfused: the full score matrix (masked half included) through two batched GEMMs,
        // written, soft-maxed and read back (forward ~4 passes over it, backward ~6); selective
        // recomputation runs the forward again before the backward.
        const double scores = 2.0 * op.attention_pairs * heads_local * layers;
        const double passes =
            backward ? ((op.flags & kOpAttentionRecompute) != 0 ? 3.0 : 2.0) : 1.0;
        attention_s = passes * (2 * forward_attention / (peak_flops * dk.gemm.efficiency * scale) +
                                memory_s(device, scores * bpv * 4.0)) -
                      (backward ? memory_s(device, scores * bpv * 2.0) : 0.0);
        kernels += (backward ? 6.0 : 4.0) * layers;
      } else {
        const double keys = tokens > 0 ? op.attention_pairs / tokens : 0;
        const double length_factor = scale * keys / (keys + flash.half_keys);
        attention_s =
            backward
                ? 2.5 * forward_attention / (peak_flops * flash.backward_efficiency * length_factor)
                : forward_attention / (peak_flops * flash.forward_efficiency * length_factor);
      }
    }
  }
  // The layer GEMMs run once per layer of their kind; the head and a projector once.
  double gemm_flops = 0, gemm_seconds = 0;
  for (const Gemm& g : gemms) {
    const Gemm p = for_phase(g, op.phase);
    gemm_flops += g.count * g.flops();
    gemm_seconds +=
        g.count * layer_gemm_s(device, op, peak_flops, p.m, p.n, p.k, bpv, scale, g.groups);
  }
  if ((op.flags & kOpFp8) != 0 && op.phase != Phase::kW) {
    // Quantization: each FP8 GEMM's input (forward) or output gradient (input-gradient phase)
    // read once and written twice in FP8, as rows and transposed (Hopper's FP8 GEMMs take TN
    // operands only); current scaling reads it once more for its amax. The weight-gradient GEMMs
    // reuse those copies. Priced as separate passes: Transformer Engine fuses some of them into
    // the norm and the activation. Block scales come from the block in the pass that casts it.
    const bool current = (op.flags & kOpFp8CurrentScaling) != 0;
    const double per_value = bpv + 2.0 + (current ? bpv : 0.0);
    for (const Gemm& g : gemms) {
      elementwise_bytes += g.count * g.groups * g.m * (backward ? g.n : g.k) * per_value;
      kernels += g.count * (current ? 2.0 : 1.0);
    }
    // Delayed scaling's amax reduction: the amaxes gathered into one buffer before it, the
    // histories and scales updated after it (one fused kernel).
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kAmax) kernels += 2.0 * n.count;
  }
  auto add_gemm = [&](const Gemm& g) {
    const Gemm p = for_phase(g, op.phase);
    gemm_flops += g.flops();
    gemm_seconds += gemm_s(device, peak_flops, p.m, p.n, p.k, bpv, scale);
    kernels += 1;
  };
  const int64_t end = op.first_layer + op.layers;
  if (const auto& a = module.transformer; a && (op.flags & kOpHead) != 0 && a->vocab > 0) {
    // The stack's head where the op ends it, and one for each multi-token-prediction layer.
    const int64_t heads = (end == stack_end(*a) ? 1 : 0) + mtp_layers_in(*a, op.first_layer, end);
    for (int64_t i = 0; i < heads; ++i) {
      add_gemm({tokens, static_cast<double>(a->vocab) / tp, static_cast<double>(a->hidden)});
      // The loss: fp32 logits written, soft-maxed, read back (forward), their gradient
      // (backward).
      if (op.phase != Phase::kW) kernels += 3;
    }
    if (op.phase != Phase::kW) elementwise_bytes += op.logits * 4.0 * (backward ? 2.0 : 3.0);
  }
  // A multi-token-prediction layer's projection of its concatenated inputs.
  if (const auto& a = module.transformer)
    for (int64_t i = mtp_layers_in(*a, op.first_layer, end); i > 0; --i)
      add_gemm({tokens, static_cast<double>(a->hidden) / tp, 2.0 * static_cast<double>(a->hidden)});
  if (const auto& a = module.transformer; a && (op.flags & kOpFrontEnd) != 0) {
    // The embedding's gather (forward) and its gradient's scatter (weight phase).
    if (op.phase != Phase::kB) elementwise_bytes += tokens * static_cast<double>(a->hidden) * bpv;
    kernels += 1;
  }
  if (const auto& p = module.projector) {
    double in = static_cast<double>(p->in);
    const double out = static_cast<double>(p->out);
    if (p->merger > 0) {
      // The merger runs whole on every rank before the MLP.
      add_gemm({tokens, static_cast<double>(p->merger), in});
      in = static_cast<double>(p->merger);
    }
    if (p->queries > 0) {
      // A resampler, whole on every rank: the tokens in to width out, keys and values, the
      // queries' projections in and out (shaped as the tokens in: a rate, not a count), and
      // its attention at the GEMMs' rate.
      if (p->in != p->out) add_gemm({tokens, out, in});
      add_gemm({tokens, 2 * out, out});
      add_gemm({tokens, out, out});
      add_gemm({tokens, out, out});
      in = out;
    }
    if (p->layers == 1) {
      add_gemm({tokens, out / tp, in});
    } else {
      const double hidden = static_cast<double>(p->hidden);
      add_gemm({tokens, hidden / tp, in});
      for (int64_t i = 2; i < p->layers; ++i) add_gemm({tokens, hidden / tp, hidden});
      add_gemm({tokens, out, hidden / tp});
      if (op.phase != Phase::kW) {
        elementwise_bytes += static_cast<double>(p->layers - 1) * tokens * hidden / tp * bpv * 2.0;
        kernels += static_cast<double>(p->layers - 1);
      }
    }
  }
  const double linear = std::max(0.0, op.flops + op.expert_wait_flops - attention_counted);
  const double per_flop =
      gemm_flops > 0 ? gemm_seconds / gemm_flops : 1.0 / (peak_flops * dk.gemm.efficiency * scale);
  return linear * per_flop + attention_s + memory_s(device, elementwise_bytes) +
         kernels * tuning.launch_s;
}

double column_parallel_hidden_s(const ModuleSpec& module, const Op& op, Phase gemm,
                                const DeviceSpec& device, double peak_flops, double bpv,
                                const KernelTuning& tuning, double call_s) {
  TESSERA_CHECK(device.kernels.has_value());
  TESSERA_CHECK(op.kind == OpKind::kCompute);
  if (!module.transformer || op.layers <= 0) return 0;
  const double scale =
      tuning.efficiency * device.kernels->training_scale_for((op.flags & kOpPytorchKernels) != 0);
  double hidden = 0;
  const std::vector<Gemm> gemms = op_layer_gemms(*module.transformer, op);
  for (std::size_t kind = 0; kind + 3 < gemms.size(); kind += 4)  // shared experts after
    for (const std::size_t column : {kind, kind + 2}) {           // Q/K/V, MLP input
      const Gemm w = for_phase(gemms[column], gemm);
      hidden += w.count * std::min(call_s, layer_gemm_s(device, op, peak_flops, w.m, w.n, w.k, bpv,
                                                        scale, w.groups));
    }
  return hidden;
}

double kernel_optimizer_s(const DeviceSpec& device, double bytes, const KernelTuning& tuning) {
  TESSERA_CHECK(device.kernels.has_value());
  return memory_s(device, bytes) + 4 * tuning.launch_s;
}

}  // namespace tessera

#include "shared/model/model_math.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "shared/base/check.hpp"

namespace tessera {

int64_t norm_parameters(NormKind norm, int64_t width) {
  return norm == NormKind::kLayerNorm ? 2 * width : width;
}

namespace {

// An MLP of width `ffn` on one of `tp` ranks: the up (and gate) projections split by columns
// with their biases, the down projection by rows, its bias whole.
double mlp_parameters(const TransformerArch& a, int64_t ffn, double tp) {
  const int64_t matrices = a.gated_ffn ? 3 : 2;
  double n = static_cast<double>(matrices * a.hidden * ffn) / tp;
  if (a.linear_bias || a.mlp_bias)
    n += static_cast<double>(a.gated_ffn ? 2 * ffn : ffn) / tp + static_cast<double>(a.hidden);
  return n;
}

// Multi-head latent attention's matrices on one of `tp` ranks, as Megatron-LM splits them: the
// down-projections of queries and of keys/values (with the rotary key values) and the latents'
// norms whole on every rank (replicated), the up-projections split by heads (columns), the
// output by rows.
double latent_attention_parameters(const TransformerArch& a, double tp) {
  const auto h = static_cast<double>(a.hidden), heads = static_cast<double>(a.heads);
  const auto hd = static_cast<double>(a.head_dim), vd = static_cast<double>(value_head_dim(a));
  const auto kv_rank = static_cast<double>(a.kv_lora_rank),
             q_rank = static_cast<double>(a.q_lora_rank);
  const auto rope = static_cast<double>(a.rope_head_dim);
  double n = 0;
  if (a.q_lora_rank > 0) {
    n += h * q_rank + static_cast<double>(norm_parameters(a.norm, a.q_lora_rank)) +
         q_rank * heads * hd / tp;
  } else {
    n += h * heads * hd / tp;
  }
  n += h * (kv_rank + rope) + static_cast<double>(norm_parameters(a.norm, a.kv_lora_rank));
  n += kv_rank * heads * (hd - rope + vd) / tp;
  n += heads * vd * h / tp;
  return n;
}

// Exact as long as counts stay below 2^53.
int64_t whole(double parameters) {
  return std::llround(parameters);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Qwen2-VL's smart_resize: both sides a multiple of `factor`, area within [min, max] pixels.
// Python rounds half to even; std::nearbyint does the same in the default rounding mode.
std::pair<int64_t, int64_t> smart_resize(int64_t height, int64_t width, int64_t factor,
                                         int64_t min_pixels, int64_t max_pixels) {
  const double f = static_cast<double>(factor);
  auto round_by = [&](double x) { return static_cast<int64_t>(std::nearbyint(x / f)) * factor; };
  auto floor_by = [&](double x) { return static_cast<int64_t>(std::floor(x / f)) * factor; };
  auto ceil_by = [&](double x) { return static_cast<int64_t>(std::ceil(x / f)) * factor; };
  int64_t h = std::max(factor, round_by(static_cast<double>(height)));
  int64_t w = std::max(factor, round_by(static_cast<double>(width)));
  const double area = static_cast<double>(height) * static_cast<double>(width);
  if (h * w > max_pixels) {
    const double beta = std::sqrt(area / static_cast<double>(max_pixels));
    h = std::max(factor, floor_by(static_cast<double>(height) / beta));
    w = std::max(factor, floor_by(static_cast<double>(width) / beta));
  } else if (h * w < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / area);
    h = ceil_by(static_cast<double>(height) * beta);
    w = ceil_by(static_cast<double>(width) * beta);
  }
  return {h, w};
}

// InternVL's dynamic_preprocess tile grid: among grids i x j with i*j <= max_tiles, the one
// whose aspect ratio is closest to the image's; ties go to the larger grid when the image is
// big enough to fill it. Returns the number of tiles.
int64_t tile_count(int64_t width, int64_t height, int64_t tile, int64_t max_tiles) {
  // Grids i x j of up to max_tiles tiles, fewest tiles first (i ascending within a count).
  const double aspect = static_cast<double>(width) / static_cast<double>(height);
  const double area = static_cast<double>(width) * static_cast<double>(height);
  double best_diff = std::numeric_limits<double>::infinity();
  std::pair<int64_t, int64_t> best{1, 1};
  for (int64_t n = 1; n <= max_tiles; ++n)
    for (int64_t i = 1; i <= n; ++i) {
      if (n % i != 0) continue;
      const int64_t j = n / i;
      const double diff = std::fabs(aspect - static_cast<double>(i) / static_cast<double>(j));
      if (diff < best_diff) {
        best_diff = diff;
        best = {i, j};
      } else if (diff == best_diff &&
                 area > 0.5 * static_cast<double>(tile * tile) * static_cast<double>(n)) {
        best = {i, j};
      }
    }
  return best.first * best.second;
}

// Tokens of one image-sized piece (one tile, or a fixed-size image).
MediaTokens square_piece(const Patching& p, int64_t side) {
  const int64_t grid = side / p.patch_size;
  const int64_t merged = ceil_div(grid, p.spatial_merge);  // merge_padding pads a partial block
  return {grid * grid + (p.class_token ? 1 : 0), merged * merged, 1};
}

}  // namespace

TransformerArch dense_layer_arch(const TransformerArch& a) {
  TransformerArch d = a;
  d.experts = d.top_k = d.moe_ffn = d.shared_expert_ffn = 0;
  d.capacity_factor = 0;
  d.dense_layers = 0;
  d.moe_every = 1;
  return d;
}

int64_t value_head_dim(const TransformerArch& a) {
  return a.v_head_dim > 0 ? a.v_head_dim : a.head_dim;
}

double kv_replica_parameters(const TransformerArch& a, int64_t tp) {
  if (a.kv_heads >= tp) return 0;
  const bool bias = a.linear_bias || a.qkv_bias;
  const auto d = static_cast<double>(a.head_dim);
  return 2.0 * static_cast<double>(a.hidden) * d + (bias ? (a.key_bias ? 2.0 : 1.0) * d : 0.0);
}

double sequence_partial_parameters(const TransformerArch& a) {
  const auto h = static_cast<double>(a.hidden);
  double n = static_cast<double>((a.post_norms ? 4 : 2) * norm_parameters(a.norm, a.hidden));
  if (a.layer_scale) n += 2 * h;
  if (a.linear_bias || a.out_bias) n += h;  // the attention output's
  if (a.experts > 0)
    n += h * static_cast<double>(a.experts) + (a.router_bias ? static_cast<double>(a.experts) : 0);
  else if (a.linear_bias || a.mlp_bias)
    n += h;  // the MLP's down projection's
  return n;
}

double expert_layer_parameters(const TransformerArch& a, int64_t tp, int64_t ep) {
  if (a.experts == 0) return 0;
  return static_cast<double>(a.experts / ep) *
         mlp_parameters(a, a.moe_ffn, static_cast<double>(tp));
}

double layer_parameters(const TransformerArch& a, int64_t tp, int64_t ep, int64_t etp) {
  const auto t = static_cast<double>(tp);
  const auto hidden = static_cast<double>(a.hidden);
  double n = 0;
  if (a.kv_lora_rank > 0) {
    n = latent_attention_parameters(a, t);  // no biases (validated)
  } else {
    // Key/value heads fewer than tp are replicated: each rank holds one.
    const double kv_share = a.kv_heads >= tp ? static_cast<double>(a.kv_heads) / t : 1.0;
    const auto q = static_cast<double>(a.heads * a.head_dim) / t;
    const double kv = kv_share * static_cast<double>(a.head_dim);
    n = hidden * q + 2 * hidden * kv + q * hidden;
    const double qkv = q + (a.key_bias ? 2 : 1) * kv;  // the biases of q, k, v
    if (a.linear_bias) {
      n += qkv + hidden;  // and the output projection's, whole
    } else {
      if (a.qkv_bias) n += qkv;
      if (a.out_bias) n += hidden;
    }
  }
  if (a.experts > 0) {
    // The experts, and the router (with its per-expert bias) whole on every rank.
    n += expert_layer_parameters(a, etp > 0 ? etp : tp, ep) +
         (hidden + (a.router_bias ? 1.0 : 0.0)) * static_cast<double>(a.experts);
    if (a.shared_expert_ffn > 0) n += mlp_parameters(a, a.shared_expert_ffn, t);
  } else {
    n += mlp_parameters(a, a.ffn, t);
  }
  // Norms: before attention and MLP, after them too with post_norms; per-head query and key
  // norms and layer scales, whole on every rank.
  n += static_cast<double>((a.post_norms ? 4 : 2) * norm_parameters(a.norm, a.hidden));
  if (a.layer_scale) n += static_cast<double>(2 * a.hidden);
  if (a.qk_norm) n += static_cast<double>(2 * norm_parameters(a.norm, a.head_dim));
  return n;
}

int64_t layer_parameters(const TransformerArch& a) {
  return whole(layer_parameters(a, 1));
}

double stack_parameters(const TransformerArch& a, int64_t first, int64_t end, int64_t tp,
                        int64_t ep, int64_t etp) {
  double n = sum_over_layers(
      a, first, end, [&](const TransformerArch& x) { return layer_parameters(x, tp, ep, etp); });
  // The gated layers are the stack's last ones (Mllama's global layers follow its local ones):
  // two gates each.
  const int64_t stack = std::min(end, a.layers);  // the range's end without its MTP layers
  const int64_t gated_from = a.layers - a.gated_layers;
  n += 2.0 * static_cast<double>(std::max<int64_t>(0, stack - std::max(first, gated_from)));
  // A cross-attention layer adds norms over its queries and keys and two gates (Mllama); they
  // are spread evenly over the stack, so a slice of it holds its share.
  const double cross = static_cast<double>(a.cross_attention_layers) *
                       static_cast<double>(2 * norm_parameters(a.norm, a.head_dim) + 2);
  if (a.layers > 0 && stack > first)
    n += cross * static_cast<double>(stack - first) / static_cast<double>(a.layers);
  n += static_cast<double>(mtp_layers_in(a, first, end)) * mtp_extra_parameters(a, tp);
  return n;
}

int64_t mtp_projection_parameters(const TransformerArch& a) {
  return 2 * a.hidden * a.hidden;
}

double mtp_extra_parameters(const TransformerArch& a, int64_t tp) {
  return static_cast<double>(mtp_projection_parameters(a)) / static_cast<double>(tp) +
         static_cast<double>(3 * norm_parameters(a.norm, a.hidden));
}

int64_t attention_matmul_parameters(const TransformerArch& a) {
  if (a.kv_lora_rank > 0) {
    // Without the latents' norms.
    int64_t norms = norm_parameters(a.norm, a.kv_lora_rank);
    if (a.q_lora_rank > 0) norms += norm_parameters(a.norm, a.q_lora_rank);
    return whole(latent_attention_parameters(a, 1)) - norms;
  }
  const int64_t q = a.heads * a.head_dim;
  const int64_t kv = a.kv_heads * a.head_dim;
  return a.hidden * q + 2 * a.hidden * kv + q * a.hidden;
}

int64_t key_value_width(const TransformerArch& a) {
  if (a.kv_lora_rank > 0) return a.heads * (a.head_dim + value_head_dim(a));
  return 2 * a.kv_heads * a.head_dim;
}

int64_t active_layer_matmul_parameters(const TransformerArch& a) {
  const int64_t attention = attention_matmul_parameters(a);
  const int64_t matrices = a.gated_ffn ? 3 : 2;
  const int64_t mlp =
      a.experts > 0
          ? (a.top_k * a.moe_ffn + a.shared_expert_ffn) * matrices * a.hidden + a.hidden * a.experts
          : matrices * a.hidden * a.ffn;
  return attention + mlp;
}

int64_t per_op_recomputed_matmul_parameters(const TransformerArch& a) {
  const int64_t attention =
      a.kv_lora_rank > 0 ? attention_matmul_parameters(a) / 2
                         : a.hidden * a.kv_heads * a.head_dim + a.heads * a.head_dim * a.hidden;
  const int64_t ffn = a.experts > 0 ? a.top_k * a.moe_ffn + a.shared_expert_ffn : a.ffn;
  return attention + a.hidden * ffn;
}

int64_t selective_recomputed_matmul_parameters(const TransformerArch& a, uint32_t modules) {
  int64_t n = 0;
  if ((modules & kRecomputeMlaUpProj) != 0 && a.kv_lora_rank > 0) {
    if (a.q_lora_rank > 0) n += a.q_lora_rank * a.heads * a.head_dim;
    n += a.kv_lora_rank * a.heads * (a.head_dim - a.rope_head_dim + value_head_dim(a));
  }
  const int64_t matrices = a.gated_ffn ? 3 : 2;
  if (a.experts == 0) {
    if ((modules & kRecomputeMlp) != 0) n += matrices * a.hidden * a.ffn;
  } else if ((modules & kRecomputeMoe) != 0) {
    n += (a.top_k * a.moe_ffn + a.shared_expert_ffn) * matrices * a.hidden + a.hidden * a.experts;
  } else if ((modules & kRecomputeSharedExperts) != 0) {
    n += a.shared_expert_ffn * matrices * a.hidden;
  }
  return n;
}

double input_side_parameters(const ModuleSpec& m, int64_t tp) {
  if (!m.transformer) return 0;
  const TransformerArch& a = *m.transformer;
  double n =
      static_cast<double>((a.vocab + a.extra_embeddings) * a.hidden) / static_cast<double>(tp);
  n += static_cast<double>(a.positions * a.hidden);
  if (m.patching) {
    const Patching& p = *m.patching;
    n += static_cast<double>(p.in_channels * p.patch_size * p.patch_size * p.temporal_patch *
                             a.hidden);
    if (a.linear_bias && p.conv_bias) n += static_cast<double>(a.hidden);
    if (p.class_token) n += static_cast<double>(a.hidden);
    if (p.pre_norm) n += static_cast<double>(norm_parameters(a.norm, a.hidden));
    if (p.aspect_ratios > 0) {
      // Mllama: per arrangement of tiles (and one for none), a position embedding of every
      // patch of every tile, and one before and one after the layers per tile; three gates.
      n += static_cast<double>((p.aspect_ratios + 1) * p.max_tiles * a.hidden * (a.positions + 2)) +
           3;
    }
  }
  if (m.audio) {
    // Whisper: conv1 (mel -> hidden, kernel 3) and conv2 (hidden -> hidden, kernel 3, stride 2).
    n += static_cast<double>(m.audio->mel_bins * a.hidden * 3 + a.hidden + a.hidden * a.hidden * 3 +
                             a.hidden);
  }
  return n;
}

double output_side_parameters(const ModuleSpec& m, int64_t tp) {
  if (!m.transformer) return 0;
  const TransformerArch& a = *m.transformer;
  const int64_t head = a.tied_embeddings ? 0 : a.vocab * a.hidden;
  return static_cast<double>(a.final_norm ? norm_parameters(a.norm, a.hidden) : 0) +
         static_cast<double>(head) / static_cast<double>(tp);
}

int64_t embedding_parameters(const ModuleSpec& m) {
  return whole(input_side_parameters(m, 1) + output_side_parameters(m, 1));
}

int64_t projector_merger_parameters(const ProjectorArch& p) {
  return (1 + p.deepstack) * p.in * p.merger;
}

int64_t resampler_parameters(const ProjectorArch& p) {
  if (p.queries == 0) return 0;
  const int64_t d = p.out;
  return p.queries * d * (p.query_positions ? 2 : 1) + (p.in != d ? p.in * d : 0) + 4 * d * d +
         4 * d + 3 * norm_parameters(NormKind::kLayerNorm, d);
}

int64_t projector_matmul_parameters(const ProjectorArch& p) {
  const int64_t in = p.merger > 0 ? p.merger : p.queries > 0 ? p.out : p.in;
  const int64_t mlp = p.layers == 1
                          ? in * p.out
                          : in * p.hidden + (p.layers - 2) * p.hidden * p.hidden + p.hidden * p.out;
  return (1 + p.deepstack) * mlp + projector_merger_parameters(p);
}

double projector_parameters(const ProjectorArch& p, int64_t tp) {
  const auto t = static_cast<double>(tp);
  const auto copies = static_cast<double>(1 + p.deepstack);
  const auto biases = static_cast<double>(p.bias ? p.hidden * (p.layers - 1) + p.out : 0);
  double n = 0;
  if (!projector_splits(p)) {
    n = static_cast<double>(projector_matmul_parameters(p)) + copies * biases;  // whole
  } else {
    // The merger stays whole; the MLP after it splits.
    const auto merger = static_cast<double>(projector_merger_parameters(p));
    n = (static_cast<double>(projector_matmul_parameters(p)) - merger) / t + merger;
    if (p.bias) n += copies * (static_cast<double>(p.hidden) / t + static_cast<double>(p.out));
  }
  if (p.input_norm)
    n += static_cast<double>(
        norm_parameters(p.norm, p.input_norm_width > 0 ? p.input_norm_width : p.in));
  // Each DeepStack copy normalizes its input.
  n += static_cast<double>(p.deepstack * norm_parameters(p.norm, p.in));
  // Whole on every rank.
  n += static_cast<double>(p.separators * p.in + p.output_embeddings * p.out);
  n += static_cast<double>(resampler_parameters(p));
  return n;
}

int64_t projector_parameters(const ProjectorArch& p) {
  return whole(projector_parameters(p, 1));
}

int64_t module_parameters(const ModuleSpec& m) {
  int64_t n = embedding_parameters(m);
  if (m.transformer) n += whole(stack_parameters(*m.transformer, 0, stack_end(*m.transformer), 1));
  if (m.projector) n += projector_parameters(*m.projector);
  return n;
}

int64_t model_parameters(const ModelSpec& model) {
  int64_t n = 0;
  for (const ModuleSpec& m : model.modules) n += module_parameters(m);
  return n;
}

int64_t trainable_parameters(const ModelSpec& model) {
  int64_t n = 0;
  for (const ModuleSpec& m : model.modules)
    if (!m.frozen) n += module_parameters(m);
  return n;
}

std::string tp_refusal(const TransformerArch& a, const std::string& who, int64_t tp) {
  const std::string t = std::to_string(tp);
  if (tp < 1 || a.heads % tp != 0)
    return t + " does not divide " + who + " heads=" + std::to_string(a.heads);
  const int64_t kv = a.kv_heads > 0 ? a.kv_heads : a.heads;
  if (kv % tp == 0 || tp % kv == 0) return "";
  return t + " and " + who + " kv_heads=" + std::to_string(kv) + " must divide one another";
}

TransformerArch pad_heads(const TransformerArch& a, int64_t tp) {
  TESSERA_CHECK(tp >= 1 && a.heads >= 1);
  TransformerArch p = a;
  if (p.head_dim == 0) p.head_dim = a.hidden / a.heads;
  p.heads = ceil_div(a.heads, tp) * tp;
  if (a.kv_heads == 0 || a.kv_heads == a.heads) p.kv_heads = p.heads;
  return p;
}

double layer_attention_flops(const TransformerArch& a, double attention_pairs) {
  // Q·Kᵀ over head_dim, P·V over the value head.
  return 2.0 * static_cast<double>(a.heads) * static_cast<double>(a.head_dim + value_head_dim(a)) *
         attention_pairs;
}

double layer_forward_flops_per_token(const TransformerArch& a, double attended_tokens) {
  // 2 FLOPs per weight, plus the attention scores of one query.
  return 2.0 * static_cast<double>(active_layer_matmul_parameters(a)) +
         layer_attention_flops(a, attended_tokens);
}

double phase_flops(double linear, double attention, Phase phase) {
  switch (phase) {
    case Phase::kF:
    case Phase::kR:
      return linear + attention;
    case Phase::kB:
      return linear + 2.0 * attention;
    case Phase::kW:
      return linear;
  }
  return 0;
}

double forward_flops_per_token(const ModuleSpec& m, double attended_tokens) {
  double flops = 0;
  if (m.transformer) {
    const TransformerArch& a = *m.transformer;
    // The layers, multi-token-prediction layers included, each of those with its projection.
    flops += sum_over_layers(a, 0, stack_end(a), [&](const TransformerArch& x) {
      return layer_forward_flops_per_token(x, attended_tokens);
    });
    flops +=
        static_cast<double>(a.mtp_layers) * 2.0 * static_cast<double>(mtp_projection_parameters(a));
    // The output head, once more for each multi-token-prediction layer.
    if (a.vocab > 0)
      flops +=
          static_cast<double>(1 + a.mtp_layers) * 2.0 * static_cast<double>(a.hidden * a.vocab);
    if (m.patching) {
      const Patching& p = *m.patching;
      flops += 2.0 * static_cast<double>(p.in_channels * p.patch_size * p.patch_size *
                                         p.temporal_patch * a.hidden);
    }
    if (m.audio) {
      // conv1 runs on every mel frame (downsampling frames per token), conv2 once per token.
      flops += 2.0 * static_cast<double>(m.audio->downsampling * m.audio->mel_bins * a.hidden * 3 +
                                         a.hidden * a.hidden * 3);
    }
  }
  if (m.projector) {
    // Per token, as if each token in became one out.
    const ProjectorFlops p = projector_forward_flops(*m.projector, 1, 1, 1);
    flops += p.linear + p.attention;
  }
  return flops;
}

ProjectorFlops projector_forward_flops(const ProjectorArch& p, double tokens_in, double tokens_out,
                                       int64_t tp) {
  const auto t = static_cast<double>(tp);
  const auto merger = static_cast<double>(projector_merger_parameters(p));
  const double mlp = static_cast<double>(projector_matmul_parameters(p)) - merger;
  ProjectorFlops f;
  if (p.queries == 0) {
    // The MLP's share is divided over TP even where it runs whole (projector_splits).
    f.linear = 2.0 * (mlp / t + merger) * tokens_out;
    return f;
  }
  // A resampler runs whole on every rank: keys and values from the tokens in, the queries into
  // and out of the attention, then the MLP.
  const auto d = static_cast<double>(p.out);
  const double to_d = p.in != p.out ? static_cast<double>(p.in) * d : 0;
  f.linear = 2.0 * (to_d + 2.0 * d * d) * tokens_in + 2.0 * (2.0 * d * d + mlp) * tokens_out;
  // Q·Kᵀ and P·V over the full width, each query of a piece against each of its tokens.
  f.attention = 4.0 * d * static_cast<double>(p.queries) * tokens_in;
  return f;
}

double projector_stash_values(const ProjectorArch& p, double tokens_in, double tokens_out,
                              int64_t tp) {
  const auto copies = static_cast<double>(1 + p.deepstack);
  // An MLP projector's share is divided over TP even where it runs whole (projector_splits).
  if (p.queries == 0)
    return tokens_out * static_cast<double>(p.in + p.merger + p.hidden) * copies /
           static_cast<double>(tp);
  const auto d = static_cast<double>(p.out);
  // The tokens in, their projection, normalized, as keys and values; per query its input, the
  // attention's output and the output norm's input; the probabilities of the (unfused)
  // attention; then the MLP's inputs.
  const double mlp = p.layers == 1 ? d : d + static_cast<double>(p.hidden * (p.layers - 1));
  return tokens_in * (static_cast<double>(p.in) + 4.0 * d) + tokens_out * (3.0 * d + mlp) +
         static_cast<double>(p.query_heads * p.queries) * tokens_in;
}

double activation_bytes_per_token_per_layer(const TransformerArch& a, double seq_len,
                                            const ActivationOptions& o) {
  TESSERA_CHECK(o.tp >= 1);
  const double t = static_cast<double>(o.tp);
  const double v = static_cast<double>(o.bytes_per_value);
  const double h = static_cast<double>(a.hidden);
  const double q = static_cast<double>(a.heads * a.head_dim);
  const double kv = static_cast<double>(key_value_width(a)) / 2;  // per K and V, averaged
  const double heads = static_cast<double>(a.heads);
  const double f =
      static_cast<double>(a.experts > 0 ? a.top_k * a.moe_ffn + a.shared_expert_ffn : a.ffn);
  const double mask = o.dropout ? 1.0 : 0.0;  // a dropout mask is one byte per element
  const auto recomputes = [&](RecomputeModule m) { return (o.recompute_modules & m) != 0; };

  if (o.per_op_checkpoint) {
    // The layer's input (replicated unless sequence parallel); split by TP: the attention's
    // output, Q's and V's (the odd matmuls of attention), the MLP's first matmul; the gated
    // MLP's last matmul (its seventh) before its reduction, whole on every TP rank; the
    // reduce-scatters' outputs under sequence parallelism.
    const double input = o.sequence_parallel ? v * h / t : v * h;
    const double split_kept = v * (2 * q + kv + f) + 4.0 * heads;
    const double reduced = (a.gated_ffn ? v * h : 0.0) + (o.sequence_parallel ? 2 * v * h / t : 0);
    return input + split_kept / t + reduced;
  }
  const double linear_in = o.fp8_linear_inputs ? 1.0 : v;  // a linear's saved input
  // Activations that are replicated across TP ranks unless sequence parallelism splits them:
  // the two norm inputs, the inputs of the QKV and first MLP linears (the norms' outputs), the
  // dropout masks after attention and MLP.
  const double norm_outputs = recomputes(kRecomputeLayernorm) ? 0.0 : 2 * linear_in * h;
  const double replicated = 2 * v * h + norm_outputs + 2 * mask * h;
  // Activations already split by TP: Q and K for the scores, V (multi-head latent attention's
  // come up from its latents again under mla_up_proj), the output-projection input, the MLP
  // intermediates (the last of them the second MLP linear's input).
  const bool up_projected = a.kv_lora_rank > 0 && recomputes(kRecomputeMlaUpProj);
  double split = (up_projected ? 0.0 : v * (q + kv) + v * kv) + linear_in * q;
  // Multi-head latent attention also keeps its latents (and the query latent) for backward;
  // they are whole on every TP rank.
  double latent = 0;
  if (a.kv_lora_rank > 0)
    latent = v * static_cast<double>(2 * a.kv_lora_rank + a.rope_head_dim + 2 * a.q_lora_rank);
  // The MLP's intermediates: the first linear's output (gated: two of them) and the activation's
  // output, the second linear's input. An MoE layer's routed experts and shared expert apart.
  const auto mlp = [&](double width, bool act_recomputed) {
    return (a.gated_ffn ? 2 * v * width : v * width) + (act_recomputed ? 0.0 : linear_in * width);
  };
  if (a.experts == 0) {
    if (!recomputes(kRecomputeMlp)) split += mlp(f, false);
  } else if (!recomputes(kRecomputeMoe)) {
    split += mlp(static_cast<double>(a.top_k * a.moe_ffn), recomputes(kRecomputeMoeAct));
    if (!recomputes(kRecomputeSharedExperts))
      split += mlp(static_cast<double>(a.shared_expert_ffn), false);
  }
  if (o.flash_attention) {
    split += 4.0 * heads;  // float32 log-sum-exp per head
  } else {
    // softmax output, its dropout mask and dropout output: a·s values per token.
    split += heads * seq_len * (v + mask + (o.dropout ? v : 0.0));
  }
  return (o.sequence_parallel ? replicated / t : replicated) + split / t + latent;
}

MediaTokens image_tokens(const ModuleSpec& encoder, int64_t width, int64_t height) {
  TESSERA_CHECK(encoder.patching.has_value(), encoder.name + " has no patching");
  TESSERA_CHECK(width > 0 && height > 0);
  const Patching& p = *encoder.patching;
  switch (p.resize) {
    case ResizeMode::kFixed:
      return square_piece(p, p.image_size);
    case ResizeMode::kDynamic: {
      const auto [h, w] =
          smart_resize(height, width, p.patch_size * p.spatial_merge, p.min_pixels, p.max_pixels);
      // A still image is repeated to fill one temporal patch: the token count is per image.
      const int64_t patches = (h / p.patch_size) * (w / p.patch_size);
      return {patches, patches / (p.spatial_merge * p.spatial_merge), 1};
    }
    case ResizeMode::kTiles: {
      int64_t pieces = tile_count(width, height, p.tile_size, p.max_tiles);
      if (p.thumbnail && pieces > 1) ++pieces;
      const MediaTokens one = square_piece(p, p.tile_size);
      return {one.encoder_tokens * pieces, one.llm_tokens * pieces, pieces};
    }
  }
  TESSERA_CHECK(false, "unhandled resize mode");
}

namespace {

// The side in pixels of one square piece of a fixed-size or tiled encoder.
int64_t frame_side(const Patching& p) {
  return p.resize == ResizeMode::kFixed ? p.image_size : p.tile_size;
}

}  // namespace

MediaTokens video_tokens(const ModuleSpec& encoder, int64_t frames, int64_t width, int64_t height) {
  TESSERA_CHECK(encoder.patching.has_value() && frames > 0);
  const Patching& p = *encoder.patching;
  const int64_t steps = ceil_div(frames, p.temporal_patch);
  MediaTokens frame;
  if (p.resize == ResizeMode::kDynamic) {
    frame = image_tokens(encoder, width, height);
  } else {
    frame = square_piece(p, frame_side(p));
  }
  if (p.video_pool > 1) {
    // Square frames (validation refuses pooling with dynamic resizing): each side of the merged
    // token grid shrinks by the stride, rounding up.
    const int64_t side = ceil_div(frame_side(p) / p.patch_size, p.spatial_merge);
    const int64_t pooled = ceil_div(side, p.video_pool);
    frame.llm_tokens = pooled * pooled;
  }
  return {frame.encoder_tokens * steps, frame.llm_tokens * steps, steps};
}

int64_t llm_tokens(const ModelSpec& model, const ModuleSpec& encoder, const MediaTokens& t) {
  const ProjectorArch* resampler = resampler_of(model, encoder);
  return resampler != nullptr ? t.pieces * resampler->queries : t.llm_tokens;
}

MediaTokens audio_tokens(const ModuleSpec& encoder, double seconds) {
  TESSERA_CHECK(encoder.audio.has_value() && seconds >= 0);
  const AudioFrontEnd& a = *encoder.audio;
  const int64_t windows =
      std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds / a.max_seconds)));
  MediaTokens total{0, 0, windows};
  double left = seconds;
  for (int64_t w = 0; w < windows; ++w) {
    const double span = a.pad_to_max ? a.max_seconds : std::min(left, a.max_seconds);
    left -= a.max_seconds;
    const int64_t frames =
        static_cast<int64_t>(std::ceil(span * static_cast<double>(a.frames_per_second)));
    const int64_t tokens = ceil_div(frames, a.downsampling);
    total.encoder_tokens += tokens;
    total.llm_tokens += ceil_div(tokens, a.pooling);
  }
  return total;
}

}  // namespace tessera

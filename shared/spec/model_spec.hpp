// ModelSpec: a multimodal model as a DAG of modules (encoders -> projectors -> LLM [-> generator]).
// Plain data; derived quantities (parameters, FLOPs, activation bytes, tokens per image) live in
// model_math.hpp. JSON layout is documented in docs/FORMATS.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shared/base/json_reader.hpp"

namespace tessera {

enum class ModuleRole { kEncoder, kProjector, kLlm, kGenerator };
enum class Modality { kImage, kAudio, kVideo, kText };
enum class NormKind { kRmsNorm, kLayerNorm };
enum class DType { kBf16, kFp16, kFp32, kFp8 };
// How an image is turned into encoder input.
enum class ResizeMode {
  kFixed,    // resized to image_size x image_size (CLIP/SigLIP, LLaVA-1.5)
  kDynamic,  // native resolution within [min_pixels, max_pixels] (Qwen2-VL)
  kTiles,    // cut into up to max_tiles tiles of tile_size (InternVL, LLaVA-NeXT, Mllama)
};

extern const EnumTable<ModuleRole> kModuleRoles;
extern const EnumTable<Modality> kModalities;
extern const EnumTable<DType> kDTypes;

// A stack of identical transformer layers (attention + MLP or MoE).
struct TransformerArch {
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;  // grouped-query attention. Default: heads
  int64_t head_dim = 0;  // of queries and keys. Default: hidden / heads
  // Multi-head latent attention (DeepSeek-V2/V3, Kimi) where kv_lora_rank > 0: keys and values
  // come up from a shared latent of kv_lora_rank values (normalized), plus rope_head_dim rotary
  // key values shared by all heads; queries through a latent of q_lora_rank when > 0. head_dim
  // is then a query/key head (rope_head_dim of it rotary), v_head_dim a value head. Keys and
  // values have `heads` heads.
  int64_t kv_lora_rank = 0;
  int64_t q_lora_rank = 0;
  int64_t rope_head_dim = 0;
  int64_t v_head_dim = 0;        // Default: head_dim
  int64_t ffn = 0;               // MLP inner width
  bool gated_ffn = false;        // SwiGLU-style: gate, up, down (3 matrices) instead of 2
  int64_t vocab = 0;             // LLM/generator: token embedding rows and output head. 0: none
  bool tied_embeddings = false;  // output head shares the embedding matrix
  bool linear_bias = false;      // every linear has a bias (ViT, CLIP, Whisper)
  bool qkv_bias = false;         // only q, k, v have a bias (Qwen2)
  bool key_bias = true;          // with either: the key projection has one too (Whisper's not)
  bool mlp_bias = false;  // without linear_bias: the MLP's linears have biases (Mllama's ViT)
  bool out_bias = false;  // without linear_bias: the attention output has a bias (InternViT-6B)
  NormKind norm = NormKind::kRmsNorm;
  bool qk_norm = false;  // queries and keys normalized per head before attention (Gemma 3, Qwen3)
  bool post_norms = false;   // attention and MLP outputs normalized too, before each residual add
                             // (Gemma 2 and 3: four norms per layer)
  bool layer_scale = false;  // learned per-channel scales on the attention and MLP outputs
                             // (InternViT's ls1 and ls2)
  bool final_norm = true;    // a norm after the last layer (InternViT has none)
  int64_t experts = 0;       // MoE experts per layer; 0 = dense MLP
  int64_t top_k = 0;         // experts active per token
  int64_t moe_ffn = 0;       // inner width of one expert. Default: ffn
  // Inner width of the shared expert MLP every token also passes through beside its routed
  // experts (Llama 4's one shared expert, DeepSeek's and Kimi's n shared experts together). 0:
  // none.
  int64_t shared_expert_ffn = 0;
  // Tokens one expert takes per micro-batch, as a multiple of its even share (tokens · top_k /
  // experts); the rest are dropped (GShard, Switch). 0: dropless (Megatron's default, MegaBlocks).
  double capacity_factor = 0;
  // The router adds a learned bias per expert to its scores (DeepSeek-V3's and Kimi's
  // e_score_correction_bias).
  bool router_bias = false;
  // Group-limited routing (DeepSeek's node-limited routing; Megatron-LM's
  // moe_router_num_groups and moe_router_group_topk): the experts fall in `router_groups`
  // contiguous groups, each scored by the sum of its best top_k / router_group_top_k scores, and
  // a token picks its top_k experts from its `router_group_top_k` best groups. 0: no groups.
  int64_t router_groups = 0;
  int64_t router_group_top_k = 0;
  // Layers of an MoE stack that keep a dense MLP of width `ffn`: the first `dense_layers`
  // (DeepSeek's and Kimi's first_k_dense_replace), and after them all but every `moe_every`-th
  // (Llama 4 Maverick's interleave_moe_layer_step: 2 puts experts in layers 1, 3, 5, ...).
  int64_t dense_layers = 0;
  int64_t moe_every = 1;
  // Multi-token prediction (DeepSeek-V3's MTP modules; Megatron-LM's mtp_num_layers): after the
  // stack, `mtp_layers` more layers, each predicting one token further ahead. Layer `layers + i`
  // takes the hidden states the layer before it made and the embeddings of the tokens i + 1 ahead,
  // each normed, concatenated and projected back to `hidden` (a 2·hidden x hidden matrix), and
  // ends in a norm and the model's output head and loss. An MTP layer has experts where the stack
  // has any. They run with the stack's last pipeline chunk, after its layers (Megatron-LM's
  // pipeline layout "...tmL"). 0: none.
  int64_t mtp_layers = 0;
  // Of `layers`, how many attend to media through cross-attention (Mllama). When > 0, media
  // tokens do not enter this module's sequence.
  int64_t cross_attention_layers = 0;
  // Of `layers`, how many scale their attention and MLP outputs by a learned tanh gate, one
  // scalar each (Mllama's global encoder layers).
  int64_t gated_layers = 0;
  int64_t extra_embeddings = 0;  // token-embedding rows beyond `vocab` that the head does not
                                 // predict (Mllama's 8 image tokens)
  int64_t positions = 0;         // learned absolute position embeddings (ViT, Whisper); 0 = rotary

  bool operator==(const TransformerArch&) const = default;
};

// The layers of a stack with its multi-token-prediction layers after them: [0, stack_end).
inline int64_t stack_end(const TransformerArch& arch) {
  return arch.layers + arch.mtp_layers;
}
// How many of layers [first, end) are multi-token-prediction layers (those from `layers` on).
inline int64_t mtp_layers_in(const TransformerArch& arch, int64_t first, int64_t end) {
  return end > arch.layers ? end - (first > arch.layers ? first : arch.layers) : 0;
}
// Whether layer `layer` of a stack has experts: every layer of an MoE stack but its first
// dense_layers and, after them, all but every moe_every-th; every multi-token-prediction layer of
// an MoE stack.
bool moe_layer(const TransformerArch& arch, int64_t layer);
// How many of layers [first, end) have experts.
int64_t moe_layers(const TransformerArch& arch, int64_t first, int64_t end);

// Image/video patching of a vision encoder.
struct Patching {
  int64_t patch_size = 14;
  int64_t in_channels = 3;
  int64_t spatial_merge = 1;   // tokens merged s x s after the encoder (Qwen2-VL 2, InternVL 2)
  int64_t temporal_patch = 1;  // video frames merged into one patch (Qwen2-VL 2)
  // A video frame's tokens average-pooled s x s (ceil) before the projector, without parameters
  // (LLaVA-NeXT-Video's spatial_pool_stride 2); images keep all of theirs.
  int64_t video_pool = 1;
  // A patch grid the merge does not divide is padded up to a multiple of it (DeepSeek-VL2: 27
  // patches to 28); otherwise the merge must divide the grid.
  bool merge_padding = false;
  bool class_token = false;  // encoder prepends a CLS token per image/tile; never sent to the LLM
  bool conv_bias = true;     // with transformer.linear_bias: the patch convolution has a bias too
                             // (CLIP's and Qwen2-VL's have none)
  bool pre_norm = false;     // a norm over the patch embeddings before the first layer (CLIP)
  // kTiles: learned position embeddings per tile arrangement (Mllama): this many supported
  // aspect ratios, plus one row for none. 0: none.
  int64_t aspect_ratios = 0;
  ResizeMode resize = ResizeMode::kFixed;
  int64_t image_size = 0;  // kFixed: side in pixels
  int64_t min_pixels = 0;  // kDynamic
  int64_t max_pixels = 0;  // kDynamic
  int64_t tile_size = 0;   // kTiles: side of one tile in pixels
  int64_t max_tiles = 0;   // kTiles
  bool thumbnail = false;  // kTiles: a downscaled whole image is added when tiles > 1

  bool operator==(const Patching&) const = default;
};

// Audio front end of an audio encoder (Whisper-style: log-mel frames -> 2 convs -> tokens).
struct AudioFrontEnd {
  int64_t mel_bins = 128;
  int64_t frames_per_second = 100;  // mel frames per second of audio (10 ms hop)
  int64_t downsampling = 2;         // conv stride: encoder tokens = frames / downsampling
  int64_t pooling = 1;              // tokens pooled k:1 before the LLM (Qwen2-Audio 2)
  double max_seconds = 30;          // one encoder window; longer clips use several windows
  bool pad_to_max = true;           // Whisper pads every window to max_seconds

  bool operator==(const AudioFrontEnd&) const = default;
};

// An MLP projector: in -> hidden -> out (layers 2) or in -> out (layers 1).
struct ProjectorArch {
  int64_t in = 0;
  int64_t hidden = 0;  // Default: out
  int64_t out = 0;
  int64_t layers = 2;
  bool bias = true;
  bool input_norm = false;  // a norm on the input (InternVL's mlp1, Gemma 3's soft-embedding norm)
  NormKind norm = NormKind::kLayerNorm;  // of input_norm
  // The width input_norm normalizes: `in` (0), or each encoder token before an s x s merge
  // concatenates them (in / s²: Kimi-VL's pre_norm).
  int64_t input_norm_width = 0;
  // Learned embeddings of width `in` that mark where an image's pieces meet (Phi-3-vision's
  // global and sub-image separators).
  int64_t separators = 0;
  // Learned embeddings of width `out` the projector places among its output tokens
  // (LLaVA-NeXT's image_newline; DeepSeek-VL2's image_newline and view separator).
  int64_t output_embeddings = 0;
  // Copies of this projector, each with a norm over its input, fed by an intermediate layer of
  // the encoder; the n copies' outputs add into the media tokens after the LLM's first n layers
  // (Qwen3-VL's DeepStack). Counted in the projector's parameters, FLOPs and output.
  int64_t deepstack = 0;
  // A bias-free linear from `in` down to this width before the MLP, which then starts from it
  // (Mistral 3's patch merger: s² concatenated patches back to one patch's width). 0: none.
  int64_t merger = 0;
  // A resampler before the MLP (MiniCPM-V's): `queries` learned queries cross-attend, with
  // `query_heads` heads at width `out`, to each piece's tokens (an image, tile, slice or frame
  // step; projected from `in` to `out` by a bias-free linear where the widths differ), so every
  // piece reaches the LLM as `queries` tokens whatever its size. Its parameters: the queries,
  // that linear, LayerNorms over the queries, the keys and values and the output, the
  // attention's input and output projections with their biases. The MLP then maps out -> out.
  // 0: no resampler.
  int64_t queries = 0;
  int64_t query_heads = 0;  // Default: out / 128 (MiniCPM-V's rule)
  // The queries' 2-D sin-cos position table is stored with the weights (MiniCPM-V 2.0): queries ·
  // out more values, counted with the parameters.
  bool query_positions = false;

  bool operator==(const ProjectorArch&) const = default;
};

struct ModuleSpec {
  std::string name;
  ModuleRole role = ModuleRole::kLlm;
  Modality modality = Modality::kText;
  std::vector<std::string> inputs;  // names of the modules feeding this one
  bool frozen = false;              // no gradients, no optimizer state for its parameters
  std::optional<TransformerArch> transformer;
  std::optional<Patching> patching;
  std::optional<AudioFrontEnd> audio;
  std::optional<ProjectorArch> projector;

  bool operator==(const ModuleSpec&) const = default;
};

// The published size a model file is checked against (tests/ir/scenario_library_test.cpp).
struct ReferenceSize {
  double params = 0;
  std::string source;
  bool operator==(const ReferenceSize&) const = default;
};

struct ModelSpec {
  std::string name;
  DType dtype = DType::kBf16;       // training precision of weights and activations
  std::vector<ModuleSpec> modules;  // in any order; inputs define the DAG
  std::optional<ReferenceSize> reference;

  bool operator==(const ModelSpec&) const = default;
};

// Reads a model from JSON at `path` of `file`; records every problem (structure and semantics).
ModelSpec read_model(const Json& json, const std::string& file, const std::string& path,
                     Diagnostics& diag);
Json to_json(const ModelSpec& model);

// Semantic checks (DAG, roles, shapes); read_model calls it. Paths are under `path`.
void validate_model(const ModelSpec& model, const std::string& file, const std::string& path,
                    Diagnostics& diag);

// Lookups. REQUIRES for the pointer-returning ones: nothing; nullptr when absent.
const ModuleSpec* find_module(const ModelSpec& model, std::string_view name);
const ModuleSpec* find_llm(const ModelSpec& model);
// The encoder that turns media of `modality` into tokens: an encoder of that modality, or for
// video the image encoder when there is no video encoder (Qwen2-VL shares one ViT).
const ModuleSpec* encoder_for(const ModelSpec& model, Modality modality);
// The resampler (a projector with queries) that `encoder` feeds directly; null when none.
const ProjectorArch* resampler_of(const ModelSpec& model, const ModuleSpec& encoder);
// Modules in a topological order (inputs before consumers). REQUIRES: model validated.
std::vector<const ModuleSpec*> topological_order(const ModelSpec& model);

int64_t dtype_bytes(DType dtype);

}  // namespace tessera

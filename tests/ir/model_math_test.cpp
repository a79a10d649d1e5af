#include <doctest/doctest.h>

#include "shared/model/model_math.hpp"

using namespace tessera;

namespace {

TransformerArch llama(int64_t layers, int64_t hidden, int64_t heads, int64_t kv, int64_t ffn,
                      int64_t vocab, bool tied) {
  TransformerArch a;
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.kv_heads = kv;
  a.head_dim = hidden / heads;
  a.ffn = ffn;
  a.gated_ffn = true;
  a.vocab = vocab;
  a.tied_embeddings = tied;
  return a;
}

// Megatron's GPT shape used by Korthikanti et al.: ffn = 4h, no gating, no GQA.
TransformerArch gpt(int64_t layers, int64_t hidden, int64_t heads, int64_t vocab) {
  TransformerArch a;
  a.layers = layers;
  a.hidden = hidden;
  a.heads = heads;
  a.kv_heads = heads;
  a.head_dim = hidden / heads;
  a.ffn = 4 * hidden;
  a.vocab = vocab;
  return a;
}

ModuleSpec module_of(const TransformerArch& a, ModuleRole role = ModuleRole::kLlm) {
  ModuleSpec m;
  m.name = std::string{"m"};  // move-assign: GCC 12 misreports -Wrestrict on operator=(const char*)
  m.role = role;
  m.transformer = a;
  return m;
}

}  // namespace

TEST_CASE("parameter counts equal the published safetensors counts of Llama 3 models") {
  CHECK(module_parameters(module_of(llama(16, 2048, 32, 8, 8192, 128256, true))) == 1'235'814'400);
  CHECK(module_parameters(module_of(llama(32, 4096, 32, 8, 14336, 128256, false))) ==
        8'030'261'248);
  CHECK(module_parameters(module_of(llama(80, 8192, 64, 8, 28672, 128256, false))) ==
        70'553'706'496);
}

TEST_CASE("forward FLOPs match Korthikanti's 72·l·h²·(1 + s/6h + V/12lh) per token for training") {
  const TransformerArch a = gpt(24, 4096, 32, 51200);
  const double s = 2048, l = 24, h = 4096, V = 51200;
  const double expected = 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  CHECK(3 * forward_flops_per_token(module_of(a), s) == doctest::Approx(expected).epsilon(1e-12));
}

TEST_CASE("activation bytes match Korthikanti Table 2") {
  const TransformerArch a = gpt(1, 4096, 32, 0);
  const double s = 2048, h = 4096, heads = 32;
  ActivationOptions o;
  o.flash_attention = false;
  o.dropout = true;
  CHECK(activation_bytes_per_token_per_layer(a, s, o) == doctest::Approx(34 * h + 5 * heads * s));
  o.tp = 8;
  CHECK(activation_bytes_per_token_per_layer(a, s, o) ==
        doctest::Approx(h * (10 + 24.0 / 8) + 5 * heads * s / 8));
  o.sequence_parallel = true;
  CHECK(activation_bytes_per_token_per_layer(a, s, o) ==
        doctest::Approx((34 * h + 5 * heads * s) / 8));
  // Flash attention drops the s·s score terms: only the 34·h part (plus 4 bytes of LSE per head).
  o = ActivationOptions{};
  o.dropout = true;
  CHECK(activation_bytes_per_token_per_layer(a, s, o) == doctest::Approx(34 * h + 4 * heads));
}

TEST_CASE("per-op selective checkpointing keeps the odd matmuls' outputs of a Llama layer") {
  // Llama 3.1 8B's layer: Q, K, V, output, gate, up, down in forward order.
  TransformerArch a = gpt(1, 4096, 32, 0);
  a.kv_heads = 8;
  a.ffn = 14336;
  a.gated_ffn = true;
  const double h = 4096, kv = 1024, f = 14336, heads = 32;
  // Recomputed: K (h x kv), the output projection (h x h), the up projection (h x f).
  CHECK(per_op_recomputed_matmul_parameters(a) == 4096 * 1024 + 4096 * 4096 + 4096 * 14336);
  ActivationOptions o;
  o.per_op_checkpoint = true;
  // Kept in bf16: the layer's input, the attention's output, Q, V, the gate's output and the
  // down projection's; the log-sum-exp in fp32.
  CHECK(activation_bytes_per_token_per_layer(a, 8192, o) ==
        doctest::Approx(2 * (h + h + h + kv + f + h) + 4 * heads));
  // TP 4 with sequence parallelism: the input and the reduce-scatters' outputs split, the down
  // projection's partial sums whole.
  o.tp = 4;
  o.sequence_parallel = true;
  CHECK(
      activation_bytes_per_token_per_layer(a, 8192, o) ==
      doctest::Approx(2 * h / 4 + (2 * (h + h + kv + f) + 4 * heads) / 4 + 2 * h + 2 * 2 * h / 4));
  // Less than keeping everything (flash attention, no recomputation).
  o.per_op_checkpoint = false;
  const double kept_all = activation_bytes_per_token_per_layer(a, 8192, o);
  o.per_op_checkpoint = true;
  CHECK(activation_bytes_per_token_per_layer(a, 8192, o) < kept_all);
}

TEST_CASE("selective recomputation by submodule: what each one drops and runs again") {
  // A Llama layer (gated MLP, grouped-query attention) in bf16, flash attention.
  TransformerArch llama = gpt(1, 4096, 32, 0);
  llama.kv_heads = 8;
  llama.ffn = 14336;
  llama.gated_ffn = true;
  const double h = 4096, f = 14336;
  ActivationOptions o;
  const double kept = activation_bytes_per_token_per_layer(llama, 8192, o);
  // The attention core keeps nothing more under a fused kernel.
  o.recompute_modules = kRecomputeCoreAttn;
  CHECK(activation_bytes_per_token_per_layer(llama, 8192, o) == doctest::Approx(kept));
  // layernorm: the two norms' outputs (the QKV and MLP inputs) go.
  o.recompute_modules = kRecomputeLayernorm;
  CHECK(activation_bytes_per_token_per_layer(llama, 8192, o) == doctest::Approx(kept - 2 * 2 * h));
  // mlp: the gate's, the up projection's and the activation's outputs go; its matrices run again.
  o.recompute_modules = kRecomputeMlp;
  CHECK(activation_bytes_per_token_per_layer(llama, 8192, o) == doctest::Approx(kept - 3 * 2 * f));
  CHECK(selective_recomputed_matmul_parameters(llama, kRecomputeMlp) == 3 * 4096 * 14336);
  // Submodules the layer lacks change nothing.
  const uint32_t absent = kRecomputeMlaUpProj | kRecomputeMoe | kRecomputeMoeAct;
  o.recompute_modules = absent;
  CHECK(activation_bytes_per_token_per_layer(llama, 8192, o) == doctest::Approx(kept));
  CHECK(selective_recomputed_matmul_parameters(llama, absent | kRecomputeLayernorm) == 0);

  // A DeepSeek-V3 MoE layer: latent attention (query latent 1536, key/value latent 512, heads
  // of 192 = 128 + 64 rotary, values of 128), 8 of 256 experts of 2048 and a shared one.
  TransformerArch ds = gpt(1, 7168, 128, 0);
  ds.head_dim = 192;
  ds.rope_head_dim = 64;
  ds.v_head_dim = 128;
  ds.kv_lora_rank = 512;
  ds.q_lora_rank = 1536;
  ds.gated_ffn = true;
  ds.experts = 256;
  ds.top_k = 8;
  ds.moe_ffn = 2048;
  ds.shared_expert_ffn = 2048;
  o.recompute_modules = 0;
  const double all = activation_bytes_per_token_per_layer(ds, 4096, o);
  const auto dropped = [&](uint32_t modules) {
    o.recompute_modules = modules;
    return all - activation_bytes_per_token_per_layer(ds, 4096, o);
  };
  // mla_up_proj: queries, keys and values (heads x 192, 192 and 128) come up again.
  const double q = 128 * 192, kv = 128 * (192 + 128) / 2.0;
  CHECK(dropped(kRecomputeMlaUpProj) == doctest::Approx(2 * (q + kv) + 2 * kv));
  CHECK(selective_recomputed_matmul_parameters(ds, kRecomputeMlaUpProj) ==
        1536 * 128 * 192 + 512 * 128 * (192 - 64 + 128));
  // moe_act: the routed experts' activation outputs; shared_experts: the shared expert's three.
  CHECK(dropped(kRecomputeMoeAct) == doctest::Approx(2 * 8 * 2048));
  CHECK(dropped(kRecomputeSharedExperts) == doctest::Approx(3 * 2 * 2048));
  CHECK(selective_recomputed_matmul_parameters(ds, kRecomputeSharedExperts) == 3 * 7168 * 2048);
  // moe: every expert intermediate; router, top-k experts and shared expert run again. A dense
  // MLP recomputation leaves an MoE layer alone.
  CHECK(dropped(kRecomputeMoe) == doctest::Approx(3 * 2 * (8 * 2048 + 2048)));
  CHECK(dropped(kRecomputeMoe | kRecomputeMoeAct | kRecomputeSharedExperts) ==
        doctest::Approx(dropped(kRecomputeMoe)));
  CHECK(selective_recomputed_matmul_parameters(ds, kRecomputeMoe) ==
        (8 * 2048 + 2048) * 3 * 7168 + 7168 * 256);
  CHECK(dropped(kRecomputeMlp) == 0);
}

TEST_CASE("tokens per image, video and audio clip") {
  ModuleSpec clip;
  clip.role = ModuleRole::kEncoder;
  clip.patching = Patching{};
  clip.patching->patch_size = 14;
  clip.patching->image_size = 336;
  clip.patching->class_token = true;
  const MediaTokens llava = image_tokens(clip, 1920, 1080);
  CHECK(llava.llm_tokens == 576);      // LLaVA-1.5
  CHECK(llava.encoder_tokens == 577);  // + CLS

  ModuleSpec qwen;
  qwen.role = ModuleRole::kEncoder;
  qwen.patching = Patching{};
  qwen.patching->spatial_merge = 2;
  qwen.patching->temporal_patch = 2;
  qwen.patching->resize = ResizeMode::kDynamic;
  qwen.patching->min_pixels = 3136;
  qwen.patching->max_pixels = 12845056;
  CHECK(image_tokens(qwen, 448, 448).llm_tokens == 256);
  // 1000 x 700 -> 1008 x 700 (multiples of 28) -> 72 x 50 patches -> 900 tokens after 2x2 merge.
  CHECK(image_tokens(qwen, 1000, 700).encoder_tokens == 3600);
  CHECK(image_tokens(qwen, 1000, 700).llm_tokens == 900);
  CHECK(video_tokens(qwen, 16, 448, 448).llm_tokens == 8 * 256);
  // A huge image is scaled down under max_pixels.
  CHECK(image_tokens(qwen, 8000, 8000).encoder_tokens * 14 * 14 <= 12845056);

  ModuleSpec intern;
  intern.role = ModuleRole::kEncoder;
  intern.patching = Patching{};
  intern.patching->spatial_merge = 2;
  intern.patching->resize = ResizeMode::kTiles;
  intern.patching->tile_size = 448;
  intern.patching->max_tiles = 12;
  intern.patching->thumbnail = true;
  intern.patching->class_token = true;
  CHECK(image_tokens(intern, 448, 448).llm_tokens == 256);  // one tile, no thumbnail
  const MediaTokens wide = image_tokens(intern, 800, 600);  // 4:3 -> 4x3 tiles + thumbnail
  CHECK(wide.pieces == 13);
  CHECK(wide.llm_tokens == 13 * 256);
  CHECK(wide.encoder_tokens == 13 * 1025);

  ModuleSpec whisper;
  whisper.role = ModuleRole::kEncoder;
  whisper.audio = AudioFrontEnd{};
  CHECK(audio_tokens(whisper, 10).encoder_tokens == 1500);  // padded to 30 s
  whisper.audio->pooling = 2;
  CHECK(audio_tokens(whisper, 10).llm_tokens == 750);  // Qwen2-Audio
  CHECK(audio_tokens(whisper, 45).encoder_tokens == 3000);
  whisper.audio->pad_to_max = false;
  CHECK(audio_tokens(whisper, 10).encoder_tokens == 500);
}

TEST_CASE("accepts_tp: the one rule for the tensor parallelism a transformer takes") {
  TransformerArch a;
  a.heads = 32;
  a.kv_heads = 8;
  CHECK(accepts_tp(a, 8));
  CHECK(accepts_tp(a, 16));  // key/value heads replicated two ways
  CHECK_FALSE(accepts_tp(a, 3));
  a.heads = 25;  // InternViT-6B
  a.kv_heads = 25;
  CHECK(accepts_tp(a, 5));
  CHECK_FALSE(accepts_tp(a, 2));
  // Its refusals, which validation and the executor report.
  CHECK(tp_refusal(a, "vit", 2) == "2 does not divide vit heads=25");
  a.heads = 32;
  a.kv_heads = 8;
  CHECK(tp_refusal(a, "llm", 16).empty());
  a.kv_heads = 12;
  CHECK(tp_refusal(a, "llm", 8) == "8 and llm kv_heads=12 must divide one another");
}

TEST_CASE("parameters per tensor-parallel rank: matrices split, norms and row biases whole") {
  // Llama-3-8B's layer at tp 8: 4096·4096·2/8 (q, o) + 4096·1024·2/8 (k, v) + 3·4096·14336/8
  // (MLP) split, and its two RMSNorms (2·4096) on every rank.
  const TransformerArch l8 = llama(32, 4096, 32, 8, 14336, 128256, false);
  CHECK(layer_parameters(l8, 1) == static_cast<double>(layer_parameters(l8)));
  CHECK(layer_parameters(l8, 8) ==
        4096.0 * 4096 * 2 / 8 + 4096.0 * 1024 * 2 / 8 + 3.0 * 4096 * 14336 / 8 + 2 * 4096);
  // Key/value heads fewer than tp are replicated: at tp 16 each rank holds one of the eight.
  CHECK(layer_parameters(l8, 16) ==
        4096.0 * 4096 * 2 / 16 + 4096.0 * 128 * 2 + 3.0 * 4096 * 14336 / 16 + 2 * 4096);
  // The vocabulary embedding and the head split; the final norm does not.
  const ModuleSpec m = module_of(l8);
  CHECK(input_side_parameters(m, 4) == 128256.0 * 4096 / 4);
  CHECK(output_side_parameters(m, 4) == 4096 + 128256.0 * 4096 / 4);
  CHECK(input_side_parameters(m, 1) + output_side_parameters(m, 1) ==
        static_cast<double>(embedding_parameters(m)));

  // A biased GPT layer (LayerNorm, ffn 4h) at tp 2: q, k, v biases and the MLP's first bias
  // split with their matrices; the output projection's and the MLP's last bias whole.
  TransformerArch g = gpt(1, 64, 4, 0);
  g.linear_bias = true;
  g.norm = NormKind::kLayerNorm;
  const double matrices = 4.0 * 64 * 64 + 2.0 * 64 * 256;
  CHECK(layer_parameters(g, 1) == matrices + 3 * 64 + 64 + 256 + 64 + 2 * 2 * 64);
  CHECK(layer_parameters(g, 2) == matrices / 2 + 3 * 64 / 2 + 64 + 256 / 2 + 64 + 2 * 2 * 64);

  // A two-layer projector splits like an MLP; a single linear one is whole on every rank.
  ProjectorArch p;
  p.in = 1024;
  p.hidden = 4096;
  p.out = 4096;
  p.layers = 2;
  p.bias = true;
  CHECK(projector_parameters(p, 2) == (1024.0 * 4096 + 4096.0 * 4096 + 4096) / 2 + 4096);
  CHECK(projector_parameters(p, 1) == static_cast<double>(projector_parameters(p)));
  p.layers = 1;
  CHECK(projector_parameters(p, 4) == 1024.0 * 4096 + 4096);
  // Three layers (Llama 4's adapter and projector: 5632 -> 4096 -> 4096 -> 5120) are whole on
  // every rank too; with biases, one after each layer.
  p = {};
  p.in = 5632;
  p.hidden = 4096;
  p.out = 5120;
  p.layers = 3;
  p.bias = false;
  CHECK(projector_matmul_parameters(p) == 5632 * 4096 + 4096 * 4096 + 4096 * 5120);
  CHECK(projector_parameters(p, 4) == 5632.0 * 4096 + 4096.0 * 4096 + 4096.0 * 5120);
  p.bias = true;
  CHECK(projector_parameters(p) == 5632 * 4096 + 4096 * 4096 + 4096 * 5120 + 2 * 4096 + 5120);
}

TEST_CASE(
    "multi-head latent attention: down-projections whole on every TP rank, up-projections "
    "and heads split; keys and values expand to every head") {
  // DeepSeek-V2-Lite's attention: 16 heads of 128 + 64 rotary query/key values, values of 128,
  // a 512-value key/value latent, queries projected directly.
  TransformerArch a = llama(1, 2048, 16, 16, 10944, 0, false);
  a.kv_lora_rank = 512;
  a.rope_head_dim = 64;
  a.head_dim = 192;
  a.v_head_dim = 128;
  const double q = 2048.0 * 16 * 192, down = 2048.0 * (512 + 64), up = 512.0 * 16 * (128 + 128),
               out = 16.0 * 128 * 2048, mlp = 3.0 * 2048 * 10944;
  CHECK(attention_matmul_parameters(a) == q + down + up + out);
  // The latent's norm (512) and the layer's two norms whole; at TP 4 the down-projection too.
  CHECK(layer_parameters(a, 1) == q + down + 512 + up + out + mlp + 2 * 2048);
  CHECK(layer_parameters(a, 4) == (q + up + out + mlp) / 4 + down + 512 + 2 * 2048);
  // A query latent adds its down-projection and norm, whole, and replaces q by its up-projection.
  a.q_lora_rank = 1536;
  CHECK(layer_parameters(a, 4) ==
        (1536.0 * 16 * 192 + up + out + mlp) / 4 + 2048.0 * 1536 + 1536 + down + 512 + 2 * 2048);
  // Scores over 192 values a head, values of 128: 2·16·(192 + 128) FLOPs per (query, key) pair.
  CHECK(layer_attention_flops(a, 1) == 2.0 * 16 * (192 + 128));
  // Context parallelism gathers every head's keys and values, not the latent.
  CHECK(key_value_width(a) == 16 * (192 + 128));
  // The latents are kept for backward beside the expanded keys and values: against standard
  // attention of 192-value heads, the latents (two of 512 values, the rotary 64, two of 1536)
  // more, and values of 128 rather than 192 a head (K and V kept twice each, 2 bytes a value).
  ActivationOptions o;
  TransformerArch standard = a;
  standard.kv_lora_rank = standard.q_lora_rank = standard.rope_head_dim = 0;
  standard.v_head_dim = 0;
  CHECK(activation_bytes_per_token_per_layer(a, 1024, o) -
            activation_bytes_per_token_per_layer(standard, 1024, o) ==
        doctest::Approx(2.0 * (2 * 512 + 64 + 2 * 1536) + 2.0 * 2 * 16 * (160.0 - 192)));
}

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "shared/model/batch.hpp"
#include "shared/model/model_math.hpp"
#include "shared/spec/hf_import.hpp"

using namespace tessera;

namespace {

const std::string kHf = std::string(TESSERA_SOURCE_DIR) + "/tests/data/hf/";

ModelSpec import(const std::string& name, std::vector<std::string> freeze = {}) {
  Diagnostics diag;
  const auto json = read_json_file(kHf + name, diag);
  REQUIRE(json.has_value());
  const auto model = import_hf_config(*json, kHf + name, HfImportOptions{std::move(freeze)}, diag);
  INFO(diag.format());
  REQUIRE(model.has_value());
  return *model;
}

// What importing fixture `name` with `edit` applied reports; the import must fail.
std::string import_errors(const std::string& name, const std::function<void(Json&)>& edit) {
  Json config = Json::parse(std::ifstream(kHf + name));
  edit(config);
  Diagnostics diag;
  CHECK_FALSE(import_hf_config(config, "c.json", {}, diag).has_value());
  return diag.format();
}

double params(const ModelSpec& m) {
  return static_cast<double>(model_parameters(m));
}
const ModuleSpec& module(const ModelSpec& m, const char* name) {
  const ModuleSpec* p = find_module(m, name);
  REQUIRE(p != nullptr);
  return *p;
}

}  // namespace

TEST_CASE("Qwen2-VL (flat shape): encoder width is embed_dim, not vision_config.hidden_size") {
  const ModelSpec m = import("qwen2-vl-7b-instruct.json");
  CHECK(m.name == "Qwen/Qwen2-VL-7B-Instruct");
  CHECK(module(m, "vision").transformer->hidden == 1280);
  CHECK(module(m, "vision").transformer->ffn == 5120);
  CHECK(module(m, "llm").transformer->kv_heads == 4);
  CHECK(module(m, "vision_projector").projector->in == 5120);
  CHECK(model_parameters(m) == 8'291'375'616);  // published safetensors count
}

TEST_CASE("Qwen2.5-VL: hidden_size is the encoder width, out_hidden_size the LLM width") {
  const ModelSpec m = import("qwen2.5-vl-7b-instruct.json");
  CHECK(module(m, "vision").transformer->hidden == 1280);
  CHECK(module(m, "vision").transformer->gated_ffn);
  CHECK(module(m, "vision_projector").projector->out == 3584);
  CHECK(model_parameters(m) == 8'292'166'656);  // published safetensors count
}

TEST_CASE("LLaVA-1.5 (sparse text_config falls back to Llama defaults)") {
  const ModelSpec m = import("llava-1.5-7b-hf.json", {"vision"});
  CHECK(m.name == "llava-1.5-7b-hf");  // no _name_or_path: the file's name
  CHECK(module(m, "llm").transformer->hidden == 4096);
  CHECK(module(m, "llm").transformer->vocab == 32064);
  CHECK(module(m, "vision").frozen);
  CHECK_FALSE(module(m, "llm").frozen);
  CHECK(image_tokens(module(m, "vision"), 800, 600).llm_tokens == 576);
  CHECK(model_parameters(m) == 7'063'427'072);  // published safetensors count
}

TEST_CASE("LLaVA-NeXT: anyres tiles from image_grid_pinpoints, Mistral defaults") {
  const ModelSpec m = import("llava-v1.6-mistral-7b-hf.json");
  CHECK(module(m, "vision").patching->resize == ResizeMode::kTiles);
  CHECK(module(m, "vision").patching->max_tiles == 4);
  CHECK(module(m, "llm").transformer->kv_heads == 8);
  // Only a rounded count is published ("7.57B" on the Hub): within half a unit of its last digit.
  CHECK(std::fabs(params(m) - 7.57e9) <= 0.005e9);
}

TEST_CASE("Qwen3-VL: a learned position table, DeepStack mergers, a Qwen3 LLM with q/k norms") {
  // Qwen/Qwen3-VL-8B-Instruct's config.json at revision 0c351dd0 (as dumped byte for byte in a
  // model report; the same fields print from AutoConfig and in Ollama's GGUF metadata).
  const ModelSpec m = import("qwen3-vl-8b-instruct.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.qk_norm);
  CHECK_FALSE(llm.qkv_bias);
  CHECK(llm.head_dim == 128);
  CHECK_FALSE(llm.tied_embeddings);  // the top level's tie_word_embeddings
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.transformer->positions == 2304);
  CHECK(vision.patching->conv_bias);
  CHECK(vision.patching->patch_size == 16);
  const ProjectorArch& p = *module(m, "vision_projector").projector;
  CHECK(p.deepstack == 3);  // taps after encoder layers 8, 16, 24
  CHECK(p.in == 4608);
  // Published: the Hub's safetensors metadata, parameters.BF16 = 8,767,123,696
  // (model.safetensors.index.json total_size 17,534,247,392 bytes).
  CHECK(model_parameters(m) == 8'767'123'696);
  // A DeepStack tap outside the encoder is refused, naming the key.
  CHECK(import_errors(
            "qwen3-vl-8b-instruct.json",
            [](Json& c) {
              c["vision_config"]["deepstack_visual_indexes"] = std::vector<int64_t>{8, 16, 27};
            })
            .find("c.json: vision_config.deepstack_visual_indexes: expected a list") !=
        std::string::npos);
}

TEST_CASE("LLaVA-OneVision: SigLIP tiles, at most 9 tiles' features, an image newline, Qwen2") {
  // llava-hf/llava-onevision-qwen2-0.5b-ov-hf's config.json at revision 66d62be8, put together
  // from the Hub's blame page and commit diffs (its 2,591 bytes match the published size).
  const ModelSpec m = import("llava-onevision-qwen2-0.5b-ov-hf.json");
  CHECK(m.name == "llava-onevision-qwen2-0.5b-ov-hf");  // not _name_or_path's local folder
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.transformer->layers == 26);
  CHECK(vision.patching->resize == ResizeMode::kTiles);
  CHECK(vision.patching->max_tiles == 9);  // anyres_max_9 of the 6 x 6 pinpoint grids
  CHECK(image_tokens(vision, 384, 384).llm_tokens == 729);
  CHECK(module(m, "vision_projector").projector->output_embeddings == 1);  // image_newline
  CHECK(module(m, "llm").transformer->tied_embeddings);  // text_config's, over the top level's
  // Only a rounded count is published: "894M params" on the Hub (its one FP16 file is 1.79 GB;
  // an untied head would make it 2.06 GB).
  CHECK(std::fabs(params(m) - 894e6) <= 0.5e6);
  CHECK(
      import_errors("llava-onevision-qwen2-0.5b-ov-hf.json", [](Json& c) {
        c["vision_aspect_ratio"] = "anyres";
      }).find("c.json: vision_aspect_ratio: 'anyres': expected anyres_max_N") != std::string::npos);
}

TEST_CASE("InternVL, remote-code shape (llm_config) and hf shape (text_config)") {
  const ModelSpec a = import("internvl2-8b.json");
  CHECK(image_tokens(module(a, "vision"), 448, 448).llm_tokens == 256);
  CHECK(module(a, "vision_projector").projector->in == 4096);
  // Only a rounded count is published ("8.08B" on the Hub): within half a unit of its last digit.
  CHECK(std::fabs(params(a) - 8.08e9) <= 0.005e9);
  const ModelSpec b = import("internvl3-1b-hf.json");
  CHECK(module(b, "vision").patching->tile_size == 448);  // [448, 448] accepted
  CHECK(module(b, "llm").transformer->tied_embeddings);
  CHECK(module(b, "llm").transformer->hidden == 896);
}

TEST_CASE("Mllama: attention_heads, global layers and cross-attention") {
  const ModelSpec m = import("llama-3.2-11b-vision.json");
  CHECK(module(m, "vision").transformer->heads == 16);
  CHECK(module(m, "vision").transformer->layers == 40);
  CHECK(module(m, "llm").transformer->cross_attention_layers == 8);
  // Its tile machinery: gated global layers, per-aspect-ratio position embeddings (8
  // arrangements of up to 4 tiles), a norm before the layers, bias-free attention with biased
  // MLPs; the LLM's embedding has 8 image-token rows beyond its vocabulary.
  CHECK(module(m, "vision").transformer->gated_layers == 8);
  CHECK(module(m, "vision").patching->aspect_ratios == 8);
  CHECK(module(m, "llm").transformer->extra_embeddings == 8);
  // The published safetensors count (Llama-3.2-11B-Vision-Instruct, the same architecture).
  CHECK(params(m) == 10'670'220'835.0);
  // Given aspect ratios are counted, not derived from max_num_tiles.
  Diagnostics diag;
  Json config = *read_json_file(kHf + "llama-3.2-11b-vision.json", diag);
  config["vision_config"]["supported_aspect_ratios"] = Json::array({Json::array({1, 1})});
  const auto one = import_hf_config(config, "c.json", HfImportOptions{}, diag);
  REQUIRE(one.has_value());
  CHECK(module(*one, "vision").patching->aspect_ratios == 1);
}

TEST_CASE("Whisper, SigLIP and CLIP import as encoders") {
  const ModelSpec w = import("whisper-large-v3.json");
  REQUIRE(w.modules.size() == 1);
  CHECK(w.modules[0].modality == Modality::kAudio);
  CHECK(audio_tokens(w.modules[0], 30).encoder_tokens == 1500);
  CHECK(model_parameters(w) == 636'968'960);  // the published encoder of 1,543,490,560
  const ModelSpec s = import("siglip-so400m-patch14-384.json");
  CHECK(image_tokens(s.modules[0], 500, 500).encoder_tokens == 729);  // no CLS
  // Published for the vision tower: 428,225,600, with the attention-pooling head that VLMs do not
  // run (and the import leaves out): a probe, attention, a norm and an MLP of width 1152.
  const int64_t width = 1152, mlp = 4304;
  const int64_t head =
      width + (4 * width * width + 4 * width) + 2 * width + (2 * width * mlp + mlp + width);
  CHECK(model_parameters(s) + head == 428'225'600);
  const ModelSpec c = import("clip-vit-large-patch14-336.json");
  CHECK(image_tokens(c.modules[0], 500, 500).encoder_tokens == 577);
  CHECK(model_parameters(c) == 303'507'456);  // the published vision tower of 427,944,193
}

TEST_CASE("Llama 4 Scout: 16 routed experts and a shared one per layer, a pixel-shuffled ViT") {
  // The config as bundled by ai-dynamo/aiconfigurator (aic-core/src/aiconfigurator_core/
  // model_configs/meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json), whose keys for the
  // architecture are all there.
  const ModelSpec m = import("llama-4-scout-17b-16e-instruct.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.experts == 16);
  CHECK(llm.top_k == 1);
  CHECK(llm.moe_ffn == 8192);
  CHECK(llm.shared_expert_ffn == 8192);
  CHECK_FALSE(llm.tied_embeddings);
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.patching->spatial_merge == 2);                   // pixel_shuffle_ratio 0.5
  CHECK(image_tokens(vision, 336, 336).llm_tokens == 144);      // one tile of 24 x 24 patches
  CHECK(image_tokens(vision, 672, 336).llm_tokens == 3 * 144);  // two, and the whole image
  const ProjectorArch& p = *module(m, "vision_projector").projector;
  CHECK(p.layers == 3);
  CHECK(projector_matmul_parameters(p) == 5632 * 4096 + 4096 * 4096 + 4096 * 5120);
  // Published: the Hub's safetensors metadata of meta-llama/Llama-4-Scout-17B-16E-Instruct,
  // parameters.BF16 = 108,641,793,536 ("109B total, 17B activated" on the model card).
  CHECK(model_parameters(m) == 108'641'793'536);
}

TEST_CASE("Llama 4 Maverick: experts in every second layer, dense MLPs between") {
  // The config as bundled by ai-dynamo/aiconfigurator (model_configs/
  // meta-llama--Llama-4-Maverick-17B-128E-Instruct_config.json, commit 64c5ddb6).
  const ModelSpec m = import("llama-4-maverick-17b-128e-instruct.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.experts == 128);
  CHECK(llm.moe_every == 2);
  CHECK(llm.ffn == 16384);  // intermediate_size_mlp, the dense layers' width
  CHECK(llm.moe_ffn == 8192);
  CHECK(moe_layers(llm, 0, llm.layers) == 24);
  CHECK_FALSE(moe_layer(llm, 0));
  CHECK(moe_layer(llm, 47));
  // Published: the Hub's safetensors metadata of meta-llama/Llama-4-Maverick-17B-128E-Instruct,
  // parameters.BF16 = 401,583,781,376 ("400B total" on the model card).
  CHECK(model_parameters(m) == 401'583'781'376);
  // An explicit moe_layers list must be the step's; another pattern is refused, naming the key.
  Json other = Json::parse(std::ifstream(kHf + "llama-4-maverick-17b-128e-instruct.json"));
  std::vector<int64_t> odd;
  for (int64_t l = 1; l < 48; l += 2) odd.push_back(l);
  other["text_config"]["moe_layers"] = odd;
  Diagnostics ok;
  CHECK(import_hf_config(other, "c.json", {}, ok).has_value());
  CHECK(import_errors("llama-4-maverick-17b-128e-instruct.json", [](Json& c) {
          c["text_config"]["moe_layers"] = std::vector<int64_t>{0, 1};
        }).find("c.json: text_config.moe_layers: must list every") != std::string::npos);
}

TEST_CASE(
    "DeepSeek-VL2-Tiny: a DeepSeekMoE LLM with a dense first layer, SigLIP tiles merged 2x2") {
  // The config of deepseek-ai/deepseek-vl2-tiny: top level and language block up to lm_head as
  // published (mirrored at huggingface.co/Isotr0py/deepseek-vl2-tiny); the rest of the language
  // block is the DeepSeekMoE-3B block DeepSeek ships again in DeepSeek-OCR's config.
  const ModelSpec m = import("deepseek-vl2-tiny.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.experts == 64);
  CHECK(llm.top_k == 6);
  CHECK(llm.moe_ffn == 896);
  CHECK(llm.shared_expert_ffn == 2 * 896);
  CHECK(llm.dense_layers == 1);
  CHECK(llm.ffn == 6848);  // the dense layer's
  CHECK(moe_layers(llm, 0, llm.layers) == 11);
  CHECK_FALSE(llm.tied_embeddings);
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.transformer->layers == 27);
  CHECK(vision.transformer->ffn == 4304);  // int(1152 · 3.7362)
  CHECK(vision.patching->max_tiles == 9);  // 1152 x 1152 and 384 x 3456
  // A tile: 27 x 27 patches padded to 28 x 28, merged 2 x 2.
  CHECK(image_tokens(vision, 384, 384).llm_tokens == 196);
  const ProjectorArch& p = *module(m, "vision_projector").projector;
  CHECK(p.in == 4 * 1152);
  CHECK(p.output_embeddings == 2);  // image_newline, view_seperator
  // Published: 3,370,501,440 parameters (the checkpoint's one BF16 shard of 6.74 GB; "3.37B" on
  // the model page), with the tower's attention-pooling head, which the import leaves out
  // because the model never runs it: a probe, attention, a norm and an MLP of width 4304.
  const int64_t width = 1152, mlp = 4304;
  const int64_t head =
      width + (4 * width * width + 4 * width) + 2 * width + (2 * width * mlp + mlp + width);
  CHECK(model_parameters(m) + head == 3'370'501'440);
  // Multi-head latent attention (the Small and full models) needs its latent and rotary sizes.
  CHECK(import_errors("deepseek-vl2-tiny.json",
                      [](Json& c) { c["language_config"]["use_mla"] = true; })
            .find("c.json: language_config.kv_lora_rank: multi-head latent attention needs") !=
        std::string::npos);
}

TEST_CASE(
    "DeepSeek-VL2 (full): latent attention and a router bias from DeepseekV2Config's defaults") {
  // deepseek-ai/deepseek-vl2's config.json (2,171 bytes, as mirrored in earl-juanico/rca), whose
  // language block leaves layers, heads and the latent sizes to DeepseekV2Config's defaults.
  const ModelSpec m = import("deepseek-vl2.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.layers == 30);
  CHECK(llm.heads == 32);
  CHECK(llm.kv_lora_rank == 512);
  CHECK(llm.head_dim == 128 + 64);
  CHECK(llm.experts == 72);
  CHECK(llm.router_bias);  // noaux_tc
  // Only a rounded count is published ("27.5B" on the Hub), with the tower's unused pooling
  // head (15,238,352) the import leaves out.
  CHECK(std::fabs(params(m) + 15'238'352 - 27.5e9) <= 0.05e9);
}

TEST_CASE("DeepSeek's node-limited routing: n_group and topk_group become router groups") {
  // DeepSeek-VL2 publishes one group (n_group 1): no limit.
  CHECK(module(import("deepseek-vl2.json"), "llm").transformer->router_groups == 0);
  // DeepSeek-V3's routing, 8 groups of which a token reaches 4, on VL2's 72 experts.
  Json config = Json::parse(std::ifstream(kHf + "deepseek-vl2.json"));
  config["language_config"]["n_group"] = 8;
  config["language_config"]["topk_group"] = 4;
  Diagnostics diag;
  const auto m = import_hf_config(config, "c.json", {}, diag);
  INFO(diag.format());
  REQUIRE(m.has_value());
  const TransformerArch& llm = *module(*m, "llm").transformer;
  CHECK(llm.router_groups == 8);
  CHECK(llm.router_group_top_k == 4);
  // num_nextn_predict_layers: DeepSeek-V3's multi-token-prediction modules, none in VL2's config.
  CHECK(module(import("deepseek-vl2.json"), "llm").transformer->mtp_layers == 0);
  config["language_config"]["num_nextn_predict_layers"] = 1;
  Diagnostics mtp;
  const auto with_mtp = import_hf_config(config, "c.json", {}, mtp);
  REQUIRE(with_mtp.has_value());
  CHECK(module(*with_mtp, "llm").transformer->mtp_layers == 1);
  config["language_config"].erase("num_nextn_predict_layers");
  // Greedy routing ignores the groups.
  config["language_config"]["topk_method"] = "greedy";
  Diagnostics greedy;
  const auto g = import_hf_config(config, "c.json", {}, greedy);
  REQUIRE(g.has_value());
  CHECK(module(*g, "llm").transformer->router_groups == 0);
  // Groups must split the experts evenly and hold a token's experts.
  CHECK(import_errors("deepseek-vl2.json",
                      [](Json& c) {
                        c["language_config"]["n_group"] = 5;
                        c["language_config"]["topk_group"] = 2;
                      })
            .find("c.json: language_config.n_group: 5 does not divide n_routed_experts=72") !=
        std::string::npos);
  CHECK(import_errors("deepseek-vl2.json",
                      [](Json& c) {
                        c["language_config"]["n_group"] = 24;
                        c["language_config"]["topk_group"] = 1;
                      })
            .find("c.json: language_config.topk_group: 1 groups of 3 experts hold fewer than "
                  "num_experts_per_tok=6") != std::string::npos);
}

TEST_CASE("Kimi-VL: MoonViT at native resolution, a DeepSeek-V3 LLM with latent attention") {
  // moonshotai/Kimi-VL-A3B-Instruct's config.json: vision_config and text_config as quoted from
  // the Hub's raw file (the text block's last keys as its parent Moonlight-16B-A3B publishes
  // them, rope_theta as the Kimi-VL report gives it).
  const ModelSpec m = import("kimi-vl-a3b-instruct.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.kv_lora_rank == 512);
  CHECK(llm.q_lora_rank == 0);  // null: queries projected directly
  CHECK(llm.head_dim == 128 + 64);
  CHECK(llm.v_head_dim == 128);
  CHECK(llm.router_bias);  // noaux_tc
  CHECK(llm.dense_layers == 1);
  // Per layer: q 2048 x 16·192, the latent 2048 x (512 + 64) and its norm, keys and values up
  // 512 x 16·(128 + 128), the output 16·128 x 2048.
  CHECK(attention_matmul_parameters(llm) == 2048 * 3072 + 2048 * 576 + 512 * 4096 + 2048 * 2048);
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.transformer->positions == 64 * 64);
  CHECK(vision.patching->resize == ResizeMode::kDynamic);
  CHECK(vision.patching->spatial_merge == 2);
  // Published: the vision tower and projector, 447,545,840 (kornia/kimi-vl-a3b-instruct-vision,
  // a bit-identical copy of those tensors).
  CHECK(module_parameters(vision) + module_parameters(module(m, "vision_projector")) ==
        447'545'840);
  // Published: the Hub's safetensors total, 16,407,657,776 elements, which holds a 64-value
  // rotary frequency buffer per decoder layer besides the parameters (its parent Moonlight's
  // published total has the same 27 x 64 more than its parameters).
  CHECK(model_parameters(m) + 27 * 64 == 16'407'657'776);
}

TEST_CASE("Qwen2-Audio: a Whisper encoder pooled 2:1 into a Qwen2 LLM") {
  const ModelSpec m = import("qwen2-audio-7b-instruct.json");
  CHECK(m.name == "qwen2-audio-7b-instruct");
  const ModuleSpec& audio = module(m, "audio");
  CHECK(audio.audio->mel_bins == 128);
  CHECK(audio_tokens(audio, 30).encoder_tokens == 1500);
  CHECK(audio_tokens(audio, 30).llm_tokens == 750);
  CHECK(module(m, "audio_projector").projector->layers == 1);
  // The sparse text_config takes Qwen2Config's defaults: 4096 wide, 32 layers and heads.
  CHECK(module(m, "llm").transformer->hidden == 4096);
  CHECK(module(m, "llm").transformer->vocab == 156032);
  // Published: model.safetensors.index.json total_size 16,794,189,824 bytes of bf16 of
  // mispeech/r1-aqa, a full fine-tune of Qwen2-Audio-7B-Instruct with its 876 tensors.
  CHECK(model_parameters(m) == 8'397'094'912);
}

TEST_CASE("Qwen2.5-Omni: the thinker's two encoders and LLM; the talker is left out") {
  // The keys of Qwen/Qwen2.5-Omni-7B's config.json that shape the thinker, as its published
  // copies give them (the talker and token2wav blocks are not in this file).
  const ModelSpec m = import("qwen2.5-omni-7b.json");
  CHECK(m.name == "qwen2.5-omni-7b");  // the file's: the root names no checkpoint
  const ModuleSpec& audio = module(m, "audio");
  CHECK(audio.transformer->positions == 0);  // sinusoidal
  CHECK(audio_tokens(audio, 30).llm_tokens == 750);
  CHECK(module(m, "llm").inputs == std::vector<std::string>{"vision_projector", "audio_projector"});
  // Published: model.safetensors.index.json total_size 17,863,627,776 bytes of bf16 (1,346
  // tensors) of thinker-only full fine-tunes of Qwen2.5-Omni-7B (yaolily/TimeChat-Captioner-
  // GRPO-7B, AVoCaDO-Captioner/AVoCaDO).
  CHECK(model_parameters(m) == 8'931'813'888);
  Diagnostics diag;
  Json full = *read_json_file(kHf + "qwen2.5-omni-7b.json", diag);
  full["talker_config"] = Json{{"hidden_size", 896}, {"num_hidden_layers", 24}};
  HfImportNotes notes;
  REQUIRE(import_hf_config(full, "c.json", {}, diag, &notes).has_value());
  REQUIRE(notes.left_out.size() == 1);
  CHECK(notes.left_out[0].starts_with("talker_config: the talker"));
}

TEST_CASE("Gemma 3: SigLIP pooled to 256 tokens, query/key norms and four norms per layer") {
  // gemma-3-4b-it's sparse config: heads, head_dim and the vocabulary are Gemma3TextConfig's.
  const ModelSpec m = import("gemma-3-4b-it.json");
  const TransformerArch& llm = *module(m, "llm").transformer;
  CHECK(llm.heads == 8);
  CHECK(llm.kv_heads == 4);
  CHECK(llm.head_dim == 256);
  CHECK(llm.vocab == 262208);
  CHECK(llm.tied_embeddings);
  CHECK(llm.qk_norm);
  CHECK(llm.post_norms);
  CHECK(image_tokens(module(m, "vision"), 1200, 900).encoder_tokens == 4096);
  CHECK(image_tokens(module(m, "vision"), 1200, 900).llm_tokens == 256);
  CHECK_FALSE(module(m, "vision_projector").projector->bias);
  // Published: model.safetensors.index.json total_size 8,600,158,944 bytes of bf16 for
  // google/medgemma-4b-it, a fine-tune of gemma-3-4b with its architecture.
  CHECK(model_parameters(m) == 4'300'079'472);
  // google/medgemma-27b-it (Gemma 3 27B), a mirror's config.json and index: total_size
  // 54,864,813,280 bytes of bf16.
  CHECK(model_parameters(import("medgemma-27b-it.json")) == 27'432'406'640);
}

TEST_CASE("PaliGemma 2: stale top-level sizes are ignored, the text_config's Gemma 2 counts") {
  const ModelSpec m = import("paligemma2-3b-ft-docci-448.json");
  CHECK(m.name == "google/paligemma2-3b-ft-docci-448");
  CHECK(module(m, "llm").transformer->hidden == 2304);
  CHECK(module(m, "llm").transformer->post_norms);
  CHECK_FALSE(module(m, "llm").transformer->qk_norm);
  CHECK(image_tokens(module(m, "vision"), 640, 480).llm_tokens == 1024);
  // Published: Keras-Hub's presets give 3,032,979,696 for the 448-pixel PaliGemma 2 3B with a
  // vocabulary of 257,152 rows; the Hugging Face checkpoint's has 257,216 (64 more of width
  // 2304), as config.json says.
  CHECK(model_parameters(m) == 3'032'979'696 + 64 * 2304);
}

TEST_CASE("Phi-3.5-vision: the CLIP tower named, not sized, in config.json; learned separators") {
  const ModelSpec m = import("phi-3.5-vision-instruct.json");
  CHECK(module(m, "vision").transformer->layers == 24);
  CHECK(module(m, "vision").patching->spatial_merge == 2);
  CHECK(image_tokens(module(m, "vision"), 336, 336).llm_tokens == 144);
  CHECK(module(m, "vision_projector").projector->in == 4096);
  CHECK(module(m, "vision_projector").projector->separators == 2);
  // Published: the Hub's safetensors metadata, 4,146,621,440 BF16 parameters.
  CHECK(model_parameters(m) == 4'146'621'440);
  Diagnostics diag;
  Json other = *read_json_file(kHf + "phi-3.5-vision-instruct.json", diag);
  other["img_processor"]["model_name"] = "openai/clip-vit-base-patch32";
  CHECK_FALSE(import_hf_config(other, "c.json", {}, diag).has_value());
  CHECK(diag.format().find("c.json: img_processor.model_name: 'openai/clip-vit-base-patch32': "
                           "the config does not give this vision tower's sizes") !=
        std::string::npos);
}

TEST_CASE("SmolVLM2: pixel-shuffled SigLIP tiles, the vision config's defaults") {
  const ModelSpec m = import("smolvlm2-500m-video-instruct.json");
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.transformer->layers == 12);  // left out of the config: the class default
  CHECK(vision.patching->tile_size == 512);
  CHECK(vision.patching->max_tiles == 16);
  CHECK(image_tokens(vision, 512, 512).llm_tokens == 64);
  CHECK(module(m, "vision_projector").projector->in == 768 * 16);
  CHECK_FALSE(module(m, "llm").transformer->tied_embeddings);
  // Published: 507,482,304 (the Hub's safetensors count of SmolVLM-500M-Instruct, the same
  // architecture, as quoted in several model surveys; model.safetensors is 2.03 GB in fp32).
  CHECK(model_parameters(m) == 507'482'304);
}

TEST_CASE("families the IR cannot express are refused naming the part it lacks") {
  // The corpus holds real configs of GLM-4.1V, MiniCPM-V, Molmo, Aria, Gemma 4 and Qwen3.5; these
  // two have none there, so a bare config stands in: the refusal depends on model_type alone.
  for (const auto& [type, part] :
       {std::pair{"gemma3n", "MobileNet-V5"}, std::pair{"phi4_multimodal", "LoRA adapters"},
        std::pair{"phi4mm", "LoRA adapters"}}) {
    Diagnostics diag;
    CHECK_FALSE(import_hf_config(Json{{"model_type", type}}, "c.json", {}, diag).has_value());
    INFO(diag.format());
    CHECK(diag.format().find(std::string("('") + type + "') is not imported") != std::string::npos);
    CHECK(diag.format().find(part) != std::string::npos);
    CHECK(diag.format().find("supported:") == std::string::npos);
  }
}

TEST_CASE("import errors: unknown model_type lists what is supported; bad --freeze; wrong types") {
  Diagnostics diag;
  const auto gpt2 = read_json_file(kHf + "gpt2.json", diag);
  REQUIRE(gpt2.has_value());
  CHECK_FALSE(import_hf_config(*gpt2, "gpt2.json", {}, diag).has_value());
  CHECK(diag.format().find("model_type: unsupported model_type 'gpt2'; supported: qwen2_vl") !=
        std::string::npos);

  Diagnostics d2;
  const auto llava = read_json_file(kHf + "llava-1.5-7b-hf.json", d2);
  CHECK_FALSE(import_hf_config(*llava, "c.json", HfImportOptions{{"vison"}}, d2).has_value());
  CHECK(
      d2.format().find("--freeze vison: no such module; modules are vision vision_projector llm") !=
      std::string::npos);

  Diagnostics d3;
  Json broken = *llava;
  broken["vision_config"]["num_hidden_layers"] = "24";
  CHECK_FALSE(import_hf_config(broken, "c.json", {}, d3).has_value());
  CHECK(d3.format().find(
            "c.json: vision_config.num_hidden_layers: expected an integer, got string") !=
        std::string::npos);

  // A key that shapes the architecture and that the import does not read is an error.
  Diagnostics d5;
  Json experts = *llava;
  experts["text_config"]["num_local_experts"] = 8;  // read: an MoE LLM
  experts["vision_config"]["num_experts"] = 8;      // read by no one
  CHECK_FALSE(import_hf_config(experts, "c.json", {}, d5).has_value());
  CHECK(d5.format() ==
        "c.json: vision_config.num_experts: this key shapes the architecture, and the import of "
        "model_type 'llava' does not read it: refusing rather than ignoring it\n");
  // What the import leaves out, it says.
  Diagnostics d6;
  HfImportNotes notes;
  REQUIRE(import_hf_config(*llava, "c.json", {}, d6, &notes).has_value());
  CHECK(notes.left_out ==
        std::vector<std::string>{"vision_config.projection_dim: the projection into "
                                 "the joint text-image space, which a VLM does not "
                                 "run"});

  // Found by fuzz/hf_config: an image size of 3e17 overflowed int64 squaring its patch grid.
  Diagnostics d4;
  Json huge = *llava;
  huge["vision_config"]["image_size"] = int64_t{300008000000000068};
  CHECK_FALSE(import_hf_config(huge, "c.json", {}, d4).has_value());
  CHECK(d4.format().find("c.json: vision_config.image_size: 300008000000000068 is out of range") !=
        std::string::npos);
}

namespace {

// The keys `name` with `edit` applied accepts without reading, by reason; the import must pass.
std::vector<std::string> unused_keys(const std::string& name,
                                     const std::function<void(Json&)>& edit) {
  Json config = Json::parse(std::ifstream(kHf + name));
  edit(config);
  Diagnostics diag;
  HfImportNotes notes;
  INFO(name);
  CHECK(import_hf_config(config, "c.json", {}, diag, &notes).has_value());
  INFO(diag.format());
  return notes.unused;
}

bool has_line(const std::vector<std::string>& lines, const std::string& text) {
  return std::find(lines.begin(), lines.end(), text) != lines.end();
}

}  // namespace

TEST_CASE(
    "inherited attributes: accepted at values that change nothing, refused where they would") {
  // Older transformers versions write every PretrainedConfig attribute into every sub-config.
  const auto unused = unused_keys("llava-1.5-7b-hf.json", [](Json& c) {
    c["vision_config"]["pruned_heads"] = Json::object();
    c["vision_config"]["num_beams"] = 1;
    c["vision_config"]["top_k"] = 50;
    c["vision_config"]["tie_word_embeddings"] = true;  // a tower has no output layer to tie
    c["vision_config"]["chunk_size_feed_forward"] = 0;
    c["vision_config"]["add_cross_attention"] = false;
  });
  INFO(unused.size());
  CHECK(has_line(unused, "vision_config.pruned_heads: inherited attributes at their defaults"));
  CHECK(has_line(unused,
                 "vision_config.num_beams, vision_config.top_k: generation settings every "
                 "config class inherits; generate() alone reads them"));
  CHECK(has_line(unused,
                 "vision_config.tie_word_embeddings: output tying in a block without an "
                 "output layer"));
  CHECK(import_errors("llava-1.5-7b-hf.json",
                      [](Json& c) {
                        c["vision_config"]["pruned_heads"] = Json{{"3", {0, 1}}};
                      })
            .find("c.json: vision_config.pruned_heads: heads pruned from layers {\"3\":[0,1]}") !=
        std::string::npos);
  CHECK(import_errors("llava-1.5-7b-hf.json",
                      [](Json& c) { c["vision_config"]["add_cross_attention"] = true; })
            .find("vision_config.add_cross_attention: cross-attention added to every layer") !=
        std::string::npos);
  // Beside experts, a top_k other than generate()'s default may be the routing width.
  CHECK(import_errors("llama-4-scout-17b-16e-instruct.json", [](Json& c) {
          c["text_config"]["top_k"] = 2;
        }).find("text_config.top_k: top_k beside experts") != std::string::npos);
  // At the top of a composite config, the output tying must agree with the language model's.
  CHECK(import_errors("internvl3-1b-hf.json", [](Json& c) { c["tie_word_embeddings"] = false; })
            .find("c.json: tie_word_embeddings: false, but the language model's block says true") !=
        std::string::npos);
  CHECK(has_line(
      unused_keys("internvl3-1b-hf.json", [](Json& c) { c["tie_word_embeddings"] = true; }),
      "tie_word_embeddings: the model's output tying, which the language model's own "
      "switch repeats"));
}

TEST_CASE(
    "aliases, inference-only parts and training-code settings are accepted; conflicts are not") {
  // Qwen2-VL repeats its patch size; Whisper its encoder depth; Qwen2.5-Omni its channels.
  CHECK(import_errors("qwen2-vl-7b-instruct.json",
                      [](Json& c) { c["vision_config"]["spatial_patch_size"] = 16; })
            .find("c.json: vision_config.spatial_patch_size: 16 differs from "
                  "vision_config.patch_size = 14, which the import reads") != std::string::npos);
  unused_keys("qwen2-vl-7b-instruct.json",
              [](Json& c) { c["vision_config"]["spatial_patch_size"] = 14; });
  CHECK(import_errors("whisper-large-v3.json", [](Json& c) { c["num_hidden_layers"] = 12; })
            .find("c.json: num_hidden_layers: 12 differs from encoder_layers = 32") !=
        std::string::npos);
  CHECK(has_line(unused_keys("whisper-large-v3.json",
                             [](Json& c) {
                               c["num_hidden_layers"] = 32;
                               c["median_filter_width"] = 7;
                             }),
                 "median_filter_width: the smoothing of word timestamps at inference"));
  // Settings of the code that trained the model, not of its network.
  CHECK(has_line(unused_keys("internvl3-1b-hf.json",
                             [](Json& c) {
                               c["text_config"]["ep_size"] = 1;
                               c["text_config"]["use_deepep"] = false;
                               c["vision_config"]["hidden_dropout_prob"] = 0.0;
                               c["vision_config"]["layer_scale_init_value"] = 0.1;
                             }),
                 "text_config.ep_size, text_config.use_deepep: settings of the training code "
                 "(its expert-parallel size, DeepEP, FlashAttention 3), not of the network"));
  // An image newline switched on where the family's model has none (configs merged from
  // LLaVA-NeXT checkpoints, such as SakanaAI's EvoVLM-JP): accepted, and said.
  CHECK(has_line(
      unused_keys("llava-1.5-7b-hf.json", [](Json& c) { c["use_image_newline_parameter"] = true; }),
      "use_image_newline_parameter: LLaVA-1.5's model builds no image newline "
      "whatever this says (a LLaVA-NeXT setting carried over)"));
}

TEST_CASE("InternVL's switches of parts the import does not build are refused when on") {
  const std::string remote = import_errors("internvl2-8b.json", [](Json& c) {
    c["select_layer"] = -4;
    c["use_llm_lora"] = 16;
    c["vision_config"]["qk_normalization"] = true;
  });
  CHECK(remote.find("c.json: select_layer: -4: the projector would read an earlier layer's output "
                    "(the import builds -1)") != std::string::npos);
  CHECK(remote.find("c.json: use_llm_lora: 16: LoRA adapters on the language model") !=
        std::string::npos);
  CHECK(remote.find("vision_config.qk_normalization: true") != std::string::npos);
  const std::string hf = import_errors("internvl3-1b-hf.json", [](Json& c) {
    c["vision_config"]["use_mean_pooling"] = false;
    c["vision_config"]["use_mask_token"] = true;
  });
  CHECK(hf.find("vision_config.use_mean_pooling: false: a norm after the last layer") !=
        std::string::npos);
  CHECK(hf.find("vision_config.use_mask_token: true") != std::string::npos);
}

TEST_CASE("formats that share a model_type with an imported family are refused as a whole") {
  // The original LLaVA repository's checkpoints, Pixtral's tower under LLaVA-NeXT, DeepSeek-OCR.
  const std::string original = import_errors("llava-1.5-7b-hf.json", [](Json& c) {
    c["mm_vision_tower"] = "openai/clip-vit-large-patch14-336";
    c["mm_hidden_size"] = 1024;
  });
  CHECK(original ==
        "c.json: mm_vision_tower: the original LLaVA repository's format, which names its vision "
        "tower without its sizes; import the Hugging Face conversion of the checkpoint "
        "(llava-hf/...)\n");
  const std::string pixtral = import_errors("llava-v1.6-mistral-7b-hf.json", [](Json& c) {
    c["vision_config"]["model_type"] = "pixtral";
    c["vision_config"]["head_dim"] = 64;
  });
  CHECK(pixtral ==
        "c.json: vision_config.model_type: 'pixtral': the import reads CLIP, SigLIP and "
        "(LLaVA-1.5's shape) Pixtral vision towers\n");
  CHECK(import_errors("deepseek-vl2-tiny.json",
                      [](Json& c) {
                        c["vision_config"]["width"] = Json{{"sam_vit_b", {{"width", 768}}}};
                      }) ==
        "c.json: vision_config.width: DeepSeek-OCR's encoders (sam_vit_b): a SAM encoder "
        "feeding a second one is not imported\n");
}

TEST_CASE("CLIP's older configs: the towers' *_config_dict copies must agree with the configs") {
  const auto unused = unused_keys("clip-vit-large-patch14-336.json", [](Json& c) {
    c["vision_config_dict"] = Json{{"hidden_size", c["vision_config"]["hidden_size"]}};
  });
  CHECK(has_line(unused,
                 "vision_config_dict: copies of the towers' configs that older "
                 "transformers versions wrote"));
  CHECK(import_errors("clip-vit-large-patch14-336.json",
                      [](Json& c) {
                        c["vision_config_dict"] = Json{{"hidden_size", 768}};
                      })
            .find("c.json: vision_config_dict.hidden_size: 768 differs from "
                  "vision_config.hidden_size = 1024") != std::string::npos);
}

TEST_CASE("Qwen3-VL MoE: 128 experts of which 8 per token in every layer, or after dense ones") {
  const std::string moe = "../hf-corpus/configs/Qwen--Qwen3-VL-30B-A3B-Instruct.json";
  const ModelSpec m = import(moe);
  const TransformerArch& a = *module(m, "llm").transformer;
  CHECK(a.experts == 128);
  CHECK(a.top_k == 8);
  CHECK(a.moe_ffn == 768);
  CHECK(a.moe_every == 1);
  CHECK(a.dense_layers == 0);
  CHECK(a.qk_norm);
  CHECK(model_parameters(m) == 31'070'754'032);  // the checkpoint index's bf16 bytes / 2
  // A dense prefix is the IR's dense_layers; every second layer is its moe_every; dense layers
  // anywhere else are refused.
  Json config = Json::parse(std::ifstream(kHf + moe));
  config["text_config"]["mlp_only_layers"] = {0, 1};
  Diagnostics diag;
  auto prefixed = import_hf_config(config, "c.json", {}, diag);
  REQUIRE(prefixed.has_value());
  CHECK(find_llm(*prefixed)->transformer->dense_layers == 2);
  config["text_config"]["mlp_only_layers"] = Json::array();
  config["text_config"]["decoder_sparse_step"] = 2;
  auto stepped = import_hf_config(config, "c.json", {}, diag);
  REQUIRE(stepped.has_value());
  CHECK(find_llm(*stepped)->transformer->moe_every == 2);
  CHECK_FALSE(moe_layer(*find_llm(*stepped)->transformer, 0));
  CHECK(moe_layer(*find_llm(*stepped)->transformer, 1));
  const std::string errors =
      import_errors(moe, [](Json& c) { c["text_config"]["mlp_only_layers"] = {3}; });
  CHECK(errors.find("text_config.mlp_only_layers") != std::string::npos);
}

TEST_CASE("LLaVA-NeXT-Video: LLaVA-NeXT whose video frames are pooled 2 x 2 before the LLM") {
  const std::string video = "../hf-corpus/configs/llava-hf--LLaVA-NeXT-Video-7B-32K-hf--bnb4.json";
  const ModelSpec m = import(video);
  const ModuleSpec& vision = module(m, "vision");
  CHECK(vision.patching->video_pool == 2);
  CHECK(vision.patching->resize == ResizeMode::kTiles);
  // A 336 px frame is 24 x 24 patches; pooled 12 x 12 = 144 LLM tokens, and all 577 encoder
  // tokens (with the class token) run through the tower. Images keep their 576 per tile.
  const MediaTokens clip = video_tokens(vision, 8, 336, 336);
  CHECK(clip.encoder_tokens == 8 * 577);
  CHECK(clip.llm_tokens == 8 * 144);
  CHECK(image_tokens(vision, 336, 336).llm_tokens == 576);
  CHECK(module(m, "vision_projector").projector->bias);
  CHECK(import_errors(video, [](Json& c) {
          c["spatial_pool_mode"] = "conv";
        }).find("spatial_pool_mode") != std::string::npos);
  // The pooling of square frames cannot go with native-resolution resizing.
  Json written = to_json(m);
  for (Json& mod : written["modules"])
    if (mod["name"] == "vision") {
      mod["patching"]["resize"] = "dynamic";
      mod["patching"]["min_pixels"] = 3136;
      mod["patching"]["max_pixels"] = 1003520;
    }
  Diagnostics diag;
  read_model(written, "m.json", "", diag);
  CHECK(diag.format().find("video_pool: pools square frames") != std::string::npos);
}

TEST_CASE("Mistral 3 and Pixtral: a bias-free RMSNorm ViT, a patch merger before the projector") {
  // LightOnOCR-1B, as transformers builds Mistral3ForConditionalGeneration: the Pixtral tower
  // (patch_conv 3·14²·1024 without bias, ln_pre, 24 layers of q/k/v/o 1024², a gated MLP of
  // 4096 and two RMSNorms, no final norm) = 403,305,472; the projector (an RMSNorm of 1024, the
  // merger 4096 -> 1024 and linear_1, linear_2 of 1024² without biases) = 6,292,480; the Qwen3
  // decoder (28 layers, 16 heads and 8 KV heads of 128, q/k norms, tied embeddings of 151,936)
  // = 596,049,920.
  const ModelSpec ocr = import("../hf-corpus/configs/lightonai--LightOnOCR-1B-1025.json");
  CHECK(module_parameters(module(ocr, "vision")) == 403'305'472);
  CHECK(module_parameters(module(ocr, "vision_projector")) == 6'292'480);
  CHECK(module_parameters(module(ocr, "llm")) == 596'049'920);
  const ModuleSpec& tower = module(ocr, "vision");
  CHECK_FALSE(tower.transformer->final_norm);
  CHECK(tower.transformer->gated_ffn);
  CHECK(tower.patching->spatial_merge == 2);
  CHECK(tower.patching->max_pixels == 1540 * 1540);
  const ProjectorArch& p = *module(ocr, "vision_projector").projector;
  CHECK(p.in == 4096);
  CHECK(p.merger == 1024);
  CHECK(p.input_norm_width == 1024);
  // Pixtral-12B's llava-hf conversion: the same tower at 16 px patches, no merger, a biased
  // two-layer projector into Mistral NeMo: 12,682,739,712 in all (a 12B decoder and a 0.4B
  // encoder, as its release describes them).
  const ModelSpec pixtral = import("../hf-corpus/configs/mistral-community--pixtral-12b.json");
  CHECK(module(pixtral, "vision_projector").projector->merger == 0);
  CHECK(model_parameters(pixtral) == 12'682'739'712);
  // A merger must merge down; the executor does not run one yet.
  Json written = to_json(ocr);
  written["modules"][1]["projector"]["merger"] = 8192;
  Diagnostics diag;
  read_model(written, "m.json", "", diag);
  CHECK(diag.format().find("merger: must be below in=4096") != std::string::npos);
}

TEST_CASE("MiniCPM-V: SigLIP slices, a resampler of learned queries per slice, the LLM flat") {
  // Each checkpoint's count is exact in the corpus test; here, the parts. MiniCPM-V 2.0 names a
  // timm tower (SigLIP so400m at 384 px: 27 blocks, its last dropped) and stores its
  // resampler's position table; 2.6 describes its tower (980 px: 4,900 positions) and has a
  // Qwen2 LLM with q/k/v biases.
  const std::string corpus = "../hf-corpus/configs/";
  const ModelSpec v2 = import(corpus + "openbmb--MiniCPM-V-2.json");
  const ModuleSpec& tower = module(v2, "vision");
  CHECK(tower.transformer->layers == 26);
  CHECK(tower.transformer->positions == 27 * 27);
  CHECK_FALSE(tower.patching->class_token);
  CHECK(tower.patching->tile_size == 448);
  CHECK(tower.patching->max_tiles == 9);
  CHECK(tower.patching->thumbnail);
  const ProjectorArch& r = *module(v2, "vision_projector").projector;
  CHECK(r.queries == 64);
  CHECK(r.query_heads == 2304 / 128);
  CHECK(r.query_positions);
  CHECK(r.layers == 1);  // the output matrix (proj), no bias
  CHECK_FALSE(r.bias);
  // The resampler by hand at D = 2304, in = 1152: queries and their stored positions 2·64·D,
  // kv_proj 1152·D, attention in 3D² + 3D and out D² + D, three LayerNorms 6D; then proj D².
  const int64_t d = 2304;
  CHECK(resampler_parameters(r) == 2 * 64 * d + 1152 * d + 4 * d * d + 4 * d + 6 * d);
  CHECK(module_parameters(module(v2, "vision_projector")) == resampler_parameters(r) + d * d);
  CHECK(module_parameters(module(v2, "vision_projector")) == 29'514'240);
  CHECK(module_parameters(tower) == 397'747'744);
  CHECK(module_parameters(module(v2, "llm")) == 3'007'703'808);

  const ModelSpec v26 = import(corpus + "openbmb--MiniCPM-V-2_6.json");
  CHECK(module(v26, "vision").transformer->positions == 70 * 70);
  CHECK(module(v26, "vision").transformer->layers == 27);
  CHECK(module(v26, "llm").transformer->qkv_bias);
  CHECK_FALSE(module(v26, "vision_projector").projector->query_positions);
  // Every slice, whatever its patches, reaches the LLM as 64 tokens: a 448 px image is one
  // piece of 32² patches; a 1344 x 896 one six slices and the whole image.
  Sample s;
  s.text_tokens = 10;
  s.images = {{448, 448}, {1344, 896}};
  const SampleTokens t = sample_tokens(v26, s);
  CHECK(t.image_encoder == (1 + 7) * 32 * 32);
  CHECK(t.image_llm == (1 + 7) * 64);
  CHECK(t.llm_sequence == 10 + 8 * 64);
  // A tower timm names without sizes here is refused, naming the key.
  CHECK(import_errors(corpus + "openbmb--MiniCPM-V-2.json",
                      [](Json& c) { c["vision_encoder"] = "vit_giant_patch14_siglip_224.webli"; })
            .find("vision_encoder: timm tower 'vit_giant_patch14_siglip_224.webli' has no sizes") !=
        std::string::npos);
}

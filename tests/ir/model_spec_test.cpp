#include <doctest/doctest.h>

#include "shared/spec/model_spec.hpp"

using namespace tessera;

static std::string errors_of(const char* text) {
  Diagnostics diag;
  read_model(Json::parse(text), "m.json", "", diag);
  return diag.format();
}

// The problems of a one-module model whose 4-layer LLM has `fields` besides its sizes.
static std::string transformer_errors(const std::string& fields) {
  const std::string text = R"({"name": "m", "modules": [{"name": "llm", "role": "llm",
      "transformer": {"layers": 4, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 64, )" +
                           fields + "}}]}";
  return errors_of(text.c_str());
}

TEST_CASE("a valid model reads and round-trips through JSON") {
  const char* text = R"({"name": "t", "modules": [
    {"name": "vision", "role": "encoder", "modality": "image", "frozen": true,
     "transformer": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "linear_bias": true, "norm": "layernorm"},
     "patching": {"patch_size": 8, "resize": "fixed", "image_size": 32}},
    {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 64, "out": 128}},
    {"name": "llm", "role": "llm", "inputs": ["proj"],
     "transformer": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 344, "gated_ffn": true, "vocab": 100}}]})";
  Diagnostics diag;
  const ModelSpec m = read_model(Json::parse(text), "m.json", "", diag);
  REQUIRE(diag.ok());
  CHECK(m.modules[2].transformer->head_dim == 32);
  CHECK(m.modules[1].projector->hidden == 128);  // defaults to out
  const ModelSpec again = read_model(to_json(m), "", "", diag);
  CHECK(diag.ok());
  CHECK(again == m);
}

TEST_CASE("Mllama's fields read, round-trip, and are refused where they mean nothing") {
  const char* text = R"({"name": "t", "modules": [
    {"name": "vision", "role": "encoder", "modality": "image",
     "transformer": {"layers": 4, "hidden": 64, "heads": 4, "ffn": 256, "mlp_bias": true, "gated_layers": 2, "norm": "layernorm", "positions": 17},
     "patching": {"patch_size": 8, "resize": "tiles", "tile_size": 32, "max_tiles": 4, "class_token": true, "pre_norm": true, "aspect_ratios": 8}},
    {"name": "proj", "role": "projector", "inputs": ["vision"], "projector": {"in": 64, "out": 128, "layers": 1}},
    {"name": "llm", "role": "llm", "inputs": ["proj"],
     "transformer": {"layers": 5, "hidden": 128, "heads": 4, "ffn": 344, "vocab": 100, "extra_embeddings": 8, "cross_attention_layers": 1}}]})";
  Diagnostics diag;
  const ModelSpec m = read_model(Json::parse(text), "m.json", "", diag);
  REQUIRE(diag.ok());
  CHECK(m.modules[0].transformer->mlp_bias);
  CHECK(m.modules[0].transformer->gated_layers == 2);
  CHECK(m.modules[0].patching->aspect_ratios == 8);
  CHECK(m.modules[2].transformer->extra_embeddings == 8);
  CHECK(read_model(to_json(m), "", "", diag) == m);
  CHECK(diag.ok());

  const std::string e = errors_of(R"({"name": "t", "modules": [
    {"name": "vision", "role": "encoder", "modality": "image",
     "transformer": {"layers": 1, "hidden": 16, "heads": 2, "ffn": 8, "gated_layers": 2, "extra_embeddings": 3},
     "patching": {"resize": "fixed", "image_size": 28, "aspect_ratios": 8}},
    {"name": "llm", "role": "llm", "inputs": ["vision"], "transformer": {"layers": 1, "hidden": 16, "heads": 2, "ffn": 8, "vocab": 4}}]})");
  CHECK(e.find("modules[0].transformer.gated_layers: exceeds layers=1") != std::string::npos);
  CHECK(e.find("modules[0].transformer.extra_embeddings: given without a vocab") !=
        std::string::npos);
  CHECK(e.find("modules[0].patching.aspect_ratios: not used with resize=fixed") !=
        std::string::npos);
}

TEST_CASE("model validation reports every problem with its path") {
  const std::string e = errors_of(R"({"name": "t", "modules": [
    {"name": "llm", "role": "llm", "inputs": ["projj"],
     "transformer": {"layers": 2, "hidden": 100, "heads": 3, "ffn": 0, "vocab": 10}},
    {"name": "llm", "role": "llm", "transformer": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 3, "ffn": 8, "vocab": 10}},
    {"name": "proj", "role": "projector", "inputs": ["llm"], "projector": {"in": 30, "out": 64}}]})");
  CHECK(e.find("modules[0].transformer.ffn: must be > 0, got 0") != std::string::npos);
  CHECK(e.find("modules[0].transformer.heads: 3 does not divide hidden=100") != std::string::npos);
  CHECK(e.find("modules[1].transformer.kv_heads: 3 does not divide heads=4") != std::string::npos);
  CHECK(e.find("modules[1].name: duplicate module name 'llm'") != std::string::npos);
  CHECK(e.find("more than one module has role llm") != std::string::npos);
  CHECK(e.find("modules[0].inputs[0]: unknown module 'projj'") != std::string::npos);
}

TEST_CASE("cycles and mismatched projector widths are caught") {
  const std::string e = errors_of(R"({"name": "t", "modules": [
    {"name": "a", "role": "projector", "inputs": ["b"], "projector": {"in": 8, "out": 8}},
    {"name": "b", "role": "projector", "inputs": ["a"], "projector": {"in": 8, "out": 8}},
    {"name": "llm", "role": "llm", "inputs": ["a"], "transformer": {"layers": 1, "hidden": 16, "heads": 2, "ffn": 8, "vocab": 4}}]})");
  CHECK(e.find("form a cycle") != std::string::npos);
  CHECK(e.find("modules[0].projector.out: 8 does not match llm.hidden=16") != std::string::npos);
}

TEST_CASE("role rules") {
  const std::string e = errors_of(R"({"name": "t", "modules": [
    {"name": "enc", "role": "encoder", "modality": "image",
     "transformer": {"layers": 1, "hidden": 16, "heads": 2, "ffn": 8}},
    {"name": "llm", "role": "llm", "inputs": ["enc"], "transformer": {"layers": 1, "hidden": 16, "heads": 2, "ffn": 8}},
    {"name": "p", "role": "projector", "inputs": ["enc"], "patching": {"resize": "fixed", "image_size": 28}, "projector": {"in": 16, "out": 16}}]})");
  CHECK(e.find("modules[0]: an image/video encoder needs patching") != std::string::npos);
  CHECK(e.find("modules[1].transformer.vocab: an llm needs vocab > 0") != std::string::npos);
  CHECK(e.find("modules[2].patching: only encoders have patching") != std::string::npos);
}

// Limits that keep parameter counts and FLOPs inside int64 (fuzz/hf_config found a patch grid
// squared past it; the same products exist for model files).
TEST_CASE("architecture integers past their limits are refused") {
  const std::string text = errors_of(R"({"name": "t", "modules": [
    {"name": "vision", "role": "encoder", "modality": "image",
     "transformer": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256},
     "patching": {"patch_size": 8, "resize": "fixed", "image_size": 300008000000000068}},
    {"name": "llm", "role": "llm", "inputs": ["vision"],
     "transformer": {"layers": 5000, "hidden": 9000000, "heads": 4, "ffn": 344, "vocab": 100000000,
                     "experts": 100000, "top_k": 2}},
    {"name": "proj", "role": "projector", "inputs": ["vision"],
     "projector": {"in": 64, "out": 64, "separators": 3000000000000000000}}]})");
  INFO(text);
  CHECK(
      text.find("modules[0].patching.image_size: 300008000000000068 is over the limit of 65536") !=
      std::string::npos);
  CHECK(text.find("modules[1].transformer.layers: 5000 is over the limit of 1024") !=
        std::string::npos);
  CHECK(text.find("modules[1].transformer.hidden: 9000000 is over the limit of 131072") !=
        std::string::npos);
  CHECK(text.find("modules[1].transformer.vocab: 100000000 is over the limit of 4194304") !=
        std::string::npos);
  CHECK(text.find("modules[1].transformer.experts: 100000 is over the limit of 512") !=
        std::string::npos);
  CHECK(
      text.find("modules[2].projector.separators: 3000000000000000000 is over the limit of 1024") !=
      std::string::npos);
}

TEST_CASE("multi-head latent attention: its fields are checked together") {
  CHECK(transformer_errors(
            R"("head_dim": 24, "kv_lora_rank": 16, "rope_head_dim": 8, "v_head_dim": 16)")
            .empty());
  CHECK(transformer_errors(R"("head_dim": 24, "kv_lora_rank": 16, "rope_head_dim": 7)")
            .find("is odd") != std::string::npos);
  CHECK(transformer_errors(R"("head_dim": 24, "kv_lora_rank": 16, "rope_head_dim": 24)")
            .find("leaves no non-rotary part") != std::string::npos);
  CHECK(transformer_errors(R"("kv_heads": 2, "kv_lora_rank": 16, "rope_head_dim": 8)")
            .find("as many key/value heads as heads") != std::string::npos);
  CHECK(transformer_errors(R"("rope_head_dim": 8)").find("given without kv_lora_rank") !=
        std::string::npos);
  CHECK(transformer_errors(R"("v_head_dim": 8)").find("differs from head_dim") !=
        std::string::npos);
  CHECK(transformer_errors(R"("router_bias": true)").find("given without experts") !=
        std::string::npos);
}

TEST_CASE("a layer pattern needs experts and leaves some") {
  CHECK(
      transformer_errors(R"("experts": 4, "top_k": 1, "dense_layers": 1, "moe_every": 3)").empty());
  CHECK(transformer_errors(R"("dense_layers": 1)").find("given without experts") !=
        std::string::npos);
  CHECK(transformer_errors(R"("experts": 4, "top_k": 1, "dense_layers": 4)")
            .find("leaves no layer") != std::string::npos);
  CHECK(transformer_errors(R"("experts": 4, "top_k": 1, "dense_layers": 1, "moe_every": 4)")
            .find("moe_every") != std::string::npos);
  CHECK(transformer_errors(R"("experts": 4, "top_k": 1, "moe_every": 0)").find("moe_every") !=
        std::string::npos);
}

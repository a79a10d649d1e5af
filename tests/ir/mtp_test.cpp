// Multi-token prediction (TransformerArch::mtp_layers): the layers after the stack, read and
// checked, counted in weights and FLOPs, lowered with the stack's last pipeline chunk, priced by
// the stage split and exported as Megatron-LM's mtp_num_layers and pipeline layout.
#include <doctest/doctest.h>

#include <optional>
#include <string>

#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/batch.hpp"
#include "shared/model/model_math.hpp"
#include "shared/search/megatron_export.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

Scenario load(const std::string& path) {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/" + path, diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return *s;
}

TransformerArch& llm_arch(Scenario& s) {
  return *s.model.modules.back().transformer;
}

Program lowered(const Scenario& s) {
  Diagnostics diag;
  validate_plan(*s.plan, s.model, s.workload, s.cluster, "", "", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  Lowered l =
      lower(s.model, s.cluster, resolve_stage_split(*s.plan, s.model, s.workload, s.cluster),
            s.workload, draw_batch(s.workload, 0));
  REQUIRE(l.error.empty());
  const auto problems = check_program(l.program);
  INFO((problems.empty() ? std::string() : problems.front()));
  CHECK(problems.empty());
  return std::move(l.program);
}

// Rank `rank`'s first forward compute op of the LLM (module `llm`).
const Op& first_forward(const Program& p, int rank, int llm) {
  for (const Op& op : p.ranks[static_cast<std::size_t>(rank)])
    if (op.kind == OpKind::kCompute && op.phase == Phase::kF && op.module == llm) return op;
  FAIL("no forward op");
  return p.ranks[0][0];
}

}  // namespace

TEST_CASE("mtp_layers: read, written back, refused without a vocabulary") {
  const auto read = [](const std::string& extra, Diagnostics& diag) {
    return read_model(Json::parse(R"({"name": "m", "modules": [{"name": "llm", "role": "llm",
        "transformer": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128)" +
                                  extra + "}}]}"),
                      "m.json", "", diag);
  };
  Diagnostics diag;
  const ModelSpec m = read(R"(, "vocab": 100, "mtp_layers": 2)", diag);
  INFO(diag.format());
  REQUIRE(diag.ok());
  CHECK(m.modules[0].transformer->mtp_layers == 2);
  Diagnostics again;
  CHECK(read_model(to_json(m), "m.json", "", again) == m);
  CHECK(!to_json(read(R"(, "vocab": 100)", again))["modules"][0]["transformer"].contains(
      "mtp_layers"));
  Diagnostics bad, negative;
  read(R"(, "mtp_layers": 1)", bad);
  CHECK(bad.format().find("m.json: modules[0].transformer.mtp_layers: given without vocab") !=
        std::string::npos);
  read(R"(, "vocab": 100, "mtp_layers": -1)", negative);
  CHECK(negative.format().find("modules[0].transformer.mtp_layers") != std::string::npos);
}

TEST_CASE("an MTP layer is of the stack's MoE kind and adds its projection and norms") {
  Scenario s = load("published/nvidia-deepseek-v3-h100-1024.json");
  TransformerArch& a = llm_arch(s);
  REQUIRE(a.mtp_layers == 1);
  CHECK(stack_end(a) == 62);
  CHECK(mtp_layers_in(a, 0, 61) == 0);
  CHECK(mtp_layers_in(a, 60, 62) == 1);
  CHECK(mtp_layers_in(a, 61, 62) == 1);
  CHECK(moe_layer(a, 61));
  CHECK(moe_layers(a, 0, 61) == 58);
  CHECK(moe_layers(a, 57, 62) == 5);
  const ModuleSpec with = s.model.modules.back();
  a.mtp_layers = 0;
  const ModuleSpec without = s.model.modules.back();
  // One MoE layer, the 2h x h projection and three RMSNorms of h.
  const int64_t h = a.hidden;
  CHECK(module_parameters(with) - module_parameters(without) ==
        layer_parameters(a) + 2 * h * h + 3 * h);
  // DeepSeek-V3's checkpoint: 671B and 14B of MTP module ("685B" on the Hub), the module storing
  // its own copies of the embedding and output head (2 x 0.93B).
  CHECK(module_parameters(without) == doctest::Approx(671e9).epsilon(0.005));
  CHECK(module_parameters(with) + 2 * a.vocab * h == doctest::Approx(685e9).epsilon(0.005));
  // FLOPs per token: the layer, its projection and one more head.
  CHECK(forward_flops_per_token(with, 1024) - forward_flops_per_token(without, 1024) ==
        doctest::Approx(layer_forward_flops_per_token(a, 1024) +
                        2.0 * static_cast<double>(2 * h * h + h * a.vocab)));
}

TEST_CASE("MTP layers run in the stack's last pipeline chunk, each with its head and loss") {
  Scenario s = load("cpu-tiny-moe.json");
  s.plan->layout.pp = 2;
  s.plan->layout.dp = 2;
  s.plan->layout.ep = 2;
  s.plan->num_micro_batches = 4;
  const int llm = static_cast<int>(s.model.modules.size()) - 1;
  TransformerArch& a = llm_arch(s);
  // The cost-balanced (frozen-aware) split gives the last stage, which runs the MTP layer and a
  // second head, one layer fewer.
  CHECK(find_chunk_layers(lowered(s), llm, 0, 0)->end_layer == 2);
  a.mtp_layers = 1;
  CHECK(find_chunk_layers(lowered(s), llm, 0, 0)->end_layer == 3);
  // Layers split evenly from here on.
  s.plan->stage_split = StageSplit::kUniform;
  const Program with = lowered(s);
  a.mtp_layers = 0;
  const Program without = lowered(s);
  a.mtp_layers = 1;
  // The last stage's chunk holds the MTP layer after the stack's.
  const ChunkLayers* last = find_chunk_layers(with, llm, 1, 0);
  REQUIRE(last != nullptr);
  CHECK(last->first_layer == 2);
  CHECK(last->end_layer == 5);
  CHECK(find_chunk_layers(with, llm, 0, 0)->end_layer == 2);
  // Rank 2 (stage 1): one layer more, of the MoE kind (one more dispatch), a projection, a
  // second head and loss.
  const Op& f0 = first_forward(without, 2, llm);
  const Op& f1 = first_forward(with, 2, llm);
  CHECK(f1.layers == f0.layers + 1);
  CHECK(f1.logits == doctest::Approx(2 * f0.logits));
  const double tokens = static_cast<double>(f1.tokens), h = static_cast<double>(a.hidden);
  CHECK(f1.flops - f0.flops ==
        doctest::Approx(tokens * (2.0 * static_cast<double>(active_layer_matmul_parameters(a)) +
                                  4.0 * h * h + 2.0 * h * static_cast<double>(a.vocab)) +
                        layer_attention_flops(a, f1.attention_pairs)));
  const auto dispatches = [](const Op& op) {
    int32_t calls = 0;
    for (const NestedCollective& n : op.nested)
      if (n.purpose == Purpose::kEp && n.kind == CollectiveKind::kAllToAll) calls += n.count;
    return calls;
  };
  CHECK(dispatches(f1) == dispatches(f0) + 4);  // counts, dispatch, router weights, combine
  // Stage 0 runs as before; the iteration's model FLOPs grow by the MTP work.
  CHECK(first_forward(with, 0, llm).flops == first_forward(without, 0, llm).flops);
  CHECK(with.model_flops > without.model_flops);
  // The last stage holds the MTP layer's weights and a copy of the embedding.
  CHECK(
      with.memory[2].weight_bytes - without.memory[2].weight_bytes ==
      doctest::Approx(4.0 * (static_cast<double>(layer_parameters(a, 1, 2)) +
                             mtp_extra_parameters(a, 1) + static_cast<double>(a.vocab * a.hidden)))
          .epsilon(1e-9));
  CHECK(with.memory[0].weight_bytes == without.memory[0].weight_bytes);
}

TEST_CASE("the stage split prices the MTP layer with the last stage; the export writes it") {
  Scenario s = load("published/nvidia-deepseek-v3-h100-1024.json");
  const std::size_t llm = s.model.modules.size() - 1;
  const ChainCosts with = chain_costs(s.model, llm, *s.plan, s.workload, s.cluster);
  ModelSpec plain = s.model;
  plain.modules[llm].transformer->mtp_layers = 0;
  const ChainCosts without = chain_costs(plain, llm, *s.plan, s.workload, s.cluster);
  REQUIRE(with.layers.size() == 61);
  // An MoE layer, its projection and a second head: more than a layer, less than three.
  CHECK(with.last_extra - without.last_extra > with.layers.back());
  CHECK(with.last_extra - without.last_extra < 3 * with.layers.back());
  CHECK(with.first_extra == without.first_extra);

  // Megatron-LM: mtp_num_layers, and its layout's last virtual stage "tmL" (one layer, the MTP
  // layer, the loss), as NVIDIA's recipe writes it (Et*4|(t*4|)*14tmL).
  const MegatronExport e = megatron_export(s, *s.plan);
  REQUIRE(e.refusal.empty());
  CHECK(e.config["transformer_config"]["mtp_num_layers"] == 1);
  const std::string layout = e.config["transformer_config"]["pipeline_model_parallel_layout"];
  CHECK(layout.starts_with("Etttt|tttt|"));
  CHECK(layout.ends_with("|tttt|tmL"));
  // Megatron-LM overlaps the expert all-to-alls beside one MTP layer in a pipeline, not more.
  ParallelPlan overlapped = *s.plan;
  overlapped.moe_a2a_overlap = true;
  CHECK(megatron_export(s, overlapped)
            .config["transformer_config"]
            .value("overlap_moe_expert_parallel_comm", false));
  Scenario two = s;
  llm_arch(two).mtp_layers = 2;
  const MegatronExport refused = megatron_export(two, overlapped);
  CHECK(!refused.config["transformer_config"].contains("overlap_moe_expert_parallel_comm"));
  CHECK(refused.config["transformer_config"]["pipeline_model_parallel_layout"]
            .get<std::string>()
            .ends_with("|tmmL"));
  bool said = false;
  for (const std::string& note : refused.notes)
    said = said || note.starts_with(
                       "plan.moe_a2a_overlap: Megatron-LM overlaps the expert "
                       "all-to-alls beside multi-token prediction");
  CHECK(said);
}

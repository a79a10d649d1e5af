#include "shared/search/megatron_export.hpp"

#include <algorithm>
#include <sstream>

#include "shared/base/diagnostics.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

namespace {

// Megatron-LM's pipeline layout string: stages separated by '|', 'E' the embedding, 't' a
// transformer layer, 'm' a multi-token-prediction layer, 'L' the loss; virtual stages of a rank
// follow the physical ones in order.
std::string pipeline_layout(const std::vector<int64_t>& stage_layers, int64_t mtp_layers) {
  std::string s;
  for (std::size_t i = 0; i < stage_layers.size(); ++i) {
    if (i > 0) s += "|";
    if (i == 0) s += "E";
    s += std::string(static_cast<std::size_t>(stage_layers[i]), 't');
    if (i + 1 == stage_layers.size())
      s += std::string(static_cast<std::size_t>(mtp_layers), 'm') + "L";
  }
  return s;
}

std::string layout_words(const ModuleLayout& l) {
  std::ostringstream o;
  o << "tp " << l.tp << ", cp " << l.cp << ", pp " << l.pp << ", dp " << l.dp;
  if (l.ep > 1) o << ", ep " << l.ep;
  if (l.expert_tp() != l.tp) o << ", etp " << l.expert_tp();
  return o.str();
}

}  // namespace

MegatronExport megatron_export(const Scenario& scenario, const ParallelPlan& plan) {
  MegatronExport e;
  const ModelSpec& model = scenario.model;
  const ModuleSpec* llm = find_llm(model);
  if (llm == nullptr || !llm->transformer || llm->transformer->vocab <= 0) {
    e.refusal = "Megatron-LM's GPT model needs a decoder LLM with a vocabulary";
    return e;
  }
  const TransformerArch& a = *llm->transformer;
  if (a.cross_attention_layers > 0) {
    e.refusal = llm->name +
                ": cross-attention layers (Mllama) are not in Megatron-LM's GPT model; its "
                "multimodal models would need them by hand";
    return e;
  }
  Diagnostics diag;
  const std::vector<PlacedModule> placed = place_modules(plan, model, "", "plan", diag);
  const ModuleLayout* found = nullptr;
  for (const PlacedModule& p : placed)
    if (p.module == llm) found = &p.layout;
  if (!diag.ok() || found == nullptr) {
    e.refusal = "the plan places no grid for " + llm->name + ": " + diag.format();
    return e;
  }
  const ModuleLayout& l = *found;
  auto arg = [&](const std::string& flag, const std::string& value = "") {
    e.arguments.emplace_back(flag, value);
  };
  auto num = [](auto v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  // Filled apart: an ordered Json's members move as it grows.
  Json tc = Json::object(), gpt = Json::object(), ddp = Json::object(), batch = Json::object();
  // A TransformerConfig field and the Megatron-LM flag named after it, as Megatron-LM derives
  // its flags from the config's fields (num_layers: --num-layers); true is a switch.
  auto field = [&](const std::string& name, const Json& value) {
    tc[name] = value;
    std::string flag = "--" + name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (value.is_boolean()) {
      if (value.get<bool>()) arg(flag);
    } else if (value.is_string())
      arg(flag, value.get<std::string>());
    else if (value.is_number_integer())
      arg(flag, value.dump());
    else
      arg(flag, num(value.get<double>()));
  };

  // --- The model's shape ----------------------------------------------------------------
  field("num_layers", a.layers);
  if (a.mtp_layers > 0) field("mtp_num_layers", a.mtp_layers);
  field("hidden_size", a.hidden);
  field("ffn_hidden_size", a.ffn);
  field("num_attention_heads", a.heads);
  if (a.kv_lora_rank > 0) {
    field("multi_latent_attention", true);
    field("kv_lora_rank", a.kv_lora_rank);
    if (a.q_lora_rank > 0)
      field("q_lora_rank", a.q_lora_rank);
    else
      tc["q_lora_rank"] = nullptr;
    field("qk_head_dim", a.head_dim - a.rope_head_dim);
    field("qk_pos_emb_head_dim", a.rope_head_dim);
    field("v_head_dim", value_head_dim(a));
  } else {
    if (a.kv_heads != a.heads) {
      arg("--group-query-attention");
      field("num_query_groups", a.kv_heads);
    }
    if (a.head_dim * a.heads != a.hidden) field("kv_channels", a.head_dim);
  }
  field("normalization", a.norm == NormKind::kRmsNorm ? "RMSNorm" : "LayerNorm");
  if (a.gated_ffn) {
    arg("--swiglu");
    tc["gated_linear_unit"] = true;
    tc["activation"] = "silu";
  }
  if (!a.linear_bias) {
    arg("--disable-bias-linear");
    tc["add_bias_linear"] = false;
    if (a.qkv_bias) field("add_qkv_bias", true);
    if (a.mlp_bias || a.out_bias)
      e.notes.push_back(llm->name +
                        ": biases on some linears only (mlp_bias, out_bias): Megatron-LM has "
                        "all or none besides the QKV bias; exported without them");
  } else if (!a.key_bias) {
    e.notes.push_back(llm->name +
                      ": no bias on the key projection (key_bias false): "
                      "Megatron-LM's QKV projection biases all three");
  }
  if (a.qk_norm) field("qk_layernorm", true);
  if (a.post_norms || a.layer_scale || !a.final_norm)
    e.notes.push_back(llm->name +
                      ": post-attention/MLP norms, layer scales or no final norm: not Megatron-LM "
                      "GPT options; exported as a plain pre-norm stack");
  const int64_t seq = scenario.workload.max_seq_len;
  if (a.positions > 0) {
    arg("--position-embedding-type", "learned_absolute");
    arg("--max-position-embeddings", num(a.positions));
    gpt["position_embedding_type"] = "learned_absolute";
    gpt["max_sequence_length"] = a.positions;
  } else {
    arg("--position-embedding-type", "rope");
    arg("--max-position-embeddings", num(seq));
    gpt["position_embedding_type"] = "rope";
    gpt["max_sequence_length"] = seq;
  }
  arg("--tokenizer-type", "NullTokenizer");
  arg("--vocab-size", num(a.vocab));
  arg("--make-vocab-size-divisible-by", "1");
  gpt["vocab_size"] = a.vocab;
  if (a.extra_embeddings > 0)
    e.notes.push_back(llm->name + ": " + num(a.extra_embeddings) +
                      " embedding rows beyond the vocabulary (extra_embeddings) are not exported");
  if (!a.tied_embeddings) arg("--untie-embeddings-and-output-weights");
  gpt["share_embeddings_and_output_weights"] = a.tied_embeddings;
  if (a.experts > 0) {
    arg("--num-experts", num(a.experts));
    tc["num_moe_experts"] = a.experts;
    field("moe_router_topk", a.top_k);
    field("moe_ffn_hidden_size", a.moe_ffn);
    field("moe_grouped_gemm", true);
    if (a.shared_expert_ffn > 0) field("moe_shared_expert_intermediate_size", a.shared_expert_ffn);
    if (a.dense_layers > 0 || a.moe_every > 1) {
      // One entry a layer: 1 where it has experts.
      std::string pattern = "[";
      Json freq = Json::array();
      for (int64_t i = 0; i < a.layers; ++i) {
        pattern += std::string(i > 0 ? "," : "") + (moe_layer(a, i) ? "1" : "0");
        freq.push_back(moe_layer(a, i) ? 1 : 0);
      }
      arg("--moe-layer-freq", pattern + "]");
      tc["moe_layer_freq"] = freq;
    }
    if (a.capacity_factor > 0) {
      field("moe_expert_capacity_factor", a.capacity_factor);
      field("moe_pad_expert_input_to_capacity", true);
    }
    // Megatron-LM's rule: one expert a token takes the softmax before the top-k (after it,
    // every weight would be 1).
    if (a.top_k == 1 && !a.router_bias) field("moe_router_pre_softmax", true);
    if (a.router_bias) {
      field("moe_router_enable_expert_bias", true);
      field("moe_router_score_function", "sigmoid");
    }
    if (a.router_groups > 0) {
      field("moe_router_num_groups", a.router_groups);
      field("moe_router_group_topk", a.router_group_top_k);
    }
    const bool flex = plan.moe_dispatcher != MoeDispatcher::kAllToAll;
    field("moe_token_dispatcher_type", flex ? "flex" : "alltoall");
    if (plan.moe_dispatcher == MoeDispatcher::kDeepEp) field("moe_enable_deepep", true);
    if (plan.moe_dispatcher == MoeDispatcher::kHybridEp)
      field("moe_flex_dispatcher_backend", "hybridep");
    field("moe_permute_fusion", plan.moe_permute_fusion);
    if (plan.moe_a2a_overlap && l.pp > 1 && l.vpp == 1) {
      e.notes.push_back(
          "plan.moe_a2a_overlap: Megatron-LM overlaps the expert all-to-alls only between virtual "
          "pipeline stages (pp > 1 needs vpp > 1); exported without it");
    } else if (plan.moe_a2a_overlap && a.mtp_layers > 0 && (l.pp == 1 || a.mtp_layers > 1)) {
      e.notes.push_back(
          "plan.moe_a2a_overlap: Megatron-LM overlaps the expert all-to-alls beside "
          "multi-token prediction only with one MTP layer and a pipeline (pp > 1); exported "
          "without it");
    } else if (plan.moe_a2a_overlap) {
      field("overlap_moe_expert_parallel_comm", true);
    }
    if (plan.moe_fp8_dispatch)
      e.notes.push_back(
          "plan.moe_fp8_dispatch: FP8 expert dispatch (DeepSeek-V3's) is not a Megatron-LM "
          "argument; exported without it");
  }

  // --- The parallel layout --------------------------------------------------------------
  field("tensor_model_parallel_size", l.tp);
  field("pipeline_model_parallel_size", l.pp);
  field("context_parallel_size", l.cp);
  if (a.experts > 0) {
    field("expert_model_parallel_size", l.ep);
    field("expert_tensor_parallel_size", l.expert_tp());
  }
  if (l.vpp > 1) {
    arg("--num-virtual-stages-per-pipeline-rank", num(l.vpp));
    tc["virtual_pipeline_model_parallel_size"] = l.vpp;
  }
  if (!l.stage_layers.empty() && l.stage_layers != even_stage_layers(a.layers, l.pp * l.vpp)) {
    field("pipeline_model_parallel_layout", pipeline_layout(l.stage_layers, a.mtp_layers));
  }
  if (plan.sequence_parallel && l.tp > 1) field("sequence_parallel", true);
  if (plan.encoder_sequence_parallel)
    e.notes.push_back(
        "plan.encoder_sequence_parallel: Megatron-LM's multimodal models run their vision "
        "encoder and projection without sequence parallelism (the arguments cover the LLM)");
  if (l.cp > 1 && plan.cp_split != CpSplit::kZigzag)
    e.notes.push_back("plan.cp_split " + enum_name(plan.cp_split, kCpSplits) +
                      ": Megatron-LM's context parallelism splits each sequence zigzag (2·cp "
                      "chunks, load-balanced for causal masks)");
  switch (plan.schedule) {
    case Schedule::k1F1B:
    case Schedule::kInterleaved1F1B:
      break;
    case Schedule::kGpipe:
      e.notes.push_back("plan.schedule gpipe: Megatron-LM runs 1F1B (the same work, less memory)");
      break;
    default:
      e.notes.push_back("plan.schedule " + enum_name(plan.schedule, kSchedules) +
                        ": not a Megatron-LM schedule; the LLM's arguments run it as 1F1B");
  }

  // --- Batching ---------------------------------------------------------------------------
  arg("--seq-length", num(seq));
  arg("--micro-batch-size", num(plan.micro_batch_size));
  arg("--global-batch-size", num(scenario.workload.global_batch));
  batch["global_batch_size"] = scenario.workload.global_batch;
  batch["micro_batch_size"] = plan.micro_batch_size;
  batch["data_parallel_size"] = l.dp;
  if (plan.microbatching != MicrobatchPolicy::kArrival)
    e.notes.push_back("plan.microbatching " + enum_name(plan.microbatching, kMicrobatching) +
                      ": Megatron-LM takes samples in arrival order; the assignment is Tessera's");
  if (plan.pad_to_longest)
    e.notes.push_back("plan.pad_to_longest: Megatron-LM packs sequences (no per-batch padding)");

  // --- Recomputation ------------------------------------------------------------------
  switch (plan.recompute) {
    case Recompute::kNone:
      break;
    case Recompute::kSelective:
      field("recompute_granularity", "selective");
      if (plan.recompute_modules != kRecomputeCoreAttn) {
        // A list: the flag takes the names one after another.
        Json modules = Json::array();
        std::string names;
        for (const auto& [name, m] : kRecomputeModules)
          if ((plan.recompute_modules & m) != 0) {
            modules.push_back(name);
            names += (names.empty() ? "" : " ") + name;
          }
        tc["recompute_modules"] = modules;
        arg("--recompute-modules", names);
      }
      break;
    case Recompute::kFull:
      // Every layer (uniform groups of one), or the first recompute_layers of each chunk.
      field("recompute_granularity", "full");
      field("recompute_method", plan.recompute_layers > 0 ? "block" : "uniform");
      field("recompute_num_layers", plan.recompute_layers > 0 ? plan.recompute_layers : 1);
      break;
    case Recompute::kPerOp:
      e.notes.push_back(
          "plan.recompute per_op: torchtitan's per-op selective checkpointing has no Megatron-LM "
          "equivalent; exported without recomputation (selective or full are the choices)");
      break;
  }

  // --- Data parallelism and the optimizer -----------------------------------------------
  if (plan.distributed_optimizer && !plan.fully_sharded) arg("--use-distributed-optimizer");
  ddp["use_distributed_optimizer"] = plan.distributed_optimizer;
  if (plan.overlap_grad_reduce) arg("--overlap-grad-reduce");
  if (plan.overlap_param_gather) arg("--overlap-param-gather");
  ddp["overlap_grad_reduce"] = plan.overlap_grad_reduce;
  ddp["overlap_param_gather"] = plan.overlap_param_gather;
  // Buckets in parameters; the plan's are megabytes of 16-bit gradients.
  const auto bucket = static_cast<int64_t>(plan.grad_bucket_mb * 1e6 / 2);
  if (plan.overlap_grad_reduce || plan.fully_sharded) {
    arg("--ddp-bucket-size", num(bucket));
    ddp["bucket_size"] = bucket;
  }
  if (!plan.grad_reduce_in_fp32 && model.dtype == DType::kBf16) arg("--grad-reduce-in-bf16");
  ddp["grad_reduce_in_fp32"] = plan.grad_reduce_in_fp32;
  if (plan.fully_sharded) {
    arg("--use-megatron-fsdp");
    arg("--data-parallel-sharding-strategy", "optim_grads_params");
    ddp["use_megatron_fsdp"] = true;
    ddp["data_parallel_sharding_strategy"] = "optim_grads_params";
  }
  if (plan.tp_comm_overlap) field("tp_comm_overlap", true);
  if (!plan.tp_backward_overlap)
    e.notes.push_back(
        "plan.tp_backward_overlap false: Megatron-LM always runs the input-gradient "
        "TP collective beside the weight gradients");

  // --- Precision and kernels ------------------------------------------------------------
  const char* dtype = model.dtype == DType::kBf16   ? "bfloat16"
                      : model.dtype == DType::kFp16 ? "float16"
                                                    : "float32";
  if (model.dtype == DType::kBf16) field("bf16", true);
  if (model.dtype == DType::kFp16) field("fp16", true);
  tc["params_dtype"] = dtype;
  if (l.pp > 1) tc["pipeline_dtype"] = dtype;
  if (plan.fp8 != Fp8Recipe::kNone) {
    arg("--fp8-format", "hybrid");
    tc["fp8"] = "hybrid";
    field("fp8_recipe", plan.fp8 == Fp8Recipe::kDelayed     ? "delayed"
                        : plan.fp8 == Fp8Recipe::kBlockwise ? "blockwise"
                                                            : "tensorwise");
    if (plan.fp8_param_gather) {
      arg("--fp8-param-gather");
      tc["fp8_param"] = true;
      ddp["fp8_param_gather"] = true;
    }
  }
  if (!plan.flash_attention) field("attention_backend", "unfused");
  if (!plan.fused_kernels)
    e.notes.push_back(
        "plan.fused_kernels false: priced with PyTorch eager kernels; Megatron-LM "
        "fuses norms, rotary and activations");
  if (plan.framework == Framework::kPytorch)
    e.notes.push_back(
        "plan.framework pytorch: the plan was priced for a PyTorch-native stack; "
        "Megatron-LM with Transformer Engine runs it faster");
  if (plan.indivisible_heads != IndivisibleHeads::kRefuse)
    e.notes.push_back("plan.indivisible_heads " +
                      enum_name(plan.indivisible_heads, kIndivisibleHeads) +
                      ": heads TP does not divide are not a Megatron-LM option");

  // --- Modules beside the LLM -----------------------------------------------------------
  for (const PlacedModule& p : placed) {
    if (p.module == llm) continue;
    const ModuleSpec& m = *p.module;
    std::string what = "module " + m.name + " (" + enum_name(m.role, kModuleRoles) +
                       (m.frozen ? ", frozen" : "") + ")";
    if (m.transformer)
      what += ": " + num(m.transformer->layers) + " layers, hidden " + num(m.transformer->hidden);
    if (plan.placement == Placement::kHomogeneous) {
      what +=
          ", on the LLM's first stage: not in GPT's arguments (Megatron-LM's multimodal "
          "example builds its encoders and projector beside the LLM)";
    } else {
      what += ", grid " + (p.host.empty() ? layout_words(p.layout) : "of " + p.host) +
              " on ranks from " + num(p.first_rank) + " (Megatron-LM's MIMO model)";
    }
    e.notes.push_back(what);
  }
  if (plan.placement != Placement::kHomogeneous)
    e.notes.push_back("plan.placement " + enum_name(plan.placement, kPlacements) +
                      ": the arguments are the LLM's grid alone");
  // The MIMO example's grids: one encoder with its own span from rank 0, pipeline and context
  // parallelism 1 (its projector rides on it), and the LLM's span after it.
  if (plan.placement == Placement::kNonColocated) {
    const PlacedModule* encoder = nullptr;
    const PlacedModule* language = nullptr;
    int encoders = 0;
    for (const PlacedModule& p : placed) {
      if (p.module == llm) language = &p;
      if (p.module->role == ModuleRole::kEncoder) {
        ++encoders;
        encoder = &p;
      }
    }
    if (encoders == 1 && encoder->host.empty() && encoder->first_rank == 0 &&
        encoder->layout.pp == 1 && encoder->layout.cp == 1 && language != nullptr) {
      auto mimo = [&](const std::string& flag, int64_t value) {
        e.mimo_arguments.emplace_back(flag, num(value));
      };
      mimo("--encoder-tp", encoder->layout.tp);
      mimo("--encoder-dp", encoder->layout.dp);
      mimo("--llm-offset", language->first_rank);
      mimo("--llm-tp", l.tp);
      mimo("--llm-cp", l.cp);
      mimo("--llm-pp", l.pp);
      mimo("--llm-dp", l.dp);
      if (a.experts > 0) {
        mimo("--llm-ep", l.ep);
        mimo("--llm-expt-tp", l.tp);
      }
    } else {
      e.notes.push_back(
          "Megatron-LM's MIMO example takes one encoder from rank 0 with pp 1 and "
          "cp 1 beside the LLM; this plan's module grids are for its API by hand");
    }
  }
  if (llm->frozen)
    e.notes.push_back(llm->name +
                      " is frozen: GPT's arguments train it (the multimodal "
                      "example's --freeze-LM freezes it)");
  e.config["transformer_config"] = tc;
  e.config["model"] = gpt;
  e.config["ddp_config"] = ddp;
  e.config["batch"] = batch;
  return e;
}

std::string megatron_command_line(const MegatronExport& e) {
  std::ostringstream o;
  for (const std::string& note : e.notes) o << "# " << note << "\n";
  auto command = [&](const char* script,
                     const std::vector<std::pair<std::string, std::string>>& arguments) {
    o << script;
    for (const auto& [flag, value] : arguments) {
      o << " \\\n  " << flag;
      if (!value.empty())
        o << " " << (value.find_first_of("[|") != std::string::npos ? "'" + value + "'" : value);
    }
    o << "\n";
  };
  command("pretrain_gpt.py", e.arguments);
  if (!e.mimo_arguments.empty()) {
    o << "# the module grids, as Megatron-LM's MIMO example takes them beside the LLM's "
         "arguments\n";
    command("examples/mimo/pretrain_mimo.py", e.mimo_arguments);
  }
  return o.str();
}

}  // namespace tessera

// Lowering: one compute op — its FLOPs, nested collectives and stashed activations — and boundary
// sizes.
#include "shared/cost/collective_cost.hpp"
#include "shared/lowering/compute_flags.hpp"
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

Op Lowering::compute(const ModuleInfo& m, int64_t rank, int32_t k_chunk, int32_t mb, Phase phase,
                     std::span<const Sample* const> samples, const LayerRange* piece) {
  const ModuleSpec& spec = *m.spec;
  const ModuleInfo& grid = m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
  // Homogeneous encoders share the LLM's grid.
  const ModuleInfo& layout_owner =
      plan_.placement == Placement::kHomogeneous ? modules_[static_cast<std::size_t>(llm_)] : grid;
  const ModuleLayout& l = layout_owner.layout;
  const Coord x = layout_owner.coord(rank);
  const ModuleWork& work = work_of(m.index, samples);
  const bool replicated_over_cp = whole_on_cp_ranks(m);
  const double cp_split = replicated_over_cp ? 1.0 : static_cast<double>(l.cp);
  // This rank's share of the sequence: the LLM's tokens as context_split() deals them to the CP
  // ranks (each rank its own tokens and attention pairs), an even share otherwise.
  double tokens_local = static_cast<double>(work.tokens) / cp_split;
  double pairs_local = work.attention_pairs / cp_split;
  if (l.cp > 1 && spec.role == ModuleRole::kLlm) {
    const CpShare& share = cp_share(samples, l.cp, x.d);
    tokens_local = share.tokens[static_cast<std::size_t>(x.c)];
    pairs_local = share.pairs[static_cast<std::size_t>(x.c)];
  }
  // TP's shards of this module: its grid's TP, or 1 where it runs whole on every TP rank.
  const int64_t tp = split_tp(m);
  const double tp_shard = static_cast<double>(tp);
  const double dtype = static_cast<double>(dtype_bytes(model_.dtype));
  LayerRange range = piece != nullptr ? *piece : m.chunk_layers[static_cast<std::size_t>(k_chunk)];
  // Full recomputation of part of each chunk runs only its first layers again.
  if (phase == Phase::kR && plan_.recompute == Recompute::kFull && spec.transformer)
    range.second = std::clamp(recompute_end(m, k_chunk), range.first, range.second);
  const auto [layer_begin, layer_end] = range;
  const int64_t layers = layer_end - layer_begin;
  const bool first_chunk = layer_begin == 0;
  // The chunk that ends the stack, its multi-token-prediction layers (if any) included.
  const bool last_chunk = !spec.transformer || layer_end == stack_end(*spec.transformer);

  Op op;
  op.kind = OpKind::kCompute;
  op.stream = StreamKind::kCompute;
  op.phase = phase;
  op.module = static_cast<int16_t>(m.index);
  op.stage =
      static_cast<int16_t>(plan_.placement == Placement::kHomogeneous ? x.p : grid.coord(rank).p);
  op.chunk = chunk_of(m, k_chunk);
  op.microbatch = mb;
  const LayerRange held = m.chunk_layers[static_cast<std::size_t>(k_chunk)];
  const auto [at, added] = chunk_held_.try_emplace({op.module, op.stage, op.chunk}, held);
  TESSERA_CHECK(added || at->second == held, "chunk " + std::to_string(op.chunk) + " of " +
                                                 spec.name + " holds two layer ranges");
  op.layers = static_cast<int32_t>(layers);
  op.first_layer = static_cast<int32_t>(layer_begin);
  op.tokens = static_cast<int64_t>(tokens_local);
  op.tp = static_cast<int16_t>(tp);
  if (spec.transformer && spec.transformer->experts > 0) op.ep = static_cast<int16_t>(l.ep);
  // Sequence parallelism splits the LLM's tokens between its layers only.
  const bool sequence_parallel = sequence_parallel_for(plan_, spec);
  op.flags |= compute_op_flags(plan_, phase, tp, spec.transformer && layers > 0, m.flow.trainable,
                               sequence_parallel);
  const bool per_op_recompute = (op.flags & kOpPerOpRecompute) != 0;

  double linear = 0, attention = 0, weights = 0;   // FLOPs of one forward on this rank
  double padded_linear = 0, padded_attention = 0;  // of those, the work on padding heads
  if (spec.transformer) {
    const TransformerArch& a = *spec.transformer;
    // The layer stack's matrices and attention, for the architecture the plan runs and, where
    // it pads the heads, for the model's.
    const auto stack = [&](const TransformerArch& arch) {
      return std::pair{
          sum_over_layers(arch, layer_begin, layer_end,
                          [&](const TransformerArch& layer) {
                            return 2.0 * static_cast<double>(active_layer_matmul_parameters(layer));
                          }) *
              tokens_local / tp_shard,
          static_cast<double>(layers) * layer_attention_flops(arch, pairs_local) / tp_shard};
    };
    std::tie(linear, attention) = stack(a);
    if (per_op_recompute) {
      // The recomputed matmuls alone; attention's output is kept.
      linear = sum_over_layers(
                   a, layer_begin, layer_end,
                   [](const TransformerArch& layer) {
                     return 2.0 * static_cast<double>(per_op_recomputed_matmul_parameters(layer));
                   }) *
               tokens_local / tp_shard;
      attention = 0;
    } else if (const TransformerArch& real =
                   *real_model_.modules[static_cast<std::size_t>(m.index)].transformer;
               real.heads != a.heads) {
      const auto [real_linear, real_attention] = stack(real);
      padded_linear = linear - real_linear;
      padded_attention = attention - real_attention;
    }
    weights = sum_over_layers(a, layer_begin, layer_end, [&](const TransformerArch& layer) {
      return layer_parameters(layer, tp, l.ep, split_etp(m));
    });
    if (layers > 0) op.attention_pairs = pairs_local;
    // Full recomputation checkpoints the transformer layers only (Megatron-LM's checkpointed
    // layer stack, Hugging Face's gradient checkpointing): the head, its loss and the front end
    // keep their forward activations and are not run again.
    const bool recomputed = phase == Phase::kR;
    // Multi-token-prediction layers project their inputs back to the hidden width; each ends in
    // the output head and loss, as the stack does (heads).
    const int64_t mtp = mtp_layers_in(a, layer_begin, layer_end);
    linear += static_cast<double>(mtp) * 2.0 * static_cast<double>(mtp_projection_parameters(a)) *
              tokens_local / tp_shard;
    weights += static_cast<double>(mtp) * mtp_extra_parameters(a, tp);
    const double heads =
        a.vocab > 0 && !recomputed ? static_cast<double>((last_chunk ? 1 : 0) + mtp) : 0.0;
    if (heads > 0) {
      op.flags |= kOpHead;
      if (phase != Phase::kW)
        op.logits = heads * tokens_local * static_cast<double>(a.vocab) / tp_shard;
      linear += heads * 2.0 * static_cast<double>(a.hidden * a.vocab) * tokens_local / tp_shard;
      // A tied head multiplies with the input side's embedding.
      if (a.tied_embeddings) weights += static_cast<double>(a.hidden * a.vocab) / tp_shard;
    }
    if (last_chunk && !recomputed) weights += output_side_parameters(spec, tp);
    if (first_chunk && (a.vocab > 0 || spec.patching || spec.audio) && !recomputed)
      op.flags |= kOpFrontEnd;
    if (first_chunk && (spec.patching || spec.audio) && !recomputed) {
      // Patch / conv front end, counted per encoder token.
      ModuleSpec front = spec;
      front.transformer->layers = 0;
      front.transformer->mtp_layers = 0;
      front.transformer->vocab = 0;
      linear += forward_flops_per_token(front, 0) * tokens_local / tp_shard;
      weights += input_side_parameters(front, tp);
    }
    // Nested collectives of the layer stack.
    const double act = tokens_local * static_cast<double>(a.hidden) * dtype;
    // Routed experts whole on each TP rank (expert TP 1) take that rank's own tokens: an MoE
    // layer without a shared expert gathers nothing over TP for its MLP.
    const bool whole_experts = a.experts > 0 && split_etp(m) < tp;
    if (whole_experts) op.flags |= kOpExpertsWhole;
    const int64_t ungathered =
        whole_experts && a.shared_expert_ffn == 0 ? moe_layers(a, layer_begin, layer_end) : 0;
    if (phase != Phase::kW && tp > 1) {
      const int32_t g = tp_group(layout_owner, x);
      if (sequence_parallel) {
        const auto calls = static_cast<int32_t>(2 * layers - ungathered);
        // FP8 GEMMs (Transformer Engine, torchao) cast the column-parallel matrices' inputs before
        // gathering them: the forward's all-gathers (and its recomputation's) carry a byte a
        // value, blockwise scaling an fp32 scale per 128 more. The backward's (the row-parallel
        // outputs' gradients) stay 16-bit.
        const bool fp8_inputs = (op.flags & kOpFp8) != 0 && phase != Phase::kB;
        const double block_scales = (op.flags & kOpFp8BlockScaling) != 0 ? 4.0 / 128.0 : 0.0;
        op.nested.push_back({CollectiveKind::kAllGather, Purpose::kTp, g, calls,
                             fp8_inputs ? act / dtype * (1.0 + block_scales) : act});
        // Per-op checkpointing keeps the reduce-scatters' outputs.
        if (!per_op_recompute)
          op.nested.push_back({CollectiveKind::kReduceScatter, Purpose::kTp, g, calls, act});
        // Megatron-LM (and Transformer Engine's linears) keeps a column-parallel matrix's input
        // sharded for the backward and gathers it again there for the weight gradient, beside
        // the input-gradient GEMM (CostModel::hidden_regather_s); in the dtype the forward
        // gathered. PyTorch's tensor parallelism keeps the gathered input instead.
        if (phase == Phase::kB && m.flow.trainable && plan_.framework != Framework::kPytorch)
          op.nested.push_back(
              {CollectiveKind::kAllGather, Purpose::kTp, g, calls,
               (op.flags & kOpFp8) != 0 ? act / dtype * (1.0 + block_scales) : act});
      } else {
        op.nested.push_back(
            {CollectiveKind::kAllReduce, Purpose::kTp, g, static_cast<int32_t>(2 * layers), act});
      }
    }
    // FP8 delayed scaling: each forward of the layer stack (one autocast region, as Megatron-LM
    // wraps a chunk) ends by reducing its FP8 GEMMs' current amaxes (inputs and weights) by MAX
    // over the stage's TP, CP and DP ranks, and the backward the output gradients' likewise; a
    // recomputation reuses the forward's scales. An fp32 value each. A chunk run in pieces
    // (gradient buckets, FSDP units) reduces once: after the piece that ends its forward, and
    // after the one that ends its backward (the piece holding its first layer).
    const bool delayed =
        (op.flags & kOpFp8) != 0 && (op.flags & (kOpFp8CurrentScaling | kOpFp8BlockScaling)) == 0;
    const bool region_ends = phase == Phase::kF   ? layer_end == held.second
                             : phase == Phase::kB ? layer_begin == held.first
                                                  : false;
    if (delayed && layers > 0 && region_ends) {
      const int32_t g = stage_group(layout_owner, x);
      if (p_.groups[static_cast<std::size_t>(g)].size() > 1) {
        // The region's GEMMs: its chunk's every layer, whatever piece of it this op runs.
        const auto moe = static_cast<double>(moe_layers(a, held.first, held.second));
        const auto region = static_cast<double>(held.second - held.first);
        const double local_experts =
            a.experts > 0 ? std::max(1.0, static_cast<double>(a.experts) /
                                              static_cast<double>(std::max<int64_t>(1, l.ep)))
                          : 0.0;
        const double gemms = 4.0 * (region - moe) +
                             moe * (2.0 + 2.0 * local_experts + (a.shared_expert_ffn > 0 ? 2 : 0));
        op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kAmax, g, 1,
                             gemms * (phase == Phase::kF ? 2.0 : 1.0) * 4.0});
      }
    }
    if (a.vocab > 0 && tp > 1) {
      // Vocabulary-parallel embedding and loss: the embedding's partial rows are all-reduced in
      // the forward (its backward is local); the loss all-reduces three fp32 numbers per token
      // (max logit, sum of exponentials, target logit) and the head's input gradient.
      // Under sequence parallelism (Megatron-LM's) the layers between hold 1/tp of the tokens:
      // a text-only model's embedding reduce-scatters its partial rows instead, one whose
      // sequence takes encoders' rows all-reduces its text rows, merges them and keeps its
      // share; either way the backward gathers the shares' gradients. The head gathers its
      // input (forward), reduce-scatters its input gradient and gathers its input again for its
      // weight gradient (backward), as a column-parallel linear of the layers does. Nested
      // before the layer stack's collectives, whose second gather stays the op's last.
      const int32_t g = tp_group(layout_owner, x);
      const bool sp = sequence_parallel;
      const double text_rows = static_cast<double>(work.text_tokens) / static_cast<double>(l.cp) *
                               static_cast<double>(a.hidden) * dtype;
      std::vector<NestedCollective> vocab;
      if (first_chunk && phase == Phase::kF)
        vocab.push_back(
            sp && spec.inputs.empty()
                ? NestedCollective{CollectiveKind::kReduceScatter, Purpose::kTp, g, 1, text_rows}
                : NestedCollective{CollectiveKind::kAllReduce, Purpose::kTp, g, 1, text_rows});
      if (sp && first_chunk && phase == Phase::kB)
        vocab.push_back({CollectiveKind::kAllGather, Purpose::kTp, g, 1, act});
      const auto losses = static_cast<int32_t>(heads);
      if (losses > 0 && phase == Phase::kF) {
        if (sp) vocab.push_back({CollectiveKind::kAllGather, Purpose::kTp, g, losses, act});
        vocab.push_back(
            {CollectiveKind::kAllReduce, Purpose::kTp, g, 3 * losses, tokens_local * 4.0});
      }
      if (losses > 0 && phase == Phase::kB) {
        if (!sp) {
          vocab.push_back({CollectiveKind::kAllReduce, Purpose::kTp, g, losses, act});
        } else {
          vocab.push_back({CollectiveKind::kReduceScatter, Purpose::kTp, g, losses, act});
          if (m.flow.trainable && plan_.framework != Framework::kPytorch)
            vocab.push_back({CollectiveKind::kAllGather, Purpose::kTp, g, losses, act});
        }
      }
      op.nested.insert(op.nested.begin(), vocab.begin(), vocab.end());
    }
    if (phase != Phase::kW && l.cp > 1 && layers > 0 && !replicated_over_cp) {
      // K/V of the whole sequence gathered per layer (ring exchange has the same volume);
      // backward reduce-scatters their gradients.
      const double kv = static_cast<double>(work.tokens) * static_cast<double>(key_value_width(a)) *
                        dtype / tp_shard;
      op.nested.push_back(
          {phase == Phase::kB ? CollectiveKind::kReduceScatter : CollectiveKind::kAllGather,
           Purpose::kCp, cp_group(layout_owner, x), static_cast<int32_t>(layers), kv});
    }
    const int64_t moe = moe_layers(a, layer_begin, layer_end);
    if (l.ep > 1 && moe > 0) {
      // Every layer tells each EP rank how many tokens it sends each of its experts (a small
      // all-to-all, forward only), dispatches each token's hidden vector to its top-k experts'
      // ranks and combines their outputs back (all-to-all; backward the same for the
      // gradients). Each TP rank sends its own copy of the tokens, 1/tp of them under sequence
      // parallelism. The busiest rank under a skewed router receives and computes more than its
      // even share, and the group waits for it.
      const double busiest = busiest_expert_load(m.index, layer_begin, layer_end);
      const double routed_flops =
          static_cast<double>(moe) * 2.0 *
          static_cast<double>(a.top_k * (a.gated_ffn ? 3 : 2) * a.hidden * a.moe_ffn) *
          tokens_local / tp_shard;
      // Recomputing an MoE layer whole (recompute_modules moe) routes, dispatches, computes and
      // combines again before the backward.
      const bool rerouted = phase == Phase::kB && (op.flags & kOpMoeRecompute) != 0;
      op.expert_wait_flops = routed_flops * (busiest - 1.0) * (rerouted ? 2.0 : 1.0);
      const int32_t g = ep_group(layout_owner, x);
      if (plan_.moe_a2a_overlap) op.flags |= kOpEpCommOverlap;
      // DeepEP's kernels move the tokens (and exchange the counts) themselves; HybridEP moves
      // them as DeepEP does, at its own rate, after all-gathering every rank's routing map, a
      // byte per token and expert, over NCCL.
      const bool deepep = plan_.moe_dispatcher != MoeDispatcher::kAllToAll;
      const bool hybridep = plan_.moe_dispatcher == MoeDispatcher::kHybridEp;
      const Transport transport = hybridep ? Transport::kHybridEp
                                  : deepep ? Transport::kDeepEp
                                           : Transport::kNccl;
      const double sp_share = sequence_parallel ? tp_shard : 1.0;
      if (phase == Phase::kF || phase == Phase::kR || rerouted) {
        if (hybridep)
          op.nested.push_back(
              {CollectiveKind::kAllGather, Purpose::kEp, g, static_cast<int32_t>(moe),
               tokens_local / sp_share * static_cast<double>(a.experts), Transport::kNccl});
        else
          op.nested.push_back({CollectiveKind::kAllToAll, Purpose::kEp, g,
                               static_cast<int32_t>(moe), static_cast<double>(a.experts) * 8.0,
                               transport});
      }
      if (phase != Phase::kW) {
        // DeepEP sends a token once to each other node holding any of its experts.
        const double copies =
            deepep ? node_deduplicated_share(
                         group_span(cluster_, p_.groups[static_cast<std::size_t>(g)]),
                         {a.top_k, a.router_groups, a.router_group_top_k})
                   : 1.0;
        const double routed = tokens_local * static_cast<double>(a.top_k * a.hidden) * dtype /
                              sp_share * std::max(1.0, busiest) * copies;
        // Each pass sends tokens to their experts once (the forward's dispatch, the backward's
        // output gradients) and back once; with FP8 dispatch the first carries one byte a
        // value and an fp32 scale per 128.
        const auto calls = static_cast<int32_t>((rerouted ? 2 : 1) * moe);
        const double to_experts =
            plan_.moe_fp8_dispatch ? routed / dtype * (1.0 + 4.0 / 128.0) : routed;
        op.nested.push_back(
            {CollectiveKind::kAllToAll, Purpose::kEp, g, calls, to_experts, transport});
        op.nested.push_back({CollectiveKind::kAllToAll, Purpose::kEp, g, calls, routed, transport});
        // The all-to-all dispatcher sends each routed copy's router probability beside it, in
        // an all-to-all of its own (the backward returns their gradients); DeepEP and HybridEP
        // carry them with the tokens.
        if (!deepep)
          op.nested.push_back({CollectiveKind::kAllToAll, Purpose::kEp, g, calls,
                               routed / static_cast<double>(a.hidden), transport});
      }
    }
  }
  // A projector takes its encoder's tokens (tokens_local) and hands on as many, or its
  // resampler's queries per piece.
  const double out_local = static_cast<double>(work.output_tokens) / cp_split;
  if (spec.projector) {
    const ProjectorArch& pr = *spec.projector;
    const ProjectorFlops f = projector_forward_flops(pr, tokens_local, out_local, tp);
    linear += f.linear;
    attention += f.attention;
    weights += projector_parameters(pr, tp);
    // Split over TP, forward: the row-parallel output; backward: the input gradient, when one
    // flows back.
    if ((phase == Phase::kF || phase == Phase::kR ||
         (phase == Phase::kB && m.flow.needs_input_grad)) &&
        tp > 1 && projector_splits(pr))
      op.nested.push_back({CollectiveKind::kAllReduce, Purpose::kTp, tp_group(layout_owner, x), 1,
                           out_local * static_cast<double>(pr.out) * dtype});
  }
  op.flops = phase_flops(linear, attention, phase);
  // Selective recomputation's submodules run their matrices again before the backward.
  if (spec.transformer && phase == Phase::kB && plan_.recompute == Recompute::kSelective &&
      !per_op_recompute)
    op.flops +=
        sum_over_layers(*spec.transformer, layer_begin, layer_end,
                        [&](const TransformerArch& layer) {
                          return 2.0 * static_cast<double>(selective_recomputed_matmul_parameters(
                                           layer, plan_.recompute_modules));
                        }) *
        tokens_local / tp_shard;
  op.padded_flops = phase_flops(padded_linear, padded_attention, phase);
  op.memory_bytes = weights * dtype;
  if (phase == Phase::kF && m.flow.backward()) {
    // Activations kept for backward (flash attention: no s x s scores).
    double stash = 0;
    if (spec.transformer && layers > 0) {
      ActivationOptions o;
      o.tp = tp;
      o.sequence_parallel = sequence_parallel;
      o.flash_attention = plan_.flash_attention || (plan_.recompute == Recompute::kSelective &&
                                                    (plan_.recompute_modules & kRecomputeCoreAttn));
      o.bytes_per_value = dtype_bytes(model_.dtype);
      o.fp8_linear_inputs = (op.flags & kOpFp8) != 0;
      o.per_op_checkpoint = plan_.recompute == Recompute::kPerOp;
      if (plan_.recompute == Recompute::kSelective) o.recompute_modules = plan_.recompute_modules;
      const double seq = work.samples > 0
                             ? static_cast<double>(work.tokens) / static_cast<double>(work.samples)
                             : 0;
      // Full recomputation keeps a recomputed layer's input alone; the layers of a chunk past
      // plan.recompute_layers keep everything.
      const int64_t kept_from = plan_.recompute == Recompute::kFull
                                    ? std::clamp(recompute_end(m, k_chunk), layer_begin, layer_end)
                                    : layer_begin;
      const double per_token =
          static_cast<double>(spec.transformer->hidden) * dtype /
              (sequence_parallel ? tp_shard : 1.0) * static_cast<double>(kept_from - layer_begin) +
          sum_over_layers(*spec.transformer, kept_from, layer_end,
                          [&](const TransformerArch& layer) {
                            return activation_bytes_per_token_per_layer(layer, seq, o);
                          });
      stash += per_token * tokens_local;
    }
    if (spec.projector)
      stash += projector_stash_values(*spec.projector, tokens_local, out_local, tp) * dtype;
    op.stash_bytes = stash;
  }
  return op;
}

double Lowering::boundary_bytes(int producer_last, int consumer,
                                std::span<const Sample* const> samples) {
  const ModuleSpec& p = *modules_[static_cast<std::size_t>(producer_last)].spec;
  const ModuleSpec& c = *modules_[static_cast<std::size_t>(consumer)].spec;
  const ModuleWork& w = work_of(producer_last, samples);
  // The consumer's input width: an LLM's hidden size, a projector's input (an encoder's merged
  // tokens); else the producing projector's output.
  const int64_t width = c.transformer ? c.transformer->hidden
                        : c.projector ? c.projector->in
                        : p.projector ? p.projector->out
                                      : 0;
  // DeepStack: each copy's output travels beside the projector's.
  const int64_t copies = p.projector ? 1 + p.projector->deepstack : 1;
  return static_cast<double>(w.output_tokens * width * copies * dtype_bytes(model_.dtype));
}

}  // namespace tessera::lowering

#include "exec/plain_loop.hpp"

#include <chrono>
#include <cmath>

#include "exec/device.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/microbatch.hpp"

namespace tessera::exec {

std::vector<PlainStep> run_plain_loop(const Scenario& s, const TrainOptions& options,
                                      int64_t steps) {
  const ModelSpec& model = s.model;
  TESSERA_CHECK(world_size(*s.plan, model) == 1, "the plain loop runs single-rank plans");
  TESSERA_CHECK(
      find_llm(model)->inputs.size() <= 1 && encoder_for(model, Modality::kAudio) == nullptr,
      "the plain loop runs an image or video encoder -> projector -> LLM chain");
  static const Comm alone{{0}, 0, {}};
  const ModuleSpec* llm_spec = find_llm(model);
  const ModuleSpec* encoder_spec =
      llm_spec->inputs.empty() ? nullptr
                               : source_encoder(model, *find_module(model, llm_spec->inputs[0]));
  const ModuleSpec* projector_spec = nullptr;
  for (const ModuleSpec& m : model.modules)
    if (m.role == ModuleRole::kProjector) projector_spec = &m;
  auto layers = [](const ModuleSpec* m) { return m->transformer ? m->transformer->layers : 0; };
  Stage llm(*llm_spec, 0, layers(llm_spec), options.seed, alone);
  std::unique_ptr<Stage> encoder, projector;
  if (encoder_spec != nullptr) {
    encoder = std::make_unique<Stage>(*encoder_spec, 0, layers(encoder_spec), options.seed, alone);
    projector = std::make_unique<Stage>(*projector_spec, 0, 0, options.seed, alone);
  }
  std::vector<torch::Tensor> params;
  for (Stage* st : {encoder.get(), projector.get(), &llm})
    if (st != nullptr)
      for (const Param& p : st->params())
        if (p.tensor.requires_grad()) params.push_back(p.tensor);
  torch::optim::AdamWOptions o(options.lr);
  o.betas({options.beta1, options.beta2}).eps(options.eps).weight_decay(options.weight_decay);
  torch::optim::AdamW optimizer(params, o);
  const int64_t microbatches = micro_batches(*s.plan, model, s.workload);
  std::vector<PlainStep> out;
  for (int64_t step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    const TrainBatch batch = make_batch(s, options.dataset, step);
    const auto assignment = assign_microbatches(batch.batch, model, 1, microbatches,
                                                s.plan->microbatching, s.workload.max_seq_len);
    for (torch::Tensor& p : params) p.mutable_grad() = torch::zeros_like(p);
    double loss = 0;
    for (const std::vector<int32_t>& samples : assignment[0]) {
      LlmLayout layout =
          llm_layout(model, batch, samples, s.workload.max_seq_len, s.plan->pad_to_longest);
      torch::Tensor media = torch::zeros({0, llm_spec->transformer->hidden}, activation_options());
      if (encoder) {
        torch::Tensor features;
        {
          torch::AutoGradMode graph(encoder->trainable());
          features = encoder->encode(micro_batch_pieces(model, *encoder_spec, batch, samples));
        }
        media = projector->project(features);
      }
      AttentionInputs attention;
      attention.blocks = attention_blocks(layout);
      move_to_device(layout);
      attention.positions_q = layout.positions;
      const torch::Tensor everything = torch::arange(layout.tokens, on_device(torch::kInt64));
      torch::Tensor h = llm.embed(layout.ids, layout.text_slots, media, layout.media_slots,
                                  layout.media_rows, everything, attention);
      h = llm.blocks(h, attention);
      const torch::Tensor l =
          llm.loss_sum(h, layout.targets, attention) / static_cast<double>(batch.targets);
      l.backward();
      loss += l.item<double>();
    }
    double norm2 = 0;
    for (const torch::Tensor& p : params)
      norm2 += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
    const double norm = std::sqrt(norm2);
    if (options.clip > 0 && norm > options.clip)
      for (torch::Tensor& p : params) p.mutable_grad().mul_(options.clip / (norm + 1e-6));
    optimizer.step();
    out.push_back(
        {loss, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
  }
  return out;
}

}  // namespace tessera::exec

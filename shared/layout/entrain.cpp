#include "shared/layout/entrain.hpp"

#include <algorithm>
#include <numeric>
#include <set>

#include "shared/base/check.hpp"
#include "shared/model/gradient_flow.hpp"
#include "shared/model/model_math.hpp"

namespace tessera {

double sample_module_flops(const ModelSpec& model, const ModuleSpec& module, const Sample& sample,
                           int64_t max_seq_len, std::span<const Phase> phases) {
  if (!module.transformer) return 0;
  const Sample* one[] = {&sample};
  const ModuleWork w = module_work(model, module, one, max_seq_len);
  if (w.tokens <= 0) return 0;
  const double tokens = static_cast<double>(w.tokens);
  const double forward = tokens * forward_flops_per_token(module, w.attention_pairs / tokens);
  const double attention = static_cast<double>(module.transformer->layers) *
                           layer_attention_flops(*module.transformer, w.attention_pairs);
  double flops = 0;
  for (Phase p : phases) flops += phase_flops(forward - attention, attention, p);
  return flops;
}

double encoder_work_share(const ModelSpec& model, const WorkloadSpec& workload, int64_t batches) {
  TESSERA_CHECK(batches >= 1);
  // Phases per module: a trainable module runs F, B and W; one that passes gradients F and B;
  // else F only.
  const std::vector<GradientFlow> flow = gradient_flow(model);
  static constexpr Phase kAll[] = {Phase::kF, Phase::kB, Phase::kW};
  std::vector<std::span<const Phase>> phases(model.modules.size());
  for (std::size_t i = 0; i < model.modules.size(); ++i)
    phases[i] = std::span<const Phase>(kAll, flow[i].trainable ? 3 : flow[i].backward() ? 2 : 1);
  double encoders = 0, total = 0;
  for (int64_t it = 0; it < batches; ++it) {
    const Batch b = draw_batch(workload, it);
    for (const Sample& s : b.samples)
      for (std::size_t i = 0; i < model.modules.size(); ++i) {
        const ModuleSpec& m = model.modules[i];
        if (m.role != ModuleRole::kEncoder && m.role != ModuleRole::kLlm) continue;
        const double w = sample_module_flops(model, m, s, workload.max_seq_len, phases[i]);
        total += w;
        if (m.role == ModuleRole::kEncoder) encoders += w;
      }
  }
  return total > 0 ? encoders / total : 0;
}

namespace {

// Level 1: LPT of `block` over `m` micro-batches by `work`; ties go to the micro-batch with
// fewer samples, then the lower index, so each of the first m samples opens its own.
std::vector<std::vector<int32_t>> lpt(const std::vector<int32_t>& block,
                                      const std::vector<double>& work, int64_t m) {
  std::vector<int32_t> order = block;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return work[static_cast<std::size_t>(a)] > work[static_cast<std::size_t>(b)];
  });
  std::vector<std::vector<int32_t>> out(static_cast<std::size_t>(m));
  std::vector<double> load(static_cast<std::size_t>(m), 0);
  for (int32_t sample : order) {
    std::size_t best = 0;
    for (std::size_t j = 1; j < out.size(); ++j)
      if (load[j] < load[best] || (load[j] == load[best] && out[j].size() < out[best].size()))
        best = j;
    out[best].push_back(sample);
    load[best] += work[static_cast<std::size_t>(sample)];
  }
  for (auto& mb : out) std::sort(mb.begin(), mb.end());
  return out;
}

// Level 2: defer LLM excess to the next micro-batch, in schedule order. A sample moves only
// when that lowers the larger of the two micro-batches' LLM work, so no move raises the
// largest micro-batch of the iteration, and at most once, so an encoder micro-batch's
// gradients are complete one LLM micro-batch after its own (the pipeline schedules rely on it).
std::vector<std::vector<int32_t>> defer(std::vector<std::vector<int32_t>> mbs,
                                        const std::vector<double>& llm, double slack) {
  auto work = [&](const std::vector<int32_t>& mb) {
    double w = 0;
    for (int32_t s : mb) w += llm[static_cast<std::size_t>(s)];
    return w;
  };
  double total = 0;
  for (const auto& mb : mbs) total += work(mb);
  const double target = total / static_cast<double>(mbs.size());
  std::set<int32_t> deferred;
  for (std::size_t j = 0; j + 1 < mbs.size(); ++j) {
    auto& mb = mbs[j];
    auto& next = mbs[j + 1];
    double load = work(mb), next_load = work(next);
    // Largest LLM work first; never the micro-batch's last sample.
    std::vector<int32_t> order = mb;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return llm[static_cast<std::size_t>(a)] > llm[static_cast<std::size_t>(b)];
    });
    for (int32_t s : order) {
      if (load <= target * (1 + slack) || mb.size() <= 1) break;
      if (deferred.count(s) > 0) continue;  // once at most
      const double w = llm[static_cast<std::size_t>(s)];
      if (std::max(load - w, next_load + w) >= std::max(load, next_load)) continue;
      std::erase(mb, s);
      next.push_back(s);
      deferred.insert(s);
      load -= w;
      next_load += w;
    }
  }
  for (auto& mb : mbs) std::sort(mb.begin(), mb.end());
  return mbs;
}

}  // namespace

EntrainAssignment entrain_assignment(const Batch& batch, const ModelSpec& model, int64_t replicas,
                                     int64_t microbatches, int64_t max_seq_len, double slack) {
  TESSERA_CHECK(replicas >= 1 && microbatches >= 1 && slack >= 0);
  const auto n = static_cast<int64_t>(batch.samples.size());
  std::vector<double> encoder(static_cast<std::size_t>(n), 0), llm(static_cast<std::size_t>(n), 0);
  const ModuleSpec* llm_module = find_llm(model);
  for (int64_t i = 0; i < n; ++i) {
    const Sample& s = batch.samples[static_cast<std::size_t>(i)];
    for (const ModuleSpec& m : model.modules)
      if (m.role == ModuleRole::kEncoder)
        encoder[static_cast<std::size_t>(i)] += sample_module_flops(model, m, s, max_seq_len);
    if (llm_module != nullptr)
      llm[static_cast<std::size_t>(i)] = sample_module_flops(model, *llm_module, s, max_seq_len);
  }
  EntrainAssignment out;
  for (int64_t d = 0; d < replicas; ++d) {
    const int64_t begin = d * n / replicas, end = (d + 1) * n / replicas;
    std::vector<int32_t> block(static_cast<std::size_t>(end - begin));
    std::iota(block.begin(), block.end(), static_cast<int32_t>(begin));
    double encoder_total = 0;
    for (int32_t s : block) encoder_total += encoder[static_cast<std::size_t>(s)];
    auto level1 = lpt(block, encoder_total > 0 ? encoder : llm, microbatches);
    out.llm.push_back(defer(level1, llm, slack));
    out.encoder.push_back(std::move(level1));
  }
  return out;
}

}  // namespace tessera

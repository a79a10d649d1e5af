// Entrain's hierarchical micro-batch assignment: hand cases for both levels, and invariants on
// drawn batches — every sample once per level, within its replica and the iteration, no empty
// micro-batch, level 2 never raises the largest micro-batch's LLM work.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>

#include "shared/layout/entrain.hpp"
#include "shared/layout/scenario.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/search/stage_split.hpp"

using namespace tessera;

namespace {

Scenario tiny() {
  Diagnostics diag;
  auto s = load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny.json", diag);
  INFO(diag.format());
  REQUIRE(s.has_value());
  return *s;
}

Sample sample(int64_t text, int images) {
  Sample s;
  s.text_tokens = text;
  for (int i = 0; i < images; ++i) s.images.push_back({32, 32});
  return s;
}

double load(const std::vector<int32_t>& mb, const std::vector<double>& work) {
  double w = 0;
  for (int32_t s : mb) w += work[static_cast<std::size_t>(s)];
  return w;
}

}  // namespace

TEST_CASE("entrain level 1: LPT by encoder work, each of the first M samples opens a micro-batch") {
  const Scenario s = tiny();
  Batch b;
  for (int images : {1, 4, 0, 2, 0, 1, 0, 0}) b.samples.push_back(sample(40, images));
  const EntrainAssignment a = entrain_assignment(b, s.model, 1, 4, s.workload.max_seq_len);
  REQUIRE(a.encoder.size() == 1);
  // Largest first: 4 images (sample 1) alone; 2 (sample 3) alone; then the two single images
  // (0, 5) each with the text-only samples dealt to the least-loaded, fewer-samples micro-batch.
  const std::vector<std::vector<int32_t>> expected = {{1}, {3}, {0, 2, 6}, {4, 5, 7}};
  CHECK(a.encoder.front() == expected);
}

TEST_CASE("entrain level 2: LLM excess moves to the next micro-batch, never raising the largest") {
  const Scenario s = tiny();
  Batch b;
  // One image each (level 1 deals in arrival order, round robin), text lengths uneven: micro-
  // batch 0 gets samples 0 and 4 (both long), the others short ones.
  for (int64_t text : {400, 20, 20, 20, 400, 20, 20, 20}) b.samples.push_back(sample(text, 1));
  const EntrainAssignment a = entrain_assignment(b, s.model, 1, 4, s.workload.max_seq_len);
  const std::vector<std::vector<int32_t>> level1 = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  CHECK(a.encoder.front() == level1);
  std::vector<double> llm;
  for (const Sample& x : b.samples)
    llm.push_back(sample_module_flops(s.model, *find_llm(s.model), x, s.workload.max_seq_len));
  // Micro-batch 0 defers one long sample (0) to micro-batch 1, which then defers its short
  // ones (1, 5) rather than the long one (that would not lower the larger of the two), and so on:
  // each long sample ends up alone, the short ones share the rest.
  const std::vector<std::vector<int32_t>> level2 = {{4}, {0}, {1, 5, 6}, {2, 3, 7}};
  CHECK(a.llm.front() == level2);
  double before = 0, after = 0;
  for (const auto& mb : level1) before = std::max(before, load(mb, llm));
  for (const auto& mb : level2) after = std::max(after, load(mb, llm));
  CHECK(after < 0.75 * before);
  // With unbounded slack nothing is deferred.
  CHECK(entrain_assignment(b, s.model, 1, 4, s.workload.max_seq_len, 1e9).llm.front() == level1);
}

TEST_CASE(
    "entrain: invariants on drawn batches (replicas, every sample once, no empty micro-batch)") {
  const Scenario s = tiny();
  WorkloadSpec w = s.workload;
  w.global_batch = 48;
  for (int64_t iteration = 0; iteration < 20; ++iteration) {
    const Batch b = draw_batch(w, iteration);
    std::vector<double> llm;
    for (const Sample& x : b.samples)
      llm.push_back(sample_module_flops(s.model, *find_llm(s.model), x, w.max_seq_len));
    for (int64_t replicas : {1, 2, 4})
      for (int64_t m : {1, 3, 6}) {
        const EntrainAssignment a = entrain_assignment(b, s.model, replicas, m, w.max_seq_len);
        REQUIRE(static_cast<int64_t>(a.encoder.size()) == replicas);
        REQUIRE(static_cast<int64_t>(a.llm.size()) == replicas);
        for (int64_t d = 0; d < replicas; ++d) {
          const int64_t begin = d * 48 / replicas, end = (d + 1) * 48 / replicas;
          for (const MicrobatchAssignment* level : {&a.encoder, &a.llm}) {
            const auto& mbs = (*level)[static_cast<std::size_t>(d)];
            REQUIRE(static_cast<int64_t>(mbs.size()) == m);
            std::multiset<int32_t> seen;
            for (const auto& mb : mbs) {
              CHECK(!mb.empty());
              CHECK(std::is_sorted(mb.begin(), mb.end()));
              seen.insert(mb.begin(), mb.end());
            }
            // Every sample of the replica's block exactly once: nothing leaves the iteration.
            std::multiset<int32_t> block;
            for (int64_t i = begin; i < end; ++i) block.insert(static_cast<int32_t>(i));
            CHECK(seen == block);
          }
          // A sample reaches the LLM in its encoder micro-batch or the next one.
          std::map<int32_t, int64_t> level1_of;
          for (int64_t j = 0; j < m; ++j)
            for (int32_t x : a.encoder[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)])
              level1_of[x] = j;
          for (int64_t j = 0; j < m; ++j)
            for (int32_t x : a.llm[static_cast<std::size_t>(d)][static_cast<std::size_t>(j)])
              CHECK((j == level1_of[x] || j == level1_of[x] + 1));
          double before = 0, after = 0;
          for (const auto& mb : a.encoder[static_cast<std::size_t>(d)])
            before = std::max(before, load(mb, llm));
          for (const auto& mb : a.llm[static_cast<std::size_t>(d)])
            after = std::max(after, load(mb, llm));
          CHECK(after <= before + 1e-6 * before);
        }
      }
  }
}

TEST_CASE("entrain static layout: the encoders' share of the training work over drawn batches") {
  Scenario s = tiny();
  // By hand: forward FLOPs of every drawn sample, the frozen ViT once, the trainable LLM three
  // times (F, B, W); the projector is neither.
  double encoder = 0, llm = 0;
  for (int64_t it = 0; it < 4; ++it)
    for (const Sample& x : draw_batch(s.workload, it).samples) {
      for (const ModuleSpec& m : s.model.modules)
        if (m.role == ModuleRole::kEncoder)
          encoder += sample_module_flops(s.model, m, x, s.workload.max_seq_len);
      llm += 3 * sample_module_flops(s.model, *find_llm(s.model), x, s.workload.max_seq_len);
    }
  const double frozen = encoder_work_share(s.model, s.workload, 4);
  CHECK(frozen > 0);
  CHECK(frozen == doctest::Approx(encoder / (encoder + llm)));
  // A trainable encoder does three times the work.
  for (ModuleSpec& m : s.model.modules)
    if (m.role == ModuleRole::kEncoder) m.frozen = false;
  CHECK(encoder_work_share(s.model, s.workload, 4) ==
        doctest::Approx(3 * encoder / (3 * encoder + llm)));
}

TEST_CASE("Entrain's work share counts FLOPs as the lowering does (one home: phase_flops)") {
  // On one rank, every op of a module is that module's whole work: the encoders' share of the
  // lowered F, B and W FLOPs must be the share Entrain computes from the samples.
  // With the LLM frozen too (feature-alignment pre-training) it runs F and B but no W: its
  // backward does the attention twice.
  for (const bool llm_frozen : {false, true}) {
    Scenario s = tiny();
    for (ModuleSpec& m : s.model.modules)
      if (m.role == ModuleRole::kLlm) m.frozen = llm_frozen;
    ParallelPlan plan = *s.plan;
    plan.placement = Placement::kHomogeneous;
    plan.modules.clear();
    plan.layout = ModuleLayout{};
    plan.num_micro_batches = 1;
    plan.micro_batch_size = s.workload.global_batch;
    plan.schedule = Schedule::k1F1B;
    plan.recompute = Recompute::kNone;
    const Batch batch = draw_batch(s.workload, 0);
    const Lowered lowered =
        lower(s.model, s.cluster, resolve_stage_split(plan, s.model, s.workload, s.cluster),
              s.workload, batch, nullptr);
    REQUIRE(lowered.error.empty());
    double encoders = 0, total = 0;
    for (const Op& op : lowered.program.ranks[0]) {
      if (op.kind != OpKind::kCompute || op.module < 0) continue;
      const ModuleSpec& m = s.model.modules[static_cast<std::size_t>(op.module)];
      if (m.role != ModuleRole::kEncoder && m.role != ModuleRole::kLlm) continue;
      total += op.flops;
      if (m.role == ModuleRole::kEncoder) encoders += op.flops;
    }
    REQUIRE(total > 0);
    INFO("LLM frozen: " << llm_frozen);
    CHECK(encoder_work_share(s.model, s.workload, 1) ==
          doctest::Approx(encoders / total).epsilon(1e-9));
  }
}

TEST_CASE("the Program carries the micro-batches it was lowered with (Entrain: both levels)") {
  Diagnostics diag;
  auto s =
      load_scenario(std::string(TESSERA_SOURCE_DIR) + "/scenarios/cpu-tiny-variable.json", diag);
  REQUIRE(s.has_value());
  for (const MicrobatchPolicy policy : {MicrobatchPolicy::kArrival, MicrobatchPolicy::kEntrain}) {
    ParallelPlan plan = *s->plan;
    plan.microbatching = policy;
    const Batch batch = draw_batch(s->workload, 0);
    const Lowered lowered =
        lower(s->model, s->cluster, resolve_stage_split(plan, s->model, s->workload, s->cluster),
              s->workload, batch, nullptr);
    REQUIRE(lowered.error.empty());
    const int64_t m = micro_batches(plan, s->model, s->workload);
    const int64_t dp = plan.layout.dp;
    if (policy == MicrobatchPolicy::kEntrain) {
      const EntrainAssignment a =
          entrain_assignment(batch, s->model, dp, m, s->workload.max_seq_len);
      CHECK(lowered.program.llm_microbatches == a.llm);
      CHECK(lowered.program.encoder_microbatches == a.encoder);
    } else {
      const MicrobatchAssignment a =
          assign_microbatches(batch, s->model, dp, m, policy, s->workload.max_seq_len);
      CHECK(lowered.program.llm_microbatches == a);
      CHECK(lowered.program.encoder_microbatches == a);
    }
  }
}

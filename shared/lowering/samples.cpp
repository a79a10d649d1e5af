// Lowering: the samples of each module's micro-batches and their work.
#include "shared/lowering/lowering.hpp"

namespace tessera::lowering {

void Lowering::assign_samples() {
  const ModuleInfo& llm = modules_[static_cast<std::size_t>(llm_)];
  entrain_ = plan_.microbatching == MicrobatchPolicy::kEntrain;
  if (entrain_) {
    EntrainAssignment a =
        entrain_assignment(batch_, model_, llm.layout.dp, microbatches_, workload_.max_seq_len);
    llm_assignment_ = std::move(a.llm);
    encoder_assignment_ = std::move(a.encoder);
  } else {
    llm_assignment_ = assign_microbatches(batch_, model_, llm.layout.dp, microbatches_,
                                          plan_.microbatching, workload_.max_seq_len);
    encoder_assignment_ = llm_assignment_;
  }
  p_.llm_microbatches = llm_assignment_;
  p_.encoder_microbatches = encoder_assignment_;
  // Encoder micro-batch i is done with the LLM micro-batch that takes its last sample (i, or
  // i + 1 when Entrain deferred one).
  for (std::size_t d = 0; d < llm_assignment_.size(); ++d) {
    std::map<int32_t, int32_t> llm_mb_of;
    for (std::size_t j = 0; j < llm_assignment_[d].size(); ++j)
      for (int32_t sample : llm_assignment_[d][j]) llm_mb_of[sample] = static_cast<int32_t>(j);
    auto& done = encoder_done_.emplace_back(llm_assignment_[d].size());
    for (std::size_t i = 0; i < encoder_assignment_[d].size(); ++i) {
      int32_t last = static_cast<int32_t>(i);
      for (int32_t sample : encoder_assignment_[d][i]) last = std::max(last, llm_mb_of.at(sample));
      done[static_cast<std::size_t>(last)].push_back(static_cast<int32_t>(i));
    }
  }
  p_.samples = static_cast<int64_t>(batch_.samples.size());
  std::vector<const Sample*> all;
  for (const Sample& s : batch_.samples) all.push_back(&s);
  p_.llm_tokens = module_work(model_, *llm.spec, all, workload_.max_seq_len).tokens;
}

// The samples a replica of `module` handles in micro-batch `mb` (-1: all its micro-batches):
// replica_samples() of the module's data-parallel degree (its host's, when it borrows ranks).
const std::vector<const Sample*>& Lowering::samples_of(int module, int64_t replica, int32_t mb,
                                                       bool encoder_level) {
  const ModuleInfo& m = modules_[static_cast<std::size_t>(module)];
  const int64_t dp =
      m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)].layout.dp : m.layout.dp;
  if (media_parallel(plan_, model_, *m.spec)) return media_of(module, dp, replica, mb);
  // Colocated encoders run the whole batch at once: only the LLM's micro-batches exist there.
  const bool level1 = entrain_ && plan_.placement != Placement::kColocated &&
                      (encoder_level || (m.spec->role != ModuleRole::kLlm &&
                                         m.spec->role != ModuleRole::kGenerator));
  const auto key = std::make_tuple(dp, replica, mb, level1);
  if (const auto it = sample_sets_.find(key); it != sample_sets_.end()) return it->second;
  std::vector<const Sample*>& out = sample_sets_[key];
  for (int32_t id :
       replica_samples(level1 ? encoder_assignment_ : llm_assignment_, dp, replica, mb))
    out.push_back(&batch_.samples[static_cast<std::size_t>(id)]);
  return out;
}

// Under encoder_data_parallel media: the items of the replica's share (assign_media) whose
// samples are in LLM micro-batch `mb` (-1: all), each sample's items as one sample of their own.
const std::vector<const Sample*>& Lowering::media_of(int module, int64_t dp, int64_t replica,
                                                     int32_t mb) {
  const ModuleSpec& encoder =
      *source_encoder(model_, *modules_[static_cast<std::size_t>(module)].spec);
  const int e = static_cast<int>(&encoder - model_.modules.data());
  const auto key = std::make_tuple(e, dp, replica, mb);
  if (const auto it = media_sets_.find(key); it != media_sets_.end()) return it->second;
  auto assignment = media_assignment_.find({e, dp});
  if (assignment == media_assignment_.end())
    assignment = media_assignment_
                     .emplace(std::make_pair(e, dp),
                              assign_media(batch_, model_, encoder, llm_assignment_, dp))
                     .first;
  const int64_t k = dp / static_cast<int64_t>(llm_assignment_.size());
  std::set<int32_t> in_mb;
  if (mb >= 0)
    for (int32_t id :
         llm_assignment_[static_cast<std::size_t>(replica / k)][static_cast<std::size_t>(mb)])
      in_mb.insert(id);
  std::vector<const Sample*>& out = media_sets_[key];
  const auto& pieces = assignment->second[static_cast<std::size_t>(replica)];
  for (std::size_t i = 0; i < pieces.size();) {
    const int32_t sample = pieces[i].sample;
    std::vector<int32_t> items;
    for (; i < pieces.size() && pieces[i].sample == sample; ++i) items.push_back(pieces[i].item);
    if (mb >= 0 && !in_mb.count(sample)) continue;
    const Sample& whole = batch_.samples[static_cast<std::size_t>(sample)];
    const Sample* part = &media_samples_.emplace_back(media_subset(model_, encoder, whole, items));
    media_parts_[part] = {sample, std::move(items)};
    out.push_back(part);
  }
  return out;
}

const std::vector<int32_t>& Lowering::encoder_microbatches_done(int64_t replica, int32_t mb) {
  return encoder_done_[static_cast<std::size_t>(replica)][static_cast<std::size_t>(mb)];
}

const ModuleWork& Lowering::work_of(int module, std::span<const Sample* const> samples) {
  // Sample sets come from samples_of(), whose vectors live as long as the lowering, so their
  // address identifies them (empty sets all have zero work).
  const auto key =
      std::make_tuple(module, static_cast<const void*>(samples.data()), samples.size());
  if (const auto it = work_cache_.find(key); it != work_cache_.end()) return it->second;
  return work_cache_[key] = module_work(model_, *modules_[static_cast<std::size_t>(module)].spec,
                                        samples, workload_.max_seq_len, plan_.pad_to_longest);
}

const Lowering::CpShare& Lowering::cp_share(std::span<const Sample* const> samples, int64_t cp,
                                            int64_t replica) {
  const auto key = std::make_tuple(static_cast<const void*>(samples.data()), samples.size(), cp);
  if (const auto it = cp_cache_.find(key); it != cp_cache_.end()) return it->second;
  const std::vector<TokenTag> tags = llm_token_tags(model_, samples, workload_.max_seq_len);
  const auto split =
      context_split(plan_.cp_split, tags, cp,
                    cp_linear_tiles(*modules_[static_cast<std::size_t>(llm_)].spec->transformer));
  auto max_over_mean = [](const std::vector<double>& w) {
    double most = 0, sum = 0;
    for (double x : w) {
      most = std::max(most, x);
      sum += x;
    }
    return sum > 0 ? most * static_cast<double>(w.size()) / sum : 1.0;
  };
  CpShare share;
  share.replica = replica;
  for (const auto& part : split) share.tokens.push_back(static_cast<double>(part.size()));
  share.pairs = cp_attention_work(tags, split);
  share.balance = max_over_mean(share.pairs);
  share.uniform_balance =
      plan_.cp_split == CpSplit::kUniform
          ? share.balance
          : max_over_mean(cp_attention_work(tags, context_split(CpSplit::kUniform, tags, cp)));
  return cp_cache_[key] = std::move(share);
}

}  // namespace tessera::lowering

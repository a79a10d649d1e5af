// Lowering: module grids, process groups and the per-stage schedule orders.
#include "shared/lowering/lowering.hpp"
#include "shared/model/expert_load.hpp"

namespace tessera::lowering {

int32_t Lowering::group(RankList members) {
  const auto [it, inserted] = group_ids_.emplace(members, static_cast<int32_t>(p_.groups.size()));
  if (inserted) p_.groups.push_back(std::move(members));
  return it->second;
}

void Lowering::place(const std::vector<PlacedModule>& placed) {
  flow_ = gradient_flow(model_);
  modules_.resize(model_.modules.size());
  for (const PlacedModule& pm : placed) {
    const int i = static_cast<int>(pm.module - model_.modules.data());
    ModuleInfo& m = modules_[static_cast<std::size_t>(i)];
    m.index = i;
    m.spec = pm.module;
    m.layout = pm.layout;
    m.first = pm.first_rank;
    m.flow = flow_[static_cast<std::size_t>(i)];
    if (m.spec->role == ModuleRole::kLlm) llm_ = i;
  }
  for (const PlacedModule& pm : placed)
    if (!pm.host.empty()) {
      const int i = static_cast<int>(pm.module - model_.modules.data());
      modules_[static_cast<std::size_t>(i)].host =
          static_cast<int>(find_module(model_, pm.host) - model_.modules.data());
    }
  TESSERA_CHECK(llm_ >= 0, "lower() needs an llm module");
  for (ModuleInfo& m : modules_) {
    // Layers of each virtual stage: explicit, or as even as possible (earlier stages take the
    // remainder). In a homogeneous plan only the LLM is split; encoders sit whole in stage 0,
    // except under DIP, where each encoder is a segment of one chunk per stage.
    const bool split =
        plan_.placement != Placement::kHomogeneous || m.index == llm_ || dip_encoder(m);
    const int64_t layers = m.spec->transformer ? m.spec->transformer->layers : 0;
    const int64_t chunks = !split ? 1 : dip_encoder(m) ? m.layout.pp : m.chunks();
    const auto dip_layers = dip_.layers.find(m.index);
    const bool dip_given = plan_.schedule == Schedule::kDip && dip_layers != dip_.layers.end();
    // A module without layers (a projector) borrows its host's layout but none of its layers.
    const bool plan_given =
        !m.layout.stage_layers.empty() && split && !dip_encoder(m) && layers > 0;
    const std::vector<int64_t> even = even_stage_layers(layers, chunks);
    int64_t begin = 0;
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t n = dip_given    ? dip_layers->second[static_cast<std::size_t>(k)]
                        : plan_given ? m.layout.stage_layers[static_cast<std::size_t>(k)]
                                     : even[static_cast<std::size_t>(k)];
      m.chunk_layers.emplace_back(begin, begin + n);
      begin += n;
    }
    // Multi-token-prediction layers run after the stack's last layer, in its chunk.
    if (m.spec->transformer && !m.chunk_layers.empty())
      m.chunk_layers.back().second += m.spec->transformer->mtp_layers;
  }
  grids_.resize(model_.modules.size());
  grid_index_.resize(model_.modules.size());
  for (ModuleGroups& g : rank_groups(plan_, placed)) {
    const auto i = static_cast<std::size_t>(find_module(model_, g.module) - model_.modules.data());
    GroupIndex& at = grid_index_[i];
    at.tp = group_index(g.tp, g.first_rank, g.size);
    at.cp = group_index(g.cp, g.first_rank, g.size);
    at.tpcp = group_index(g.tpcp, g.first_rank, g.size);
    at.dpcp = group_index(g.dpcp, g.first_rank, g.size);
    at.ep = group_index(g.ep, g.first_rank, g.size);
    at.edp = group_index(g.edp, g.first_rank, g.size);
    at.kv = group_index(g.kv, g.first_rank, g.size);
    at.stage = group_index(g.stages, g.first_rank, g.size);
    grids_[i] = std::move(g);
  }
  p_.world = static_cast<int32_t>(world_size(plan_, model_));
  p_.ranks.assign(static_cast<std::size_t>(p_.world), {});
  p_.memory.assign(static_cast<std::size_t>(p_.world), {});
  for (const ModuleSpec& m : model_.modules) p_.modules.push_back(m.name);
  microbatches_ = micro_batches(plan_, model_, workload_);
}

int64_t Lowering::graph_position(int module) const {
  // Longest path, in pipeline stages, from any source to the first stage of `module`.
  const ModuleSpec& spec = *modules_[static_cast<std::size_t>(module)].spec;
  int64_t best = 0;
  for (const std::string& in : spec.inputs) {
    const int i = static_cast<int>(find_module(model_, in) - model_.modules.data());
    const ModuleInfo& producer = modules_[static_cast<std::size_t>(i)];
    const int64_t own = producer.host >= 0 ? 0 : producer.layout.pp;
    best = std::max(best, graph_position(i) + own);
  }
  return best;
}

bool Lowering::feeds_interleaved(int module) const {
  const std::string& name = modules_[static_cast<std::size_t>(module)].spec->name;
  for (const ModuleInfo& consumer : modules_) {
    const auto& inputs = consumer.spec->inputs;
    const bool fed =
        std::find(inputs.begin(), inputs.end(), name) != inputs.end() ||
        std::any_of(modules_.begin(), modules_.end(), [&](const ModuleInfo& borrowed) {
          return borrowed.host == module &&
                 std::find(inputs.begin(), inputs.end(), borrowed.spec->name) != inputs.end();
        });
    if (!fed || consumer.index == module) continue;
    const ModuleInfo& owner =
        consumer.host >= 0 ? modules_[static_cast<std::size_t>(consumer.host)] : consumer;
    if (owner.index == module) continue;  // a projector on this module's own ranks
    if (owner.layout.vpp > 1 || feeds_interleaved(owner.index)) return true;
  }
  return false;
}

int64_t Lowering::graph_depth() const {
  int64_t depth = 0;
  for (const ModuleInfo& m : modules_)
    if (m.host < 0) depth = std::max(depth, graph_position(m.index) + m.layout.pp);
  return depth;
}

std::vector<ScheduleItem> Lowering::order_for(const ModuleInfo& m, int64_t stage,
                                              bool has_backward) const {
  const int32_t mbs = static_cast<int32_t>(microbatches_);
  if (!has_backward) return forward_only_order(mbs);
  if (m.layout.vpp > 1)
    return interleaved_order(mbs, static_cast<int32_t>(m.layout.pp), static_cast<int32_t>(stage),
                             static_cast<int32_t>(m.layout.vpp));
  if (plan_.schedule == Schedule::kGpipe) return gpipe_order(mbs);
  if (plan_.placement == Placement::kNonColocated) {
    // An interleaved consumer takes several micro-batches per stage before its first backward,
    // more than the graph-aware warm-up lets a producer run ahead (a circular wait): stages
    // upstream of an interleaved module run every forward first.
    if (feeds_interleaved(m.index)) return one_f_one_b_order(mbs, mbs);
    const int64_t position = graph_position(m.index) + stage;
    return one_f_one_b_order(mbs, static_cast<int32_t>(graph_depth() - position - 1));
  }
  return one_f_one_b_order(mbs, static_cast<int32_t>(m.layout.pp - stage - 1));
}

const ModuleInfo& Lowering::grid_of(const ModuleInfo& m) const {
  if (plan_.placement == Placement::kHomogeneous) return modules_[static_cast<std::size_t>(llm_)];
  return m.host >= 0 ? modules_[static_cast<std::size_t>(m.host)] : m;
}

std::vector<LayerRange> Lowering::held_layers(const ModuleInfo& m, const Coord& x) const {
  const bool split =
      plan_.placement != Placement::kHomogeneous || m.index == llm_ || dip_encoder(m);
  const int64_t chunks = !split ? 1 : dip_encoder(m) ? 1 : m.layout.vpp;
  std::vector<LayerRange> held;
  for (int64_t chunk = 0; chunk < chunks; ++chunk)
    held.push_back(m.chunk_layers[static_cast<std::size_t>(split ? chunk * m.layout.pp + x.p : 0)]);
  return held;
}

double Lowering::parameters_on(const ModuleInfo& m, const Coord& x) const {
  const ModuleLayout& l = grid_of(m).layout;
  double params = 0;
  for (const auto& [a, b] : held_layers(m, x))
    params += range_parameters(*m.spec, a, b, split_tp(m), l.ep, split_etp(m));
  return params;
}

double Lowering::split_expert_parameters_on(const ModuleInfo& m, const Coord& x) const {
  double params = 0;
  for (const auto& [a, b] : held_layers(m, x)) params += expert_range_parameters(m, a, b);
  return params;
}

double Lowering::busiest_expert_load(int module, int64_t first, int64_t end) {
  const ModuleInfo& m = modules_[static_cast<std::size_t>(module)];
  const auto& t = m.spec->transformer;
  const int64_t ep = grid_of(m).layout.ep;
  const int64_t moe = t ? moe_layers(*t, first, end) : 0;
  if (moe == 0 || ep == 1 || workload_.router_skew == 0) return 1;
  // Over the MoE layers of the range (dense layers route nothing).
  std::vector<double>& prefix = expert_load_prefix_[module];
  if (prefix.empty()) {
    prefix.push_back(0);
    for (int64_t l = 0; l < t->layers; ++l)
      prefix.push_back(prefix.back() + (moe_layer(*t, l)
                                            ? expert_load(t->experts, ep, t->capacity_factor,
                                                          workload_.router_skew, workload_.seed, l)
                                                  .busiest
                                            : 0.0));
  }
  return (prefix[static_cast<std::size_t>(end)] - prefix[static_cast<std::size_t>(first)]) /
         static_cast<double>(moe);
}

}  // namespace tessera::lowering

#include "shared/layout/dip_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "shared/base/check.hpp"
#include "shared/layout/entrain.hpp"

namespace tessera {

Json dip_schedule_to_json(const DipSchedule& schedule, const ModelSpec& model) {
  Json j;
  j["segment_order"] = Json::array();
  for (int32_t m : schedule.segment_order)
    j["segment_order"].push_back(model.modules[static_cast<std::size_t>(m)].name);
  j["encoders_first"] = schedule.encoders_first;
  j["lookahead"] = schedule.lookahead;
  j["in_flight"] = schedule.in_flight;
  j["layers"] = Json::object();
  for (const auto& [m, layers] : schedule.layers)
    j["layers"][model.modules[static_cast<std::size_t>(m)].name] = layers;
  return j;
}

std::optional<DipSchedule> read_dip_schedule(const Json& json, const ModelSpec& model,
                                             const std::string& file, const std::string& path,
                                             Diagnostics& diag) {
  const std::size_t before = diag.errors().size();
  ObjectReader r(json, file, path, diag);
  if (!r.valid()) return std::nullopt;
  DipSchedule s;
  auto module = [&](const std::string& name, const std::string& at) -> int32_t {
    const ModuleSpec* m = find_module(model, name);
    if (m == nullptr) {
      diag.error(file, at, "no module named '" + name + "' in the model");
      return -1;
    }
    return static_cast<int32_t>(m - model.modules.data());
  };
  std::vector<std::string> order;
  if (r.optional("segment_order", order))
    for (std::size_t i = 0; i < order.size(); ++i)
      s.segment_order.push_back(module(order[i], index_path(r.path_of("segment_order"), i)));
  r.optional("encoders_first", s.encoders_first);
  if (r.optional("lookahead", s.lookahead)) r.check_at_least("lookahead", s.lookahead, 1);
  if (r.optional("in_flight", s.in_flight)) r.check_at_least("in_flight", s.in_flight, 0);
  if (const Json* layers = r.find("layers")) {
    if (!layers->is_object()) {
      r.error("layers", "expected an object: module name -> layers per virtual stage");
    } else {
      for (const auto& item : layers->items()) {
        const std::string at = join_path(r.path_of("layers"), item.key());
        std::vector<int64_t> counts;
        if (!read_value(item.value(), file, at, counts, diag)) continue;
        if (const int32_t m = module(item.key(), at); m >= 0) s.layers[m] = counts;
      }
    }
  }
  r.finish();
  if (diag.errors().size() != before) return std::nullopt;
  return s;
}

std::string dip_schedule_problem(const DipSchedule& schedule, const ModelSpec& model, int64_t pp,
                                 int64_t vpp) {
  auto module = [&](int32_t i) -> const ModuleSpec* {
    return i >= 0 && static_cast<std::size_t>(i) < model.modules.size()
               ? &model.modules[static_cast<std::size_t>(i)]
               : nullptr;
  };
  for (int32_t i : schedule.segment_order)
    if (module(i) == nullptr || module(i)->role != ModuleRole::kEncoder)
      return "segment_order names a module that is not an encoder";
  for (const auto& [i, layers] : schedule.layers) {
    const ModuleSpec* m = module(i);
    if (m == nullptr || !m->transformer ||
        (m->role != ModuleRole::kLlm && m->role != ModuleRole::kEncoder))
      return "layers given for a module that is neither an encoder nor the LLM";
    const int64_t want = m->role == ModuleRole::kLlm ? pp * vpp : pp;
    int64_t sum = 0;
    bool positive = true;
    for (int64_t n : layers) {
      sum += n;
      positive = positive && n >= 1;
    }
    if (static_cast<int64_t>(layers.size()) != want || sum != m->transformer->layers || !positive)
      return "layers of " + m->name + " must be " + std::to_string(want) +
             " counts >= 1 summing to " + std::to_string(m->transformer->layers);
  }
  return "";
}

std::string describe_dip_schedule(const DipSchedule& schedule, const ModelSpec& model) {
  std::string s;
  for (int32_t m : schedule.segment_order)
    s += (s.empty() ? "" : " > ") + model.modules[static_cast<std::size_t>(m)].name;
  if (s.empty()) s = "encoders in model order";
  s += schedule.encoders_first ? ", encoders first" : ", LLM first";
  s += ", lookahead " + std::to_string(schedule.lookahead);
  s += ", in-flight " + std::to_string(schedule.in_flight);
  for (const auto& [m, layers] : schedule.layers) {
    s += ", " + model.modules[static_cast<std::size_t>(m)].name + " ";
    for (std::size_t i = 0; i < layers.size(); ++i) s += (i ? "/" : "") + std::to_string(layers[i]);
  }
  return s;
}

namespace {

// The list-scheduling run behind dip_orders(): steps as nodes of a dependency graph, each
// stage picking among its ready nodes.
class OrderBuilder {
 public:
  OrderBuilder(const DipPipeline& p, const DipSchedule& s)
      : p_(p),
        s_(s),
        P_(p.stages),
        V_(p.llm_chunks),
        cap_(s.in_flight > 0 ? s.in_flight : p.stages) {
    for (int32_t stage = 0; stage < P_; ++stage)
      for (int32_t mb = 0; mb < p.microbatches; ++mb) {
        for (int32_t c = 0; c < V_; ++c) {
          add({-1, c, mb, 0, false}, stage);
          if (p.llm_backward) add({-1, c, mb, 0, true}, stage);
        }
        for (std::size_t g = 0; g < p.segments.size(); ++g) {
          const auto& seg = p.segments[g];
          for (int32_t sub = 0; sub < seg.subs[static_cast<std::size_t>(mb)]; ++sub) {
            add({static_cast<int32_t>(g), 0, mb, sub, false}, stage);
            if (p.llm_backward && stage >= seg.backward_from)
              add({static_cast<int32_t>(g), 0, mb, sub, true}, stage);
          }
        }
      }
    for (std::size_t n = 0; n < nodes_.size(); ++n)
      for (int dep : dependencies(nodes_[n].step, nodes_[n].stage)) {
        nodes_[static_cast<std::size_t>(dep)].successors.push_back(static_cast<int>(n));
        ++nodes_[n].waiting;
      }
    ready_.resize(static_cast<std::size_t>(P_));
    for (std::size_t n = 0; n < nodes_.size(); ++n)
      if (nodes_[n].waiting == 0)
        ready_[static_cast<std::size_t>(nodes_[n].stage)].push_back(static_cast<int>(n));
    in_flight_.assign(static_cast<std::size_t>(P_), 0);
    admitted_.assign(static_cast<std::size_t>(P_) * static_cast<std::size_t>(p.microbatches), 0);
  }

  DipOrders run() {
    DipOrders out;
    std::vector<std::vector<DipStep>>& orders = out.stages;
    orders.resize(static_cast<std::size_t>(P_));
    std::vector<double> finish(static_cast<std::size_t>(P_), 0);
    std::vector<int> running(static_cast<std::size_t>(P_), -1);  // node
    std::size_t remaining = nodes_.size();
    double now = 0;
    while (remaining > 0) {
      for (int32_t stage = 0; stage < P_; ++stage)
        if (running[static_cast<std::size_t>(stage)] < 0)
          if (const int n = choose(stage, false); n >= 0) start(n, now, orders, finish, running);
      if (std::all_of(running.begin(), running.end(), [](int r) { return r < 0; })) {
        // Every stage idle with steps left: the bounds hold everything back. Let the stage with
        // the most urgent ready step run it regardless (still an execution, still deadlock-free).
        int best = -1;
        for (int32_t stage = 0; stage < P_; ++stage)
          if (const int n = choose(stage, true); n >= 0 && (best < 0 || key(n) < key(best)))
            best = n;
        TESSERA_CHECK(best >= 0, "dip_orders: no step can run (dependency cycle)");
        start(best, now, orders, finish, running);
        continue;
      }
      // Advance to the earliest finish and complete what ends then.
      double next = std::numeric_limits<double>::infinity();
      for (int32_t stage = 0; stage < P_; ++stage)
        if (running[static_cast<std::size_t>(stage)] >= 0)
          next = std::min(next, finish[static_cast<std::size_t>(stage)]);
      now = next;
      for (int32_t stage = 0; stage < P_; ++stage) {
        int& r = running[static_cast<std::size_t>(stage)];
        if (r < 0 || finish[static_cast<std::size_t>(stage)] > now) continue;
        complete(r);
        r = -1;
        --remaining;
      }
      out.peak_waiting_bytes = std::max(out.peak_waiting_bytes, waiting_);
    }
    return out;
  }

 private:
  struct Node {
    DipStep step;
    int32_t stage = 0;
    int waiting = 0;  // dependencies not yet finished
    std::vector<int> successors;
  };
  using Id = std::tuple<int32_t, int32_t, int32_t, int32_t, bool, int32_t>;  // step + stage
  using Key = std::tuple<int, int, int, int>;

  void add(const DipStep& s, int32_t stage) {
    index_[{s.segment, s.chunk, s.microbatch, s.sub, s.backward, stage}] =
        static_cast<int>(nodes_.size());
    nodes_.push_back({s, stage, 0, {}});
  }
  int node(const DipStep& s, int32_t stage) const {
    return index_.at({s.segment, s.chunk, s.microbatch, s.sub, s.backward, stage});
  }

  // What a step waits for: the step before it in its segment's pipeline; the LLM's first
  // virtual stage waits for every sub-micro-batch of the micro-batch, an encoder's last stage
  // backward for the LLM's first-stage backward.
  std::vector<int> dependencies(const DipStep& s, int32_t stage) const {
    std::vector<int> deps;
    if (s.segment < 0) {
      const int32_t v = s.chunk * P_ + stage, last = P_ * V_ - 1;
      if (!s.backward) {
        if (v > 0) return {node({-1, (v - 1) / P_, s.microbatch, 0, false}, (v - 1) % P_)};
        for (std::size_t g = 0; g < p_.segments.size(); ++g)
          for (int32_t sub = 0; sub < p_.segments[g].subs[static_cast<std::size_t>(s.microbatch)];
               ++sub)
            deps.push_back(node({static_cast<int32_t>(g), 0, s.microbatch, sub, false}, P_ - 1));
        return deps;
      }
      if (v == last) return {node({-1, s.chunk, s.microbatch, 0, false}, stage)};
      return {node({-1, (v + 1) / P_, s.microbatch, 0, true}, (v + 1) % P_)};
    }
    if (!s.backward) {
      if (stage == 0) return {};
      return {node({s.segment, 0, s.microbatch, s.sub, false}, stage - 1)};
    }
    if (stage == P_ - 1)
      return {node({-1, 0, s.microbatch, 0, true}, 0),
              node({s.segment, 0, s.microbatch, s.sub, false}, stage)};
    return {node({s.segment, 0, s.microbatch, s.sub, true}, stage + 1)};
  }

  char& admitted(int32_t stage, int32_t mb) {
    return admitted_[static_cast<std::size_t>(stage) * static_cast<std::size_t>(p_.microbatches) +
                     static_cast<std::size_t>(mb)];
  }

  // Whether the schedule's bounds let a ready forward start now.
  bool allowed(int n) {
    const Node& x = nodes_[static_cast<std::size_t>(n)];
    const DipStep& s = x.step;
    if (s.backward) return true;
    if (s.segment < 0)
      return s.chunk > 0 || in_flight_[static_cast<std::size_t>(x.stage)] < cap_ ||
             admitted(x.stage, s.microbatch) != 0;
    return x.stage > 0 || s.microbatch < llm_started_ + std::max(1, s_.lookahead);
  }

  // Smaller is preferred: backwards (LLM, then encoders), then forwards of the encoders and the
  // LLM in the order the schedule says; the LLM's deepest chunk first.
  Key key(int n) const {
    const DipStep& s = nodes_[static_cast<std::size_t>(n)].step;
    if (s.backward)
      return s.segment < 0 ? Key{0, s.microbatch, -s.chunk, 0}
                           : Key{1, s.microbatch, s.segment, s.sub};
    const int encoder_class = s_.encoders_first ? 2 : 3;
    if (s.segment >= 0) return Key{encoder_class, s.microbatch, s.segment, s.sub};
    return Key{5 - encoder_class, -s.chunk, s.microbatch, 0};
  }

  int choose(int32_t stage, bool ignore_bounds) {
    int best = -1;
    for (int n : ready_[static_cast<std::size_t>(stage)])
      if ((ignore_bounds || allowed(n)) && (best < 0 || key(n) < key(best))) best = n;
    return best;
  }

  void start(int n, double now, std::vector<std::vector<DipStep>>& orders,
             std::vector<double>& finish, std::vector<int>& running) {
    const Node& x = nodes_[static_cast<std::size_t>(n)];
    const DipStep& s = x.step;
    auto& ready = ready_[static_cast<std::size_t>(x.stage)];
    ready.erase(std::find(ready.begin(), ready.end(), n));
    orders[static_cast<std::size_t>(x.stage)].push_back(s);
    if (s.segment < 0 && !s.backward && s.chunk == 0 && !admitted(x.stage, s.microbatch)) {
      admitted(x.stage, s.microbatch) = 1;
      ++in_flight_[static_cast<std::size_t>(x.stage)];
      if (x.stage == 0) ++llm_started_;
    }
    finish[static_cast<std::size_t>(x.stage)] = now + std::max(0.0, p_.seconds(s, x.stage));
    running[static_cast<std::size_t>(x.stage)] = n;
  }

  void complete(int n) {
    const Node& x = nodes_[static_cast<std::size_t>(n)];
    const DipStep& s = x.step;
    // A micro-batch leaves a stage with its chunk-0 backward (or last forward when none runs).
    const bool leaves = p_.llm_backward ? (s.segment < 0 && s.backward && s.chunk == 0)
                                        : (s.segment < 0 && !s.backward && s.chunk == V_ - 1);
    if (leaves) --in_flight_[static_cast<std::size_t>(x.stage)];
    // Encoder outputs waiting on the LLM's first stage.
    if (p_.output_bytes) {
      if (s.segment >= 0 && !s.backward && x.stage == P_ - 1) waiting_ += p_.output_bytes(s);
      const bool frees = s.segment < 0 && s.chunk == 0 && x.stage == 0 &&
                         s.backward == (p_.llm_input_grad && p_.llm_backward);
      if (frees)
        for (std::size_t g = 0; g < p_.segments.size(); ++g)
          for (int32_t sub = 0; sub < p_.segments[g].subs[static_cast<std::size_t>(s.microbatch)];
               ++sub)
            waiting_ -= p_.output_bytes({static_cast<int32_t>(g), 0, s.microbatch, sub, false});
    }
    for (int succ : x.successors) {
      Node& y = nodes_[static_cast<std::size_t>(succ)];
      if (--y.waiting == 0) ready_[static_cast<std::size_t>(y.stage)].push_back(succ);
    }
  }

  const DipPipeline& p_;
  const DipSchedule& s_;
  int32_t P_ = 1, V_ = 1, cap_ = 1;
  int32_t llm_started_ = 0;  // micro-batches the LLM's first virtual stage has begun
  double waiting_ = 0;       // encoder output bytes held on the LLM's first stage
  std::vector<Node> nodes_;
  std::map<Id, int> index_;
  std::vector<std::vector<int>> ready_;  // per stage: nodes whose dependencies finished
  std::vector<int32_t> in_flight_;
  std::vector<char> admitted_;  // [stage][micro-batch]: the LLM has begun it there
};

}  // namespace

DipOrders dip_orders(const DipPipeline& pipeline, const DipSchedule& schedule) {
  TESSERA_CHECK(pipeline.stages >= 1 && pipeline.llm_chunks >= 1 && pipeline.microbatches >= 1,
                "dip_orders: empty pipeline");
  for (const auto& seg : pipeline.segments)
    TESSERA_CHECK(seg.subs.size() == static_cast<std::size_t>(pipeline.microbatches),
                  "dip_orders: sub-micro-batches for every micro-batch");
  return OrderBuilder(pipeline, schedule).run();
}

int32_t dip_sub_microbatches(double encoder_forward, double llm_forward, int32_t llm_chunks,
                             int32_t items) {
  if (items <= 0) return 0;
  if (llm_forward <= 0) return items;
  const double k = std::round(encoder_forward * llm_chunks / llm_forward);
  return static_cast<int32_t>(std::clamp<double>(k, 1, items));
}

std::vector<std::pair<std::size_t, Sample>> dip_media_items(
    const ModelSpec& model, const ModuleSpec& encoder, std::span<const Sample* const> samples) {
  const ModuleSpec* image = encoder_for(model, Modality::kImage);
  const ModuleSpec* video = encoder_for(model, Modality::kVideo);
  const ModuleSpec* audio = encoder_for(model, Modality::kAudio);
  std::vector<std::pair<std::size_t, Sample>> items;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Sample& s = *samples[i];
    if (image == &encoder)
      for (const ImageItem& im : s.images) items.push_back({i, Sample{0, {im}, {}, {}}});
    if (video == &encoder)
      for (const VideoItem& v : s.videos) items.push_back({i, Sample{0, {}, {}, {v}}});
    if (audio == &encoder)
      for (double a : s.audio_seconds) items.push_back({i, Sample{0, {}, {a}, {}}});
  }
  return items;
}

std::vector<std::size_t> dip_piece_starts(const ModelSpec& model, const ModuleSpec& encoder,
                                          std::span<const Sample* const> samples,
                                          const std::vector<std::pair<std::size_t, Sample>>& items,
                                          int64_t llm_chunks, int64_t max_seq_len) {
  std::vector<double> weights;
  double encoder_forward = 0, llm_forward = 0;
  for (const auto& [owner, item] : items) {
    weights.push_back(sample_module_flops(model, encoder, item, max_seq_len));
    encoder_forward += weights.back();
  }
  const ModuleSpec* llm = find_llm(model);
  for (const Sample* s : samples) llm_forward += sample_module_flops(model, *llm, *s, max_seq_len);
  // Tags carry the sub-micro-batch in 6 bits.
  const int32_t k = std::min(
      63, dip_sub_microbatches(encoder_forward, llm_forward, static_cast<int32_t>(llm_chunks),
                               static_cast<int32_t>(items.size())));
  if (k == 0) return {};
  return split_contiguous(weights, k);
}

std::vector<std::size_t> split_contiguous(const std::vector<double>& weights, int32_t k) {
  TESSERA_CHECK(k >= 1 && static_cast<std::size_t>(k) <= weights.size(),
                "split_contiguous: 1 <= k <= items");
  double total = 0;
  for (double w : weights) total += w;
  std::vector<std::size_t> first{0};
  double sum = 0;
  for (std::size_t i = 0; i < weights.size() && first.size() < static_cast<std::size_t>(k); ++i) {
    // Cut after item i when the running sum reaches the next piece's share, leaving at least
    // one item for every piece still to come.
    sum += weights[i];
    const std::size_t pieces_left = static_cast<std::size_t>(k) - first.size();
    const std::size_t after = weights.size() - (i + 1);
    if (after < pieces_left) break;
    if (after == pieces_left || sum >= total * static_cast<double>(first.size()) / k)
      first.push_back(i + 1);
  }
  return first;
}

}  // namespace tessera

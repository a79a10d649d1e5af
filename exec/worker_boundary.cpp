// The Worker's boundary transport: encoder outputs to the LLM and their gradients back —
// colocated (all-gathers and regroups), linked leader to leader (non-colocated, or into an LLM
// pipeline) and Entrain's rows from two encoder micro-batches.
#include "exec/runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "exec/device.hpp"
#include "exec/worker_internal.hpp"
#include "shared/base/check.hpp"
#include "shared/layout/context_split.hpp"
#include "shared/layout/entrain.hpp"
#include "shared/layout/microbatch.hpp"
#include "shared/lowering/lower.hpp"
#include "shared/model/model_math.hpp"

namespace tessera::exec {

torch::Tensor Worker::entrain_rows(int producer, int mb, std::vector<torch::Tensor>& leaves) {
  // Where each sample's rows lie: in the output of the encoder micro-batch (mb or mb - 1) that
  // holds it — the producer's on this rank, or what its boundary messages assembled here — those
  // outputs stacked in that order.
  std::map<int32_t, std::pair<int64_t, int64_t>> where;  // sample -> (first row, rows)
  std::vector<torch::Tensor> outputs;
  int64_t row = 0;
  const std::vector<int32_t>& wanted = micro_batch(mb).samples;
  auto wanted_in = [&](const RowMap& rows) {
    return std::any_of(wanted.begin(), wanted.end(), [&](int32_t x) { return rows.count(x) > 0; });
  };
  for (int i = std::max(0, mb - 1); i <= mb; ++i) {
    RowMap rows;  // from the first row of this micro-batch's output
    torch::Tensor source;
    if (boundary_.linked()) {
      if (i < mb && !boundary_.assembled.count({producer, i})) continue;
      const Boundary& b = assembled(producer, i);
      rows = b.rows;
      source = b.leaf;
    } else {
      lay_out_rows(producer, samples_for(producer, i), 0, rows);
      if (!wanted_in(rows)) continue;  // (its slot may be gone already)
      auto [it, fresh] = boundary_.entrain_leaves.try_emplace({producer, i});
      if (fresh) {
        const torch::Tensor& out = producer_slot(producer, i).output;
        it->second = out.detach();
        it->second.set_requires_grad(out.requires_grad());
      }
      source = it->second;
    }
    if (!wanted_in(rows)) continue;
    for (const auto& [sample, range] : rows) where[sample] = {row + range.first, range.second};
    row += source.size(0);
    outputs.push_back(source);
    leaves.push_back(source);
  }
  std::vector<int64_t> index;
  for (int32_t sample : wanted)
    if (const auto it = where.find(sample); it != where.end())
      for (int64_t r = 0; r < it->second.second; ++r) index.push_back(it->second.first + r);
  TESSERA_CHECK(!outputs.empty(),
                "entrain: no encoder micro-batch feeds LLM micro-batch " + std::to_string(mb));
  return torch::cat(outputs, 0).index_select(0, device_indices(index));
}

Boundary& Worker::boundary(int producer) {
  if (const auto it = boundary_.whole.find(producer); it != boundary_.whole.end())
    return it->second;
  // No regroup op: the producer's replicas are the LLM's; this rank's own whole-batch output.
  const torch::Tensor& out = producer_slot(producer, -1).output;
  Boundary& b = boundary_.whole[producer];
  b.leaf = out.detach();
  b.leaf.set_requires_grad(out.requires_grad());
  b.mine_rows = lay_out_rows(producer, samples_for(producer, -1), 0, b.rows);
  return b;
}

void Worker::boundary_collective(const Op& op) {
  if (op.collective == CollectiveKind::kBroadcast || op.collective == CollectiveKind::kAllReduce) {
    const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
    if (op.collective == CollectiveKind::kAllReduce) {
      // Consumer with CP: each CP rank holds the gradient of its own tokens; sum them (a
      // colocated LLM's whole-batch boundary, or one micro-batch's linked rows).
      Boundary& b = op.microbatch < 0 ? boundary(op.module) : assembled(op.module, op.microbatch);
      if (!b.leaf.grad().defined()) b.leaf.mutable_grad() = torch::zeros_like(b.leaf);
      all_reduce(comm, b.leaf.mutable_grad());
      return;
    }
    if (op.phase == Phase::kF) {
      // The consumer leader's received rows reach its TP x CP group.
      Boundary& b = assembled(op.module, op.microbatch);
      torch::Tensor t = b.leaf.detach();
      broadcast(comm, t, 0);
      b.leaf = t;
      b.leaf.set_requires_grad(true);
      return;
    }
    // Backward, producer side: the leader's received gradient reaches its TP x CP group (with
    // a whole-batch output, the accumulated gradient after each micro-batch's part).
    absorb_self_links(op.module);
    Slot& slot = producer_slot(op.module, op.microbatch);
    if (!slot.output_grad.defined()) slot.output_grad = torch::zeros_like(slot.output);
    broadcast(comm, slot.output_grad, 0);
    return;
  }
  TESSERA_CHECK(op.collective == CollectiveKind::kAllGather,
                op_name(*program_, op) + ": unexpected boundary collective");
  const ModulePlace& place = (*places_)[op.module];
  const Comm& comm = groups_.get(program_->groups[static_cast<std::size_t>(op.group)]);
  if (op.phase == Phase::kF) {
    if (const MediaAssignment* media = media_for(op.module); media != nullptr)
      return gather_media(op, comm, *media);
    // Fan-in: the k encoder replicas that share an LLM replica's batch, in replica order.
    const int64_t k = comm.size(), base = place.dp_rank - place.dp_rank % k;
    Boundary b;
    int64_t row = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t first = row;
      row = lay_out_rows(op.module, replica_samples(assignment_, place.dp_size, base + j, -1), row,
                         b.rows);
      b.member_rows.push_back(row - first);
      if (j == comm.rank) {
        b.mine_first = first;
        b.mine_rows = row - first;
      }
    }
    const torch::Tensor& out = producer_slot(op.module, -1).output;
    b.leaf = all_gather_rows(comm, out.detach().contiguous(), b.member_rows);
    b.leaf.set_requires_grad(out.requires_grad());
    // The LLM replica on this rank must find all of its samples here.
    for (const auto& mb : my_micro_batches_)
      for (int32_t sample : mb)
        TESSERA_CHECK(b.rows.count(sample),
                      op_name(*program_, op) +
                          ": the regrouped rows miss a sample of this rank's "
                          "LLM replica (encoder and LLM grids not aligned, e.g. an LLM pipeline): "
                          "not in the executor yet");
    boundary_.whole[op.module] = std::move(b);
    return;
  }
  // Backward.
  Boundary& b = boundary_.whole.at(op.module);
  if (place.dp_size < places_->llm_place().dp_size) {
    // Fan-out: each member's LLM replica computed the gradient of its own samples' rows; the
    // all-gather assembles all of this encoder replica's rows (replicas in order, as its output).
    const int64_t k = comm.size();
    std::vector<int64_t> member_rows;
    int64_t first = 0;
    for (int64_t j = 0; j < k; ++j) {
      RowMap scratch;
      const int64_t rows = lay_out_rows(
          op.module,
          replica_samples(assignment_, places_->llm_place().dp_size, place.dp_rank * k + j, -1), 0,
          scratch);
      if (j < comm.rank) first += rows;
      member_rows.push_back(rows);
    }
    const torch::Tensor g = b.leaf.grad().defined() ? b.leaf.grad() : torch::zeros_like(b.leaf);
    const torch::Tensor all = all_gather_rows(
        comm, g.narrow(0, first, member_rows[static_cast<std::size_t>(comm.rank)]).contiguous(),
        member_rows);
    producer_slot(op.module, -1).output_grad = all;
    return;
  }
  // Fan-in: this rank's rows of the gradient, exchanged over the group as the Program says.
  const torch::Tensor g = b.leaf.grad().defined() ? b.leaf.grad() : torch::zeros_like(b.leaf);
  const torch::Tensor mine = b.mine_index.defined() ? g.index_select(0, b.mine_index)
                                                    : g.narrow(0, b.mine_first, b.mine_rows);
  const torch::Tensor all = all_gather_rows(comm, mine.contiguous(), b.member_rows);
  producer_slot(op.module, -1).output_grad = all.narrow(0, b.mine_first, b.mine_rows).contiguous();
}

void Worker::gather_media(const Op& op, const Comm& comm, const MediaAssignment& items) {
  const ModulePlace& place = (*places_)[op.module];
  const int64_t k = comm.size(), base = place.dp_rank - place.dp_rank % k;
  // Where each item's rows lie in the gathered tensor: the members' outputs in replica order,
  // each its items' rows in its order.
  Boundary b;
  std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> at;  // (sample, item)
  int64_t row = 0;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t first = row;
    for (const MediaPiece& piece : items[static_cast<std::size_t>(base + j)]) {
      const int64_t n = item_rows(op.module, piece);
      at[{piece.sample, piece.item}] = {row, n};
      row += n;
    }
    b.member_rows.push_back(row - first);
    if (j == comm.rank) {
      b.mine_first = first;
      b.mine_rows = row - first;
    }
  }
  // The leaf in this LLM replica's sample order, each sample's items in order.
  std::vector<int64_t> order;
  std::map<int64_t, int64_t> leaf_row;  // gathered row -> leaf row
  for (const auto& mb : my_micro_batches_)
    for (int32_t sample : mb) {
      const auto first = static_cast<int64_t>(order.size());
      for (int32_t item = 0;; ++item) {
        const auto it = at.find({sample, item});
        if (it == at.end()) break;
        for (int64_t r = it->second.first; r < it->second.first + it->second.second; ++r) {
          leaf_row[r] = static_cast<int64_t>(order.size());
          order.push_back(r);
        }
      }
      b.rows[sample] = {first, static_cast<int64_t>(order.size()) - first};
    }
  TESSERA_CHECK(static_cast<int64_t>(order.size()) == row,
                op_name(*program_, op) + ": the gathered media rows are not this LLM replica's");
  std::vector<int64_t> mine;
  for (int64_t r = b.mine_first; r < b.mine_first + b.mine_rows; ++r)
    mine.push_back(leaf_row.at(r));
  b.mine_index = device_indices(mine);
  const torch::Tensor& out = producer_slot(op.module, -1).output;
  b.leaf = all_gather_rows(comm, out.detach().contiguous(), b.member_rows)
               .index_select(0, device_indices(order));
  b.leaf.set_requires_grad(out.requires_grad());
  boundary_.whole[op.module] = std::move(b);
}

int Worker::consumer_of(int producer) const {
  const ModelSpec& model = scenario_.model;
  const std::string& name = model.modules[static_cast<std::size_t>(producer)].name;
  for (std::size_t c = 0; c < model.modules.size(); ++c) {
    const auto& in = model.modules[c].inputs;
    if (std::find(in.begin(), in.end(), name) != in.end()) return static_cast<int>(c);
  }
  return -1;
}

// This rank's links of `producer`'s micro-batch `mb` as a consumer: the Program's links into its
// replica, in the order its input is assembled (by producer replica).
std::vector<int32_t> Worker::consumer_links(int producer, int mb) const {
  const std::vector<BoundaryLink>& links = program_->links;
  std::vector<int32_t> mine;
  for (std::size_t i = 0; i < links.size(); ++i) {
    const BoundaryLink& l = links[i];
    if (l.producer == producer && l.microbatch == mb &&
        l.consumer_replica == (*places_)[l.consumer].dp_rank)
      mine.push_back(static_cast<int32_t>(i));
  }
  std::sort(mine.begin(), mine.end(), [&](int32_t a, int32_t b) {
    return links[static_cast<std::size_t>(a)].producer_replica <
           links[static_cast<std::size_t>(b)].producer_replica;
  });
  return mine;
}

// Row indices, in `order`'s layout (each sample's rows contiguous, samples in order), of
// `samples`.
int64_t Worker::lay_out_rows(int producer, const std::vector<int32_t>& samples, int64_t row,
                             RowMap& where) const {
  const ModelSpec& model = scenario_.model;
  // A projector's rows are its encoder's tokens; an encoder's (feeding a projector on other
  // ranks), its own.
  const ModuleSpec& encoder =
      *source_encoder(model, model.modules[static_cast<std::size_t>(producer)]);
  for (int32_t s : samples) {
    const int64_t n =
        llm_media_tokens(model, encoder, batch_.batch.samples[static_cast<std::size_t>(s)]);
    where[s] = {row, n};
    row += n;
  }
  return row;
}

std::vector<int64_t> Worker::rows_of(int producer, const std::vector<int32_t>& samples,
                                     const std::vector<int32_t>& order) const {
  RowMap where;
  lay_out_rows(producer, order, 0, where);
  std::vector<int64_t> rows;
  for (int32_t s : samples) {
    const auto [first, n] = where.at(s);
    for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
  }
  return rows;
}

std::vector<int64_t> Worker::link_output_rows(int producer, int mb, const BoundaryLink& link) {
  if (link.items.empty()) {
    // Whole samples: a colocated producer's output holds the whole batch, a non-colocated one's
    // the micro-batch.
    const bool whole = slots_.count({producer, 0, mb, 0}) == 0;
    return rows_of(producer, link.samples,
                   whole ? samples_for(producer, -1) : samples_for(producer, mb));
  }
  // Media items: the replica's output holds its items in the order they were dealt.
  const MediaAssignment* media = media_for(producer);
  TESSERA_CHECK(media != nullptr, "a link of media items from module " + std::to_string(producer) +
                                      ", which takes whole samples");
  std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> at;
  int64_t row = 0;
  for (const MediaPiece& piece : (*media)[static_cast<std::size_t>((*places_)[producer].dp_rank)]) {
    const int64_t n = item_rows(producer, piece);
    at[{piece.sample, piece.item}] = {row, n};
    row += n;
  }
  std::vector<int64_t> rows;
  for (std::size_t e = 0; e < link.samples.size(); ++e) {
    const auto [first, n] = at.at({link.samples[e], link.items[e]});
    for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
  }
  return rows;
}

int64_t Worker::link_rows(int producer, const BoundaryLink& link) const {
  RowMap scratch;
  if (link.items.empty()) return lay_out_rows(producer, link.samples, 0, scratch);
  int64_t rows = 0;
  for (std::size_t e = 0; e < link.samples.size(); ++e)
    rows += item_rows(producer, {link.samples[e], link.items[e]});
  return rows;
}

std::vector<int64_t> Worker::leaf_rows(const Boundary& b, const BoundaryLink& link) {
  std::vector<int64_t> rows;
  for (std::size_t e = 0; e < link.samples.size(); ++e) {
    const auto [first, n] = link.items.empty() ? b.rows.at(link.samples[e])
                                               : b.items.at({link.samples[e], link.items[e]});
    for (int64_t r = 0; r < n; ++r) rows.push_back(first + r);
  }
  return rows;
}

int64_t Worker::boundary_width(int producer) const {
  const ModuleSpec& spec = scenario_.model.modules[static_cast<std::size_t>(producer)];
  if (spec.projector) return spec.projector->out;
  // An encoder's tokens, s x s of them merged into one of s² times the width.
  const int64_t merge = spec.patching ? spec.patching->spatial_merge : 1;
  return spec.transformer->hidden * merge * merge;
}

int64_t Worker::producer_leader(int producer, int64_t replica) const {
  const std::string& name = scenario_.model.modules[static_cast<std::size_t>(producer)].name;
  for (const ModuleGroups& mg : places_->groups())
    if (mg.module == name)
      if (const Group* g = group_with(mg.dp, mg.first_rank); g != nullptr)
        return (*g)[static_cast<std::size_t>(replica)];
  return -1;
}

// A producer's output slot: per micro-batch (non-colocated), or the whole batch (colocated).
Worker::Slot& Worker::producer_slot(int producer, int mb) {
  for (auto& [k, other] : stages_)
    if (k.first == producer && other->last()) {
      if (const auto it = slots_.find({producer, k.second, mb, 0}); it != slots_.end())
        return it->second;
      return slots_.at({producer, k.second, -1, 0});
    }
  TESSERA_CHECK(false, "no output of module " + std::to_string(producer) + " on this rank");
  return slots_.begin()->second;
}

// Links whose producer leader and consumer leader are this very rank carry no message: the
// consumer's input gradient rows go straight into the producer's output gradient.
void Worker::absorb_self_links(int producer) {
  if (!boundary_.absorbed.insert(producer).second) return;
  const int consumer = consumer_of(producer);
  const bool consumer_leader = places_->llm_tp_index() == 0 && places_->llm_cp_index() == 0 &&
                               std::any_of(stages_.begin(), stages_.end(), [&](const auto& e) {
                                 return e.first.first == consumer && e.second->first();
                               });
  if (!consumer_leader) return;
  for (auto& [key, b] : boundary_.assembled) {
    if (key.first != producer || !b.leaf.grad().defined()) continue;
    const int mb = key.second;
    for (const int32_t i : consumer_links(producer, mb)) {
      const BoundaryLink& link = program_->links[static_cast<std::size_t>(i)];
      if (producer_leader(producer, link.producer_replica) != rank_) continue;
      Slot& slot = producer_slot(producer, mb);
      const auto to = device_indices(link_output_rows(producer, mb, link));
      if (!slot.output_grad.defined()) slot.output_grad = torch::zeros_like(slot.output);
      slot.output_grad.index_copy_(
          0, to, b.leaf.grad().index_select(0, device_indices(leaf_rows(b, link))));
    }
  }
}

Boundary& Worker::assembled(int producer, int mb) {
  if (const auto it = boundary_.assembled.find({producer, mb}); it != boundary_.assembled.end())
    return it->second;
  // The consumer's input from `producer`: the links' rows in link order (the leader received
  // them; the others get them by the broadcast, into a tensor of the same shape).
  Boundary& b = boundary_.assembled[{producer, mb}];
  std::vector<torch::Tensor> parts;
  int64_t row = 0;
  for (const int32_t i : consumer_links(producer, mb)) {
    const BoundaryLink& link = program_->links[static_cast<std::size_t>(i)];
    // Its rows laid out from `row` on: by sample, or by media item.
    int64_t end = row;
    if (link.items.empty()) end = lay_out_rows(producer, link.samples, row, b.rows);
    for (std::size_t e = 0; e < link.items.size(); ++e) {
      const int64_t n = item_rows(producer, {link.samples[e], link.items[e]});
      b.items[{link.samples[e], link.items[e]}] = {end, n};
      end += n;
    }
    const int64_t rows = end - row;
    const auto part = boundary_.link_parts.find({producer, mb, i});
    torch::Tensor rows_here;
    if (part != boundary_.link_parts.end()) {
      rows_here = part->second;
    } else {
      // A link from this very rank (no message), or a rank that gets the rows by broadcast.
      const bool self = places_->llm_tp_index() == 0 && places_->llm_cp_index() == 0 &&
                        producer_leader(producer, link.producer_replica) == rank_ &&
                        std::any_of(stages_.begin(), stages_.end(),
                                    [&](const auto& e) { return e.first.first == producer; });
      if (self) {
        rows_here = producer_slot(producer, mb)
                        .output.detach()
                        .index_select(0, device_indices(link_output_rows(producer, mb, link)));
      } else {
        rows_here = torch::zeros({rows, boundary_width(producer)}, activation_options());
      }
    }
    parts.push_back(rows_here);
    row += rows;
  }
  b.leaf = torch::cat(parts, 0);
  if (!b.items.empty()) {
    // Media items come from several encoder replicas; the consumer takes each sample's rows
    // together, its items in order (as llm_layout numbers them). A sample without media here
    // has none.
    std::vector<int64_t> order;
    std::map<std::pair<int32_t, int32_t>, std::pair<int64_t, int64_t>> moved;
    for (const auto& [key, range] : b.items) {  // by sample, then item
      const auto it =
          b.rows.try_emplace(key.first, static_cast<int64_t>(order.size()), int64_t{0}).first;
      it->second.second += range.second;
      moved[key] = {static_cast<int64_t>(order.size()), range.second};
      for (int64_t r = range.first; r < range.first + range.second; ++r) order.push_back(r);
    }
    for (int32_t sample : my_micro_batches_.at(static_cast<std::size_t>(mb)))
      b.rows.try_emplace(sample, 0, 0);
    b.items = std::move(moved);
    b.leaf = b.leaf.index_select(0, device_indices(order));
  }
  b.leaf.set_requires_grad(true);
  b.mine_rows = row;
  return b;
}

void Worker::boundary_p2p(const Op& op) {
  // op.module: the producer's last module (the projector); the consumer is the module it feeds.
  const int producer = op.module;
  const int mb = op.microbatch;
  TESSERA_CHECK(op.link >= 0, op_name(*program_, op) + ": a boundary message without its link");
  // The producer sends forward and receives gradients; the consumer the reverse (a colocated
  // rank is both).
  const bool producer_side = (op.kind == OpKind::kSend) == (op.phase == Phase::kF);
  auto send_rows = [&](const torch::Tensor& t) { messages_.send(op, t); };
  auto recv_rows = [&](int64_t rows, int64_t width) {
    torch::Tensor t = torch::zeros({rows, width}, activation_options());
    messages_.receive(op, t);
    return t;
  };
  const int64_t width = boundary_width(producer);
  if (producer_side) {
    Slot* slot = &producer_slot(producer, mb);
    if (op.kind == OpKind::kRecv) absorb_self_links(producer);
    const torch::Tensor rows = device_indices(
        link_output_rows(producer, mb, program_->links[static_cast<std::size_t>(op.link)]));
    if (op.kind == OpKind::kSend)  // forward: this link's rows of the output
      return send_rows(slot->output.detach().index_select(0, rows));
    // backward: this link's rows of the output gradient
    const torch::Tensor g = recv_rows(rows.size(0), width);
    if (!slot->output_grad.defined()) slot->output_grad = torch::zeros_like(slot->output);
    slot->output_grad.index_copy_(0, rows, g);
    return;
  }
  const BoundaryLink& link = program_->links[static_cast<std::size_t>(op.link)];
  if (op.kind == OpKind::kRecv) {  // forward: a link's rows, kept until assembled
    boundary_.link_parts[{producer, mb, op.link}] = recv_rows(link_rows(producer, link), width);
    return;
  }
  // backward: this link's rows of the gradient of the assembled input
  Boundary& b = assembled(producer, mb);
  const torch::Tensor g = b.leaf.grad().defined() ? b.leaf.grad() : torch::zeros_like(b.leaf);
  send_rows(g.index_select(0, device_indices(leaf_rows(b, link))));
}

}  // namespace tessera::exec

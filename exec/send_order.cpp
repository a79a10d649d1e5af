#include "exec/send_order.hpp"

#include "shared/base/check.hpp"

namespace tessera::exec {

void SendOrder::start(const Program& p, int rank) {
  peers_.clear();
  for (int32_t peer = 0; peer < p.world; ++peer)
    for (const Op& op : p.ranks[static_cast<std::size_t>(peer)])
      if (op.kind == OpKind::kRecv && op.peer == rank) peers_[peer].order.push_back(op.tag);
}

std::vector<std::pair<int64_t, torch::Tensor>> SendOrder::post(int peer, int64_t tag,
                                                               torch::Tensor t) {
  Peer& q = peers_[peer];
  std::vector<std::pair<int64_t, torch::Tensor>> ready;
  if (q.next < q.order.size() && q.order[q.next] == tag && !q.waiting.count(tag)) {
    ready.emplace_back(tag, std::move(t));
    ++q.next;
  } else {
    // Held: a copy, since the worker may write into the tensor before it goes.
    q.waiting[tag].push_back(t.clone());
    ++reordered_;
  }
  while (q.next < q.order.size()) {
    const auto it = q.waiting.find(q.order[q.next]);
    if (it == q.waiting.end()) break;
    ready.emplace_back(it->first, std::move(it->second.front()));
    it->second.pop_front();
    if (it->second.empty()) q.waiting.erase(it);
    ++q.next;
  }
  TESSERA_CHECK(q.next < q.order.size() || q.waiting.empty(),
                "a message to rank " + std::to_string(peer) + " (tag " + std::to_string(tag) +
                    ") that rank does not receive");
  return ready;
}

std::size_t SendOrder::held() const {
  std::size_t n = 0;
  for (const auto& [peer, q] : peers_)
    for (const auto& [tag, ts] : q.waiting) n += ts.size();
  return n;
}

}  // namespace tessera::exec

#include "exec/messages.hpp"

#include "shared/base/check.hpp"

namespace tessera::exec {

void Messages::start(const Program& p) {
  TESSERA_CHECK(in_flight_.empty(), "sends left in flight from the last step");
  order_.start(p, rank_);
}

void Messages::send(const Op& op, const torch::Tensor& t) {
  for (auto& [tag, ready] : order_.post(op.peer, op.tag, t))
    in_flight_.push_back(exec::send(groups_.channel(rank_, op.peer), ready, op.peer, tag));
}

void Messages::receive(const Op& op, torch::Tensor& t) {
  recv(groups_.channel(op.peer, rank_), t, op.peer, op.tag);
}

void Messages::finish() {
  TESSERA_CHECK(order_.held() == 0,
                "messages never sent: their receiver's earlier ones were not in this rank's "
                "Program");
  for (PendingSend& s : in_flight_) s.work->wait();
  in_flight_.clear();
}

}  // namespace tessera::exec

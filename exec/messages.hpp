// One rank's point-to-point messages of a step: activations and gradients between pipeline
// stages and across module boundaries, matched by the Program's tags. Sends go out in the order
// each peer receives them (SendOrder) and stay in flight while the rank goes on; receives block.
// By the end of the step (finish) every send has been posted and has completed.
#pragma once

#include <cstdint>
#include <vector>

#include "exec/torch_api.hpp"

#include "exec/comm.hpp"
#include "exec/send_order.hpp"
#include "shared/program/program.hpp"

namespace tessera::exec {

class Messages {
 public:
  Messages(Groups& groups, int rank) : groups_(groups), rank_(rank) {}

  // A new step of Program `p`: nothing in flight.
  void start(const Program& p);
  // Sends `t` to op.peer under op.tag, once the messages the peer takes before it are on their
  // way (the tensor is held until the send completes).
  void send(const Op& op, const torch::Tensor& t);
  // Receives op.peer's message under op.tag into `t` (its shape and dtype the message's).
  void receive(const Op& op, torch::Tensor& t);
  // Waits for every send in flight. Fails when a send was never posted: its peer takes a message
  // before it that this rank's Program does not send.
  void finish();
  // Messages held back so that their receiver takes them in the order sent, since construction.
  int64_t reordered() const { return order_.reordered(); }

 private:
  Groups& groups_;
  int rank_;
  SendOrder order_;
  std::vector<PendingSend> in_flight_;
};

}  // namespace tessera::exec

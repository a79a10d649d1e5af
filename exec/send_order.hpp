// Messages to each peer posted in the order that peer receives them. The Program matches a send
// to its receive by tag, and a rank may send a pair's messages in another order than the peer
// takes them (a colocated boundary's rows before an earlier micro-batch's activation, DIP's
// pieces). NCCL ignores tags and matches a pair's messages in order, so a message the peer takes
// later waits here until every one it takes before has been posted. The wait cannot deadlock:
// what the peer takes first, this rank sends at the latest when its own Program reaches it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "exec/torch_api.hpp"

#include "shared/program/program.hpp"

namespace tessera::exec {

class SendOrder {
 public:
  // For the step of Program `p`, on rank `rank`: each peer's order of this rank's messages.
  void start(const Program& p, int rank);
  // Queues a message; returns, in the peer's order, those now free to post (this one and any it
  // was holding up, or none).
  std::vector<std::pair<int64_t, torch::Tensor>> post(int peer, int64_t tag, torch::Tensor t);
  // Messages still held (none once the step's sends have all been posted).
  std::size_t held() const;
  // Messages that had to wait for an earlier one, since construction.
  int64_t reordered() const { return reordered_; }

 private:
  struct Peer {
    std::vector<int64_t> order;  // tags, as the peer receives them
    std::size_t next = 0;        // the first not yet posted
    std::map<int64_t, std::deque<torch::Tensor>> waiting;
  };
  std::map<int, Peer> peers_;
  int64_t reordered_ = 0;
};

}  // namespace tessera::exec

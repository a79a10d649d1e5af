// How the ops of different ranks meet, decided once for every executor of a Program (the
// in-order evaluator, the SimGrid runner, the critical path): a receive completes when the send
// with its (source, destination, tag) does; the k-th collective a rank enters on a group is
// instance (group, k) on every member, the collectives nested inside compute ops counting in a
// sequence of their own. check_program() verifies that every match exists.
#pragma once

#include <cstdint>
#include <vector>

#include "shared/program/program.hpp"

namespace tessera {

struct OpMatching {
  // [rank][op]: a stream collective's instance; a compute op's index into `nested_instance` of
  // its first nested collective (the others follow); -1 otherwise.
  std::vector<std::vector<int32_t>> instance_of;
  std::vector<int32_t> nested_instance;  // the instance of each nested collective
  std::vector<int32_t> instance_group;   // the group of each instance
  // Each instance's place in its group's sequence (k), and whether that is the nested one.
  std::vector<int32_t> instance_sequence;
  std::vector<char> instance_nested;
  // [rank][op]: a send's receive, a receive's send — the op's index on `op.peer`; -1 unmatched.
  std::vector<std::vector<int32_t>> peer_op;
  std::size_t instances() const { return instance_group.size(); }
};

OpMatching match_ops(const Program& program);

}  // namespace tessera

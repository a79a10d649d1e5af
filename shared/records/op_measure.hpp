// Op measurement (docs/ALGORITHMS.md §9): every op of a traced (or simulated) iteration measured
// as the cost model charges it — compute on a core or device of its own (on a cpu-local machine
// the share of the cores it got while other ranks computed is taken out), a collective from its
// last member's arrival, a message from its send — and named by the class one fit covers.
#pragma once

#include <compare>
#include <string>
#include <vector>

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/program/program.hpp"

namespace tessera {

// The class of an op in the cost model: what one fit covers.
struct OpClass {
  enum class Type : uint8_t { kCompute, kCollective, kP2p, kOptimizer };
  Type type = Type::kCompute;
  ModuleRole role = ModuleRole::kLlm;  // compute
  Phase phase = Phase::kF;             // compute; B stands for a B and the W fused into it
  SizeClass size = SizeClass::kSmall;  // compute
  CollectiveKind kind = CollectiveKind::kAllReduce;  // collective
  int64_t group_size = 0;                            // collective
  bool local = true;                                 // collective, p2p
  auto operator<=>(const OpClass&) const = default;
};
std::string class_name(const OpClass& c);  // "llm B small", "allreduce x2 intra_node", ...

// The class of a collective of `kind` over `group` (its size, inside one node or across).
OpClass collective_class(const CostModel& cost, CollectiveKind kind, const RankList& group);

struct OpMeasure {
  OpClass cls;
  std::string op;           // op name (with the rank), for medians over iterations
  double x = 0;             // FLOPs (compute) or bytes
  double token_layers = 0;  // compute: tokens · layers
  double logits = 0;        // compute: vocabulary logits
  double calls = 0;         // compute: collective calls inside it
  double layers = 0;        // compute: transformer layers
  double seconds = 0;       // as the cost model would charge it (dedicated core, no waiting)
  double wall_s = 0;        // as the trace shows it (the enclosing op's slice for compute)
  double overlap = 0;       // compute: fraction of its time its rank ran a collective alongside
};

// The ops of one iteration measured on `timeline` (a trace's or a simulation's).
std::vector<OpMeasure> measure_ops(const Program& program, const Timeline& timeline,
                                   const ModelSpec& model, const ClusterSpec& cluster);

}  // namespace tessera

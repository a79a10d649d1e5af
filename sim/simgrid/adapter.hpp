// The SimGrid adapter: the only code that includes SimGrid headers (SimGrid 4.x renames the
// platform API; changes stay in this folder). Callers see IR types and plain numbers.
// REQUIRES for every function here: a process that has not run a SimGrid engine yet — SimGrid
// allows one engine per process and never resets its clock (use run_in_child).
#pragma once

#include "shared/cost/cost_model.hpp"
#include "shared/cost/evaluator.hpp"
#include "shared/program/program.hpp"

namespace tessera::sim {

// One message of `bytes` over a single link: with CM02, cross-traffic and the TCP window off
// this takes exactly latency + bytes / bandwidth — the property the α–β model relies on.
double simulate_lone_transfer_s(double bandwidth_bytes_per_s, double latency_s, double bytes);

struct RunOptions {
  // On: transfers are flows over the platform's links and share them (NICs, node uplinks,
  // NVLink), collectives are ring flows between their members. Off: every transfer and
  // collective is a timed activity of its α–β cost, which must reproduce evaluate() exactly.
  bool contention = true;
  // With contention on, nested TP/CP/EP collectives (inside compute ops) run as ring flows over
  // their members' links (true), or as timed activities synchronized among their members
  // (false: faster, but they no longer share links with other traffic; the Timeline says
  // whether anything else used their links meanwhile: nested_shared_links).
  bool nested_flows = true;
  // With contention on, flows that a simulated flow provably stands for (a folded class's
  // members', twins') are left out (flow_lanes.hpp). Off only to test that it is exact.
  bool fold_twin_flows = true;
  // One host thread per rank issues every op in program order and waits for it — compute,
  // collectives, receives, and the posting of sends (Gloo writes a message into the loopback
  // socket before send() returns) — as the Gloo executor runs on a CPU. Off: the Program's
  // streams overlap as on a GPU.
  bool serial_host = false;
};

// Executes `program` as a discrete-event simulation on the platform built from `cluster`
// (link bandwidths scaled by the cost model's efficiency): one actor per rank and stream.
// Returns the start and finish of every op; Timeline::error names stuck ops on a deadlock.
Timeline run_program(const Program& program, const CostModel& cost, const RunOptions& options);

}  // namespace tessera::sim

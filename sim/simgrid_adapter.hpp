// The one place that talks to SimGrid's platform API (SimGrid 4.x renames it; keep the
// changes here). Callers see plain numbers, never SimGrid types.
#pragma once

namespace tessera::sim {

// Simulates one message of `bytes` over a single link and returns its simulated duration.
// With CM02, cross-traffic and the TCP window off this is exactly latency + bytes / bandwidth —
// the property the simulator's α–β collectives rely on.
// REQUIRES: a process that has not run a SimGrid engine yet (use run_in_child).
double simulate_lone_transfer_s(double bandwidth_bytes_per_s, double latency_s, double bytes);

}  // namespace tessera::sim

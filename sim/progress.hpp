// Progress of a long command, phase by phase (enumerated, estimated, simulated, ...): on a
// terminal one line redrawn in place with a bar, the count, the rate and the ETA; in a log a
// line when a tenth more is done or 10 s have passed, and a closing line per phase.
#pragma once

#include <chrono>
#include <cstddef>
#include <ostream>
#include <string>

namespace tessera::sim {

// A rate as people read it: whole numbers from 10 a second, one decimal from 1, two significant
// digits below (a slow phase's 0.34/s, not 0/s).
std::string per_second(double rate);

class Progress {
 public:
  Progress(std::ostream& err, bool terminal) : err_(err), terminal_(terminal) {}
  // `done` of `total` items of `phase` (e.g. "estimated", with `what` such as "at 64 GPUs"),
  // the last finished item named by `last` (may be empty). A new phase or `what` starts a new
  // line; done == total closes it. A `notable` item (a failure) gets a line of its own.
  void update(const std::string& phase, const std::string& what, std::size_t done,
              std::size_t total, const std::string& last = "", bool notable = false);

 private:
  using Clock = std::chrono::steady_clock;
  std::ostream& err_;
  bool terminal_;
  std::string phase_, what_;
  Clock::time_point started_, printed_;
  std::size_t printed_tenth_ = 0;
  bool open_ = false;  // a phase is under way (on a terminal: its line is not ended)
};

}  // namespace tessera::sim

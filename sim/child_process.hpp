// Runs a function in a forked child process and returns what it wrote. SimGrid allows one
// engine per process and its clock never resets, so every simulation runs in its own child;
// a child that crashes or overruns its time limit becomes a failed result, not a dead parent.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace tessera::sim {

struct ChildResult {
  bool ok = false;         // exited with status 0
  int exit_code = -1;      // exit status, or -1 when killed by a signal
  int signal = 0;          // the signal that ended it, or 0
  bool timed_out = false;  // killed after `timeout_s`
  std::string output;      // bytes the child wrote to its result channel
  std::string error;       // why it failed, for people ("killed by signal 11", ...)
};

// `body` runs in the child and returns its result bytes; a thrown exception becomes a failed
// result carrying its message. `timeout_s` <= 0 means no limit.
ChildResult run_in_child(const std::function<std::string()>& body, double timeout_s);

// Runs every task in its own child, at most `jobs` at a time, and calls `done(index, result)`
// in the parent as each one finishes (calls are serialized, in completion order).
void run_children(const std::vector<std::function<std::string()>>& tasks, int jobs,
                  double timeout_s,
                  const std::function<void(std::size_t, const ChildResult&)>& done);

}  // namespace tessera::sim

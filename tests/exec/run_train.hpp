// Runs the tessera-train binary with arguments and collects its exit code and output (stdout and
// stderr together): the executor tests' view of the command line.
#pragma once

#include <cstdio>
#include <string>

#include <sys/wait.h>

#include <doctest/doctest.h>

struct Run {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string output;
};

// Starts tessera-train with `args` in the background; finish() waits for it.
inline FILE* start(const std::string& args) {
  FILE* pipe = ::popen((std::string(TESSERA_TRAIN) + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  return pipe;
}

inline Run finish(FILE* pipe) {
  Run r;
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline Run run(const std::string& args) {
  return finish(start(args));
}

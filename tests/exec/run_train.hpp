// Runs the tessera-train binary with arguments and collects its exit code and output (stdout and
// stderr together): the executor tests' view of the command line.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include <sys/wait.h>

#include <doctest/doctest.h>

struct Run {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string output;
};

// The tessera-train binary: the build's, or TESSERA_TRAIN_BIN's where a build made on another
// machine was carried to this one (scripts/gpu-check.sh sets it).
inline std::string train_binary() {
  const char* carried = std::getenv("TESSERA_TRAIN_BIN");
  return carried != nullptr && *carried != '\0' ? carried : TESSERA_TRAIN;
}

// Starts tessera-train with `args` in the background; finish() waits for it.
inline FILE* start(const std::string& args) {
  FILE* pipe = ::popen((train_binary() + " " + args + " 2>&1").c_str(), "r");
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

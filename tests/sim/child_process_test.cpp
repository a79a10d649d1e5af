#include <doctest/doctest.h>

#include <csignal>
#include <stdexcept>

#include <unistd.h>

#include "sim/child_process.hpp"
#include "sim/simgrid/adapter.hpp"

using namespace tessera::sim;

TEST_CASE("a child returns its bytes") {
  const ChildResult r = run_in_child([] { return std::string("hello\0world", 11); }, 10);
  CHECK(r.ok);
  CHECK(r.output == std::string("hello\0world", 11));
}

TEST_CASE("a child that throws, crashes or hangs becomes a failed result") {
  const ChildResult thrown =
      run_in_child([]() -> std::string { throw std::runtime_error("bad plan"); }, 10);
  CHECK_FALSE(thrown.ok);
  CHECK(thrown.error == "bad plan");

  const ChildResult crashed = run_in_child(
      []() -> std::string {
        std::raise(SIGSEGV);
        return "";
      },
      10);
  CHECK_FALSE(crashed.ok);
  CHECK(crashed.signal == SIGSEGV);
  CHECK(crashed.error.find("killed by signal 11") == 0);

  const ChildResult hung = run_in_child(
      []() -> std::string {
        ::sleep(30);
        return "late";
      },
      0.3);
  CHECK_FALSE(hung.ok);
  CHECK(hung.timed_out);
}

TEST_CASE(
    "SimGrid: a lone transfer takes exactly latency + size / bandwidth, one engine per child") {
  // Two simulations in a row: each needs its own process (SimGrid's clock never resets).
  for (double bytes : {1e6, 1e9}) {
    const ChildResult r = run_in_child(
        [bytes] { return std::to_string(simulate_lone_transfer_s(50e9, 5e-6, bytes)); }, 60);
    INFO(r.error);
    REQUIRE(r.ok);
    CHECK(std::stod(r.output) == doctest::Approx(5e-6 + bytes / 50e9).epsilon(1e-9));
  }
}

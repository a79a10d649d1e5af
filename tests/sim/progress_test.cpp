#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>

#include "sim/progress.hpp"

using tessera::sim::Progress;

TEST_CASE("progress in a log: a quick phase gets its closing line only, a failure its own line") {
  std::ostringstream log;
  Progress p(log, false);
  for (std::size_t i = 0; i <= 100; ++i) p.update("estimated", "at 8 GPUs", i, 100);
  p.update("simulated", "", 0, 3);
  p.update("simulated", "", 1, 3, "plan a: step 1 s");
  p.update("simulated", "", 2, 3, "plan b: failed: killed by signal 9", true);
  p.update("simulated", "", 3, 3, "plan c: step 2 s");
  const std::string text = log.str();
  INFO(text);
  CHECK(text.starts_with("100 estimated at 8 GPUs in "));
  CHECK(text.find("2/3 simulated: plan b: failed: killed by signal 9\n") != std::string::npos);
  CHECK(text.find("3 simulated in ") != std::string::npos);
  CHECK(text.ends_with("; last: plan c: step 2 s\n"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 3);
  // An empty phase closes at once.
  std::ostringstream empty;
  Progress q(empty, false);
  q.update("estimated", "at 2 GPUs", 0, 0);
  CHECK(empty.str().starts_with("0 estimated at 2 GPUs in "));
}

TEST_CASE("progress on a terminal: one line redrawn, ended when the phase ends") {
  std::ostringstream tty;
  Progress p(tty, true);
  p.update("simulated", "", 0, 2);
  p.update("simulated", "", 2, 2);
  const std::string text = tty.str();
  INFO(text);
  CHECK(text.starts_with("\r[........................] 0/2 simulated"));
  CHECK(text.find("\r[########################] 2/2 simulated, ") != std::string::npos);
  CHECK(text.find("took") != std::string::npos);
  CHECK(text.ends_with("\n"));
}

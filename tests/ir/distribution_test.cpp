#include <doctest/doctest.h>

#include <cmath>

#include "shared/spec/distribution.hpp"

using namespace tessera;

static Distribution parse(const char* text, Diagnostics& diag) {
  Distribution d;
  read_distribution(Json::parse(text), "w.json", "d", d, true, diag);
  return d;
}

TEST_CASE("Rng is deterministic and uniform_int stays in range") {
  Rng a(42), b(42), c(43);
  CHECK(a.next() == b.next());
  CHECK(a.next() != c.next());
  Rng r(1);
  for (int i = 0; i < 1000; ++i) {
    const int64_t x = r.uniform_int(-3, 5);
    CHECK((x >= -3 && x <= 5));
  }
}

TEST_CASE("distributions: draws respect bounds, means match") {
  Diagnostics diag;
  const Distribution ln =
      parse(R"({"dist":"lognormal","median":300,"sigma":0.7,"min":16,"max":8192})", diag);
  const Distribution ch =
      parse(R"({"dist":"choice","values":[0,1,8],"weights":[0.5,0.25,0.25]})", diag);
  REQUIRE(diag.ok());
  Rng rng(7);
  double sum = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = sample(ln, rng, 1e9);
    CHECK((x >= 16 && x <= 8192));
    sum += sample(ch, rng, 1e9);
  }
  CHECK(std::fabs(sum / n - dist_mean(ch)) < 0.1);  // mean 2.25
  CHECK(dist_mean(ch) == doctest::Approx(2.25));
}

// Found by fuzz/scenario: a draw of 6.9e99 cast to int64 (undefined behaviour).
TEST_CASE("draws are capped at the quantity's limit") {
  Diagnostics diag;
  const Distribution wide = parse(R"({"dist":"lognormal","median":1e30,"sigma":1})", diag);
  const Distribution uniform = parse(R"({"dist":"uniform","min":1,"max":1e12})", diag);
  REQUIRE(diag.ok());
  Rng rng(3);
  for (int i = 0; i < 100; ++i) {
    CHECK(sample_int(wide, rng, 4096) == 4096);
    const int64_t u = sample_int(uniform, rng, 4096);
    CHECK((u >= 1 && u <= 4096));
  }
}

TEST_CASE("distribution errors") {
  Diagnostics diag;
  parse(R"({"dist":"normal","mean":5,"std":-1})", diag);
  parse(R"({"dist":"choice","values":[1,2],"weights":[1]})", diag);
  parse(R"({"dist":"normal","mean":5,"std":10})", diag);  // can go negative
  parse(R"({"dist":"gauss"})", diag);
  REQUIRE(diag.errors().size() == 4);
  CHECK(diag.errors()[0].path == "d.std");
  CHECK(diag.errors()[1].path == "d.weights");
  CHECK(diag.errors()[2].message.find("negative") != std::string::npos);
  CHECK(diag.errors()[3].message.find("unknown value 'gauss'") != std::string::npos);
}

TEST_CASE("distribution JSON round trip") {
  Diagnostics diag;
  for (const char* text : {"12", R"({"dist":"uniform","min":1,"max":8})",
                           R"({"dist":"lognormal","median":300,"sigma":0.7,"min":16,"max":8192})",
                           R"({"dist":"choice","values":[0,1,8],"weights":[0.5,0.25,0.25]})"}) {
    const Distribution d = parse(text, diag);
    Distribution again;
    REQUIRE(read_distribution(to_json(d), "", "", again, true, diag));
    CHECK(again == d);
  }
  CHECK(diag.ok());
}

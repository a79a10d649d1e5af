#include <doctest/doctest.h>

#include "shared/base/json_reader.hpp"

using namespace tessera;

TEST_CASE("a syntax error names line and column") {
  Diagnostics diag;
  const auto json = parse_json_text("{\n  \"a\": 1,\n  \"b\": ]\n}", "x.json", diag);
  CHECK_FALSE(json.has_value());
  REQUIRE(diag.errors().size() == 1);
  CHECK(diag.errors()[0].file == "x.json");
  CHECK(diag.errors()[0].message.find("line 3, column 8") != std::string::npos);
}

// Found by fuzz/profile: nlohmann throws out_of_range, not parse_error, for a number too large
// for a double, and it escaped every reader (terminate).
TEST_CASE("a number too large for a double is an input error with its place") {
  Diagnostics diag;
  const auto json = parse_json_text("{\n  \"a\": 1,\n  \"b\": 8.7e85463748062\n}", "x.json", diag);
  CHECK_FALSE(json.has_value());
  REQUIRE(diag.errors().size() == 1);
  CHECK(diag.errors()[0].file == "x.json");
  CHECK(diag.errors()[0].message.find("line 3, column 8") != std::string::npos);
  CHECK(diag.errors()[0].message.find("number overflow") != std::string::npos);
}

TEST_CASE("a missing file is an input error, not a crash") {
  Diagnostics diag;
  CHECK_FALSE(read_json_file("/nonexistent/tessera.json", diag).has_value());
  CHECK(diag.format().find("file not found") != std::string::npos);
}

TEST_CASE("unknown keys are reported with the closest known key") {
  Diagnostics diag;
  const Json j = Json::parse(R"({"layers": 2, "hiden": 64})");
  ObjectReader r(j, "m.json", "model", diag);
  int64_t layers = 0, hidden = 0;
  r.required("layers", layers);
  r.optional("hidden", hidden);
  r.finish();
  REQUIRE(diag.errors().size() == 1);
  CHECK(diag.errors()[0].path == "model.hiden");
  CHECK(diag.errors()[0].message == "unknown key (did you mean 'hidden'?)");
}

TEST_CASE("wrong types name the expected and the actual type") {
  Diagnostics diag;
  const Json j = Json::parse(R"({"n": "four", "x": 2.5, "b": 1, "ok": 4.0})");
  ObjectReader r(j, "f.json", "", diag);
  int64_t n = 0, x = 0, ok = 0;
  bool b = false;
  r.required("n", n);
  r.required("x", x);
  r.required("b", b);
  CHECK(r.required("ok", ok));
  CHECK(ok == 4);
  r.finish();
  REQUIRE(diag.errors().size() == 3);
  CHECK(diag.errors()[0].message == "expected an integer, got string");
  CHECK(diag.errors()[1].message == "expected an integer, got 2.5");
  CHECK(diag.errors()[2].message == "expected true or false, got integer");
}

TEST_CASE("aliases: either name works, both at once is an error") {
  Diagnostics diag;
  const Json one = Json::parse(R"({"tensor_model_parallel_size": 4})");
  ObjectReader r1(one, "", "", diag);
  int64_t tp = 1;
  CHECK(r1.optional({"tp", "tensor_model_parallel_size"}, tp));
  CHECK(tp == 4);
  r1.finish();
  CHECK(diag.ok());
  const Json both = Json::parse(R"({"tp": 2, "tensor_model_parallel_size": 4})");
  ObjectReader r2(both, "", "", diag);
  r2.optional({"tp", "tensor_model_parallel_size"}, tp);
  CHECK_FALSE(diag.ok());
}

TEST_CASE("enum values list the valid spellings and suggest one") {
  Diagnostics diag;
  const EnumTable<int> table = {{"gpipe", 0}, {"1f1b", 1}};
  int value = -1;
  CHECK_FALSE(read_enum(Json("1f1c"), "p.json", "plan.schedule", value, table, diag));
  CHECK(diag.errors()[0].message ==
        "unknown value '1f1c' (did you mean '1f1b'?); valid: gpipe, 1f1b");
}

TEST_CASE("edit distance and closest match") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(closest_match("globl_batch", {"global_batch", "seed"}) == "global_batch");
  CHECK(closest_match("zzzzzz", {"global_batch", "seed"}).empty());
  // Ties go to the longer common prefix.
  CHECK(closest_match("tpp", {"cp", "dp", "pp", "tp"}) == "tp");
}

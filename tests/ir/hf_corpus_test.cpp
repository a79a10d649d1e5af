// The corpus of real Hub configs (tests/data/hf-corpus/): every file as published, each imported
// and checked against its published parameter count, or refused for a named family or value.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "shared/model/model_math.hpp"
#include "shared/spec/hf_import.hpp"

using namespace tessera;

namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(TESSERA_SOURCE_DIR) / "tests/data/hf-corpus";

// A published count: an integer is exact; a string such as "8.29B" or "894M" is rounded, and
// matches anything that rounds to it (within half a unit of its last digit).
struct Published {
  double value = 0;
  double tolerance = 0;
};

Published published(const Json& count) {
  if (count.is_number_integer()) return {static_cast<double>(count.get<int64_t>()), 0};
  const std::string text = count.get<std::string>();
  REQUIRE_FALSE(text.empty());
  const char unit = text.back();
  const double scale = unit == 'B' ? 1e9 : unit == 'M' ? 1e6 : unit == 'K' ? 1e3 : 0;
  REQUIRE(scale > 0);
  const std::string digits = text.substr(0, text.size() - 1);
  const auto dot = digits.find('.');
  const int decimals = dot == std::string::npos ? 0 : static_cast<int>(digits.size() - dot - 1);
  return {std::stod(digits) * scale, 0.5 * scale * std::pow(10.0, -decimals)};
}

}  // namespace

TEST_CASE("published counts: exact integers, or rounded figures matched within their rounding") {
  CHECK(published(Json(123)).tolerance == 0);
  CHECK(published(Json("8.29B")).value == doctest::Approx(8.29e9));
  CHECK(published(Json("8.29B")).tolerance == doctest::Approx(5e6));
  CHECK(published(Json("894M")).tolerance == doctest::Approx(5e5));
}

TEST_CASE("every real config of the corpus imports with its published count, or is refused") {
  const Json manifest = Json::parse(std::ifstream(kCorpus / "corpus.json"));
  std::set<std::string> listed;
  int imported = 0;
  int refused = 0;
  int exact = 0;
  int resaved = 0;
  for (const Json& entry : manifest.at("configs")) {
    const std::string file = entry.at("file").get<std::string>();
    INFO(file);
    CHECK(listed.insert(file).second);  // each file once
    // Every entry says where it was found, and either the Hub repository that publishes it or,
    // for a config that save_pretrained wrote again (a fine-tune, a quantization), the Hub model
    // it re-saves.
    const bool resave = entry.contains("resave_of");
    resaved += resave ? 1 : 0;
    CHECK(resave != entry.contains("hub_id"));
    CHECK(entry.value(resave ? "resave_of" : "hub_id", "").find('/') != std::string::npos);
    CHECK_FALSE(entry.at("source").get<std::string>().empty());

    const std::string path = (kCorpus / "configs" / file).string();
    Diagnostics diag;
    const auto json = read_json_file(path, diag);
    REQUIRE(json.has_value());
    const auto model = import_hf_config(*json, path, {}, diag);
    if (const auto why = entry.find("refused"); why != entry.end()) {
      // Refused, for the family or value the manifest names.
      ++refused;
      CHECK_FALSE(model.has_value());
      INFO(diag.format());
      CHECK(diag.format().find(why->get<std::string>()) != std::string::npos);
      continue;
    }
    ++imported;
    INFO(diag.format());
    REQUIRE(model.has_value());
    CHECK(diag.ok());
    if (const auto count = entry.find("params"); count != entry.end()) {
      const Published p = published(*count);
      exact += p.tolerance == 0 ? 1 : 0;
      INFO("published " << count->dump() << " (" << entry.value("params_source", "")
                        << "), imported " << model_parameters(*model));
      CHECK(std::fabs(static_cast<double>(model_parameters(*model)) - p.value) <= p.tolerance);
    }
  }
  // The folder holds just what the manifest lists.
  for (const auto& f : fs::directory_iterator(kCorpus / "configs")) {
    INFO(f.path().string());
    CHECK(listed.contains(f.path().filename().string()));
  }
  MESSAGE(imported << " imported (" << exact << " against exact counts), " << refused
                   << " refused; " << resaved << " of them re-saved by save_pretrained");
  // The corpus only grows: at least this many files.
  CHECK(imported + refused >= 100);
}

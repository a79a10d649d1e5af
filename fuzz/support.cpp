#include "fuzz/support.hpp"

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace tessera::fuzz {

namespace fs = std::filesystem;

std::string_view as_text(const uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

namespace {
std::string* scratch = nullptr;
pid_t scratch_owner = 0;
// libFuzzer's -fork mode runs children that exit through here too: only the maker removes it.
void remove_scratch() {
  std::error_code ignored;
  if (getpid() == scratch_owner) fs::remove_all(*scratch, ignored);
}
}  // namespace

const std::string& scratch_dir() {
  if (scratch == nullptr) {
    scratch_owner = getpid();
    scratch = new std::string(
        (fs::temp_directory_path() / ("tessera-fuzz-" + std::to_string(scratch_owner))).string());
    fs::create_directories(*scratch);
    std::atexit(remove_scratch);
  }
  return *scratch;
}

void write_text(const std::string& file, std::string_view text) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (!out) fail("cannot write the scratch file " + file);
}

void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property broken: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {
bool verbose() {
  static const bool on = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  return on;
}
}  // namespace

void refused(const char* what, const Diagnostics& diag) {
  if (diag.ok()) fail(std::string(what) + " refused without a reason");
  if (verbose()) std::fprintf(stderr, "  %s refused:\n%s", what, diag.format().c_str());
}

void accepted(const char* what, const Diagnostics& diag) {
  if (!diag.ok()) fail(std::string(what) + " accepted with errors:\n" + diag.format());
  if (verbose()) std::fprintf(stderr, "  %s accepted\n", what);
}

}  // namespace tessera::fuzz

// tessera: what-if analysis for multimodal LLM training. Dispatches to sim/commands.cpp.
#include <cstring>
#include <exception>
#include <iostream>

#include "shared/base/check.hpp"
#include "shared/base/diagnostics.hpp"
#include "sim/commands.hpp"

namespace {

void usage(std::ostream& out) {
  out << "usage: tessera <command> [options]   (tessera <command> --help for "
         "details)\n\ncommands:\n";
  for (const auto& c : tessera::sim::commands()) {
    std::string name = c.name;
    name.resize(12, ' ');
    out << "  " << name << c.summary << "\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(std::cerr);
    return 2;
  }
  const std::string name = argv[1];
  tessera::set_warning_reporter(tessera::print_warnings_once(std::cerr));
  if (name == "-h" || name == "--help" || name == "help") {
    usage(std::cout);
    return 0;
  }
  for (const auto& c : tessera::sim::commands()) {
    if (name != c.name) continue;
    try {
      return c.run(tessera::sim::Args(argv + 2, argv + argc), std::cout, std::cerr);
    } catch (const tessera::InternalError& e) {
      std::cerr << "tessera " << name << ": internal error: " << e.what() << "\n";
      return 1;
    } catch (const std::exception& e) {
      std::cerr << "tessera " << name << ": " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "tessera: unknown command '" << name << "'\n";
  usage(std::cerr);
  return 2;
}

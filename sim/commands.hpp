// The `tessera` subcommands. Each parses its flags into IR structs, calls the libraries and
// returns an exit code: 0 ok, 1 failure while running, 2 bad input. main.cpp only dispatches.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tessera::sim {

using Args = std::vector<std::string>;  // the arguments after the subcommand name

int run_validate(const Args& args, std::ostream& out, std::ostream& err);
int run_show(const Args& args, std::ostream& out, std::ostream& err);
int run_import_hf(const Args& args, std::ostream& out, std::ostream& err);
int run_lower(const Args& args, std::ostream& out, std::ostream& err);
int run_estimate(const Args& args, std::ostream& out, std::ostream& err);
int run_simulate(const Args& args, std::ostream& out, std::ostream& err);
int run_sweep(const Args& args, std::ostream& out, std::ostream& err);
int run_merge(const Args& args, std::ostream& out, std::ostream& err);
int run_calibrate(const Args& args, std::ostream& out, std::ostream& err);
int run_replay(const Args& args, std::ostream& out, std::ostream& err);
int run_fidelity(const Args& args, std::ostream& out, std::ostream& err);
int run_stages(const Args& args, std::ostream& out, std::ostream& err);
int run_gemms(const Args& args, std::ostream& out, std::ostream& err);
int run_export(const Args& args, std::ostream& out, std::ostream& err);
int run_tune(const Args& args, std::ostream& out, std::ostream& err);

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args&, std::ostream&, std::ostream&);
};
const std::vector<Command>& commands();

}  // namespace tessera::sim

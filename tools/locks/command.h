// Sub-command registry of the `locks` CLI: each cmd_*.cpp registers itself with
// LOCKS_COMMAND, so adding a command touches no shared file.
#pragma once

#include <string>
#include <vector>

namespace locks::cli {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);  // args after the command name
};

std::vector<Command>& commands();

struct Registrar {
  explicit Registrar(Command c) { commands().push_back(c); }
};

}  // namespace locks::cli

#define LOCKS_COMMAND(ident, name, summary, fn) \
  static ::locks::cli::Registrar locks_cmd_##ident({name, summary, fn})

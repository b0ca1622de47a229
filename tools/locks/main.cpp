// `locks`: dispatches to the sub-commands registered through command.h.
// Exit codes: 0 success, 1 bad data (locks::Error or another failure), 2 usage error.
#include <algorithm>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "command.h"
#include "locks/error.h"
#include "usage.h"

namespace locks::cli {

std::vector<Command>& commands() {
  static std::vector<Command> registry;  // function-local: safe during static registration
  return registry;
}

}  // namespace locks::cli

namespace {

using locks::cli::Command;

std::vector<Command> sorted_commands() {
  std::vector<Command> cs = locks::cli::commands();
  std::sort(cs.begin(), cs.end(),
            [](const Command& a, const Command& b) { return std::strcmp(a.name, b.name) < 0; });
  return cs;
}

void print_usage(std::ostream& os) {
  os << "usage: locks <command> [options]\n"
        "       locks help [<command>]\n\n"
        "LOCKS: page-local compact key summaries for long-context decode (CPU tools).\n\n"
        "commands:\n";
  for (const Command& c : sorted_commands()) {
    // Pad names to a 10-column field; long names get two spaces (no unsigned wrap-around).
    const size_t len = std::strlen(c.name);
    os << "  " << c.name << std::string(len < 8 ? 10 - len : 2, ' ') << c.summary << "\n";
  }
  os << "\nRun 'locks <command> --help' for a command's options.\n"
        "Exit status: 0 success, 1 bad input data, 2 usage error.\n";
}

const Command* find_command(const std::string& name) {
  for (const Command& c : locks::cli::commands())
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(std::cerr);
    return 2;
  }
  std::string name = args[0];
  if (name == "help" || name == "--help" || name == "-h") {
    if (args.size() == 1) {
      print_usage(std::cout);
      return 0;
    }
    name = args[1];  // `locks help CMD` is `locks CMD --help`
    args = {name, "--help"};
  }
  const Command* cmd = find_command(name);
  if (!cmd) {
    std::cerr << "locks: unknown command '" << name << "'\n\n";
    print_usage(std::cerr);
    return 2;
  }
  try {
    const int status = cmd->run(std::vector<std::string>(args.begin() + 1, args.end()));
    // Results go to stdout: a failed write there (a full disk, a closed pipe) is an error,
    // not a silent success.
    std::cout.flush();
    if (!std::cout) throw locks::Error("cannot write the results to stdout");
    return status;
  } catch (const locks::cli::UsageError& e) {
    std::cerr << "locks " << name << ": usage error: " << e.what() << "\n"
              << "Run 'locks " << name << " --help' for usage.\n";
    return 2;
  } catch (const locks::Error& e) {
    std::cerr << "locks " << name << ": error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "locks " << name << ": error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "locks " << name << ": error: " << e.what() << "\n";
    return 1;
  }
}

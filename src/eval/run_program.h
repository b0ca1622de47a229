// Runs an external program (gnuplot for the plots) from an argument vector: no shell, so no
// file or folder name can be read as a command, whatever characters it holds.
#pragma once

#include <string>
#include <vector>

namespace locks::eval {

struct ProgramResult {
  bool started = false;  // false: not found on PATH or not executable (see error)
  int exit_code = -1;    // the exit status when it exited, -1 when killed by a signal
  std::string error;     // why it did not start or did not exit 0
};

// Runs argv[0] (looked up on PATH) with argv, in folder `cwd`, stdin from /dev/null, stdout
// and stderr appended to `log_path`. Waits for it to finish.
ProgramResult run_program(const std::vector<std::string>& argv, const std::string& cwd,
                          const std::string& log_path);

}  // namespace locks::eval

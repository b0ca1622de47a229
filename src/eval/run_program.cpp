// posix_spawnp (not std::system / popen: those run /bin/sh on a command line). glibc's
// posix_spawnp reports a failed chdir or exec as its return value.
#include "run_program.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace locks::eval {

ProgramResult run_program(const std::vector<std::string>& argv, const std::string& cwd,
                          const std::string& log_path) {
  ProgramResult r;
  if (argv.empty()) {
    r.error = "no program given";
    return r;
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addchdir_np(&fa, cwd.c_str());
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // Opened after the chdir, so a relative log path would be relative to cwd: use the full one.
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0666);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) {
    r.error = err == ENOENT ? argv[0] + " not found on PATH (or cannot enter " + cwd + ")"
                            : argv[0] + ": cannot run (" + std::strerror(err) + ")";
    return r;
  }
  r.started = true;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      r.error = std::string("waitpid failed (") + std::strerror(errno) + ")";
      return r;
    }
  }
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    if (r.exit_code != 0) r.error = argv[0] + " exited with status " + std::to_string(r.exit_code);
  } else {
    r.error = argv[0] + " was killed by signal " + std::to_string(WTERMSIG(status));
  }
  return r;
}

}  // namespace locks::eval

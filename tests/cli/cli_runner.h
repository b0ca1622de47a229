// Runs the built `locks` binary (LOCKS_BIN) as a child process from an argument vector (no
// shell: arguments reach it byte for byte, apostrophes included), in a given folder, with
// stdout and stderr captured apart and a time limit (a hang is a failure, not a stuck suite).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace locks::test {

struct Proc {
  int code = -1;  // exit status; -1 killed by a signal, -2 timed out (killed)
  std::string out, err;
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct RunOptions {
  std::filesystem::path cwd;     // the child's working folder (required)
  double timeout_s = 120;        // killed after this long
  long long max_file_bytes = 0;  // > 0: RLIMIT_FSIZE for the child (simulates a full disk)
};

inline Proc run_locks(const std::vector<std::string>& args, const RunOptions& ro) {
  namespace fs = std::filesystem;
  const fs::path out = ro.cwd / ".locks_stdout", err = ro.cwd / ".locks_stderr";
  std::vector<std::string> all{LOCKS_BIN};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int fo = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int fe = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::chdir(ro.cwd.c_str()) != 0) ::_exit(126);
    ::dup2(fo, STDOUT_FILENO);
    ::dup2(fe, STDERR_FILENO);
    const int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    if (ro.max_file_bytes > 0) {
      // A write past the limit then fails with EFBIG instead of raising SIGXFSZ (an ignored
      // signal stays ignored across exec).
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{rlim_t(ro.max_file_bytes), rlim_t(ro.max_file_bytes)};
      ::setrlimit(RLIMIT_FSIZE, &lim);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fo);
  ::close(fe);
  Proc r;
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) {
      r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      break;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
        ro.timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.code = -2;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.out = slurp(out);
  r.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return r;
}

}  // namespace locks::test

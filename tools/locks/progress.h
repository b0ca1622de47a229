// Progress of long work (summary builds) on stderr, so stdout stays clean for results.
// On a terminal the line is redrawn in place; otherwise only the final line is printed.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace locks::cli {

class Progress {
 public:
  Progress(std::string label, int64_t total)
      : label_(std::move(label)),
        total_(total),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void update(int64_t done) {
    const int pct = total_ > 0 ? static_cast<int>(100 * done / total_) : 100;
    if (tty_ && pct != last_pct_) {
      std::fprintf(stderr, "\r%s: %3d%%", label_.c_str(), pct);
      std::fflush(stderr);
    }
    last_pct_ = pct;
  }

  // Prints the elapsed time; returns it in seconds.
  double finish() {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "%s%s: done in %.2f s\n", tty_ ? "\r" : "", label_.c_str(), s);
    return s;
  }

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  int last_pct_ = -1;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace locks::cli

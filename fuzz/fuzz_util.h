// Shared by the harnesses: a private scratch folder per fuzzing process (the readers under
// test read files, so inputs are written to disk; /dev/shm when there, to keep it fast).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace locks::fuzz {

inline const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    // fuzz/run.sh gives a folder it removes afterwards (libFuzzer may leave by _Exit, which
    // skips the atexit clean-up below).
    const char* given = std::getenv("LOCKS_FUZZ_SCRATCH");
    const std::filesystem::path base = given && *given ? std::filesystem::path(given)
                                       : std::filesystem::exists("/dev/shm")
                                           ? "/dev/shm"
                                           : std::filesystem::temp_directory_path();
    auto d = base / ("locks_fuzz_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch(), ec);
    });
    return d;
  }();
  return dir;
}

inline void write_bytes(const std::filesystem::path& p, const uint8_t* data, size_t n) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  if (!f) std::abort();
  if (n && std::fwrite(data, 1, n, f) != n) std::abort();
  std::fclose(f);
}

}  // namespace locks::fuzz

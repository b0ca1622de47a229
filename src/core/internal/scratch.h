// Scratch memory of the CPU ops: one buffer cut into per-thread slices, so that a run with a
// caller's workspace (contract.h) allocates nothing, and the older entry points that own no
// workspace allocate it once per call (OwnedScratch) instead of once per thread.
#pragma once

#include <omp.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace locks::detail {

inline constexpr size_t kScratchAlign = 64;
inline constexpr size_t align_up(size_t n, size_t a = kScratchAlign) { return (n + a - 1) / a * a; }

// Bytes `take<T>(n)` consumes (rounded so that every array starts cache-line aligned).
template <typename T>
constexpr size_t carve_bytes(size_t n) {
  return align_up(n * sizeof(T));
}

// Hands out consecutive arrays from a slice (the caller sized it with carve_bytes).
class Carver {
 public:
  explicit Carver(std::byte* p) : p_(p) {}
  template <typename T>
  T* take(size_t n) {
    T* r = reinterpret_cast<T*>(p_);
    p_ += carve_bytes<T>(n);
    return r;
  }

 private:
  std::byte* p_;
};

struct ThreadScratch {
  std::byte* base = nullptr;
  size_t per_thread = 0;  // bytes of one slice, a multiple of kScratchAlign
  int threads = 1;        // parallel regions run with at most this many threads
  std::byte* slice(int t) const { return base + size_t(t) * per_thread; }
  size_t bytes() const { return per_thread * size_t(threads); }
};

// Per-thread bytes for shapes not yet validated (the older entry points size the scratch
// before their checks run): 0 unless every argument is >= 1 and the result is plausible;
// a 0-byte scratch then fails the op's size check after the argument checks.
template <typename F, typename... Args>
size_t checked_bytes(F&& f, Args... args) {
  if (((args < 1) || ...)) return 0;
  const size_t n = f(args...);
  return n <= (size_t(1) << 28) ? n : 0;
}

// The older entry points' scratch: one allocation per call, every thread OpenMP may use.
class OwnedScratch {
 public:
  explicit OwnedScratch(size_t per_thread) {
    view_.per_thread = align_up(per_thread);
    view_.threads = omp_get_max_threads();
    buf_.resize(view_.bytes() + kScratchAlign);
    const auto a = reinterpret_cast<uintptr_t>(buf_.data());
    view_.base = buf_.data() + (align_up(a) - a);
  }
  const ThreadScratch& view() const { return view_; }

 private:
  std::vector<std::byte> buf_;
  ThreadScratch view_;
};

}  // namespace locks::detail

// Thread count of the OpenMP runtime that locks_core runs on (the system libgomp, not the one
// bundled with torch). Decode-step operators are small (tens of microseconds of work at a few
// thousand tokens): waking a second OpenMP pool next to torch's own costs milliseconds on a
// busy 2-core machine (measured: select_pages 22 ms with 2 threads, 0.4 ms with 1), so the
// package sets 1 thread by default (LOCKS_NUM_THREADS overrides; docs/python.md).
#include <omp.h>
#include <torch/library.h>

namespace {
void set_num_threads(int64_t n) {
  TORCH_CHECK_VALUE(n >= 1, "set_num_threads: n must be >= 1, got ", n);
  omp_set_num_threads(static_cast<int>(n));
}
int64_t get_num_threads() { return omp_get_max_threads(); }
}  // namespace

TORCH_LIBRARY_FRAGMENT(locks, m) {
  m.def("set_num_threads(int n) -> ()", &set_num_threads);
  m.def("get_num_threads() -> int", &get_num_threads);
}

// The GPU benches' shared timing pieces (locks_bench_cuda, locks_bench_gather): the CUDA error
// check, the L2 flush, the median of event-timed runs with the L2 flushed before each, and the
// streaming read that gives the read ceiling. One translation unit per bench includes it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace bench {

// Read ceiling: every thread streams 16-byte loads; the sum is kept so nothing is elided.
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  ~Timer() { cudaEventDestroy(a), cudaEventDestroy(b); }
};

// The flush buffer: main allocates kFlushBytes (larger than any L2) before the first timing.
inline void* g_flush = nullptr;
inline constexpr size_t kFlushBytes = size_t(256) << 20;
inline void flush_l2(cudaStream_t st) { CK(cudaMemsetAsync(g_flush, 0, kFlushBytes, st)); }

// Median time (ms) of fn() over reps, L2 flushed before each (two warm-up runs first).
template <typename F>
double median_ms(F fn, cudaStream_t st, int reps) {
  Timer t;
  std::vector<double> v;
  for (int i = 0; i < reps + 2; ++i) {
    flush_l2(st);
    CK(cudaEventRecord(t.a, st));
    fn();
    CK(cudaEventRecord(t.b, st));
    CK(cudaEventSynchronize(t.b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t.a, t.b));
    if (i >= 2) v.push_back(ms);
  }
  CK(cudaGetLastError());  // a launch fn() made that failed
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench

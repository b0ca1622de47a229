// Device pieces shared by the two page-scoring kernels (score_mma.cu, score_generic.cu): the
// summary arrays by value, and the chunk epilogue (scores and per-chunk LSE partials).
#pragma once

#include <cstdint>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/rules.h"
#include "ptx.cuh"

namespace locks::cuda::detail {

struct SumView {  // the summary arrays, by value for kernels
  const float* mu;
  const float* basis;
  const float* coeff;
  const int8_t* mu_q;
  const float* mu_scale;
  const uint8_t* basis_q;
  const float* basis_scale;  // [N, H, r, d / basis_group]
  const int8_t* coeff_q;
  const float* coeff_scale;
  int64_t num_blocks;    // block ids outside [0, num_blocks) are never dereferenced (score -inf)
  const float* qweight;  // [H, d] query weights (query-weighted summaries) or nullptr
  int basis_group;       // dims per int4 basis scale (d: one a row)
};

inline SumView sum_view(const SummaryView& s) {
  return {s.mu,          s.basis,
          s.coeff,       s.mu_q,
          s.mu_scale,    s.basis_q,
          s.basis_scale, s.coeff_q,
          s.coeff_scale, s.layout.num_blocks,
          s.qweight,     s.layout.basis_group};
}

namespace {

// 2^-e normaliser so that max |x| * f lies in [1, 2) (1 for 0 or non-normal values).
__device__ __forceinline__ float pow2_normaliser(float mx) {
  const int e = int((__float_as_uint(mx) >> 23) & 0xffu) - 127;
  if (mx == 0.0f || e <= -126 || e >= 127) return 1.0f;
  return __uint_as_float(uint32_t(127 - e) << 23);
}

// Writes the chunk's scores (smem sc[g][ld], the first cp columns used) of the G query heads
// hq0 .. hq0 + G - 1 to head_scores and the chunk LSE partials; cp = pages of the chunk.
__device__ void write_chunk(const float* sc, int ld, int cp, int G, int b, int hq0, int Hq, int M,
                            int chunk, int n_chunks, float* head_scores, float* chunk_lse) {
  const int j0 = chunk * cp;
  for (int e = threadIdx.x; e < G * cp; e += blockDim.x) {
    const int g = e / cp, jj = e % cp;
    if (j0 + jj < M) head_scores[(int64_t(b) * Hq + hq0 + g) * M + j0 + jj] = sc[g * ld + jj];
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int g = warp; g < G; g += nw) {
    float m = kNegInf;
    for (int jj = lane; jj < cp; jj += 32) m = fmaxf(m, sc[g * ld + jj]);
    m = warp_max(m);
    float l = 0.0f;
    if (m != kNegInf)
      for (int jj = lane; jj < cp; jj += 32) l += __expf(sc[g * ld + jj] - m);
    l = warp_sum(l);
    if (lane == 0) {
      float* o = chunk_lse + ((int64_t(b) * Hq + hq0 + g) * n_chunks + chunk) * 2;
      o[0] = m;
      o[1] = l;
    }
  }
}

// A chunk that holds none of the row's full pages: its G heads' scores are -inf and its LSE
// partials (-inf, 0), what write_chunk writes for a chunk of -inf scores (the same bits), without
// the query's fragments. A step planned for long rows (a vLLM engine's max_model_len) serving
// short ones launches mostly such chunks. head_scores == nullptr: the partials alone.
__device__ void write_empty_chunk(int cp, int G, int b, int hq0, int Hq, int M, int chunk,
                                  int n_chunks, float* head_scores, float* chunk_lse) {
  const int j0 = chunk * cp;
  for (int e = threadIdx.x; head_scores && e < G * cp; e += blockDim.x) {
    const int g = e / cp, jj = e % cp;
    if (j0 + jj < M) head_scores[(int64_t(b) * Hq + hq0 + g) * M + j0 + jj] = kNegInf;
  }
  for (int g = threadIdx.x; g < G; g += blockDim.x) {
    float* o = chunk_lse + ((int64_t(b) * Hq + hq0 + g) * n_chunks + chunk) * 2;
    o[0] = kNegInf;
    o[1] = 0.0f;
  }
}

}  // namespace
}  // namespace locks::cuda::detail

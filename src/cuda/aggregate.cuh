// Device pieces of the GQA share-averaging (score.h), shared by the aggregation kernels and
// the fused aggregation + selection (select.cu), so that both produce the same bits.
#pragma once

#include "common.cuh"

namespace locks::cuda::detail {

// One head's LSE from its chunk partials is reduced by 128 threads (4 warps): thread tt
// merges chunks tt, tt + 128, ... in order, then a butterfly inside each warp; the 4 warp
// results (lane 0 of each) are merged in warp order by lse_finish. Every path uses this
// order, so LSE_h has one value whichever kernel computes it.
constexpr int kLseThreads = 128;

__device__ __forceinline__ void lse_warp_partial(const float* __restrict__ cl, int n_used, int tt,
                                                 float& m, float& l) {
  m = kNegInf, l = 0.0f;
  const float2* p = reinterpret_cast<const float2*>(cl);  // (max, sum) pairs, 8-byte aligned
  for (int c = tt; c < n_used; c += kLseThreads) {
    const float2 v = p[c];
    lse_merge(m, l, v.x, v.y);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    lse_merge(m, l, m2, l2);
  }
}

// The 4 warp partials (m[w], l[w]) of one head -> LSE_h.
__device__ __forceinline__ float lse_finish(const float* wm, const float* wl) {
  float m = wm[0], l = wl[0];
#pragma unroll
  for (int w = 1; w < kLseThreads / 32; ++w) lse_merge(m, l, wm[w], wl[w]);
  return (m == kNegInf) ? kNegInf : m + logf(l);
}

// a_j = log((1/G) sum_h exp(s_hj - LSE_h)) for N pages of one group: page i's head-0 score
// at s + i * step (pages with i * step >= valid_n are skipped, out = -inf), heads `stride`
// apart; lse: the G heads' LSE. -inf scores and heads are skipped. Each page gets the same
// operations in the same order whatever N, so every caller produces the same bits.
template <int N>
__device__ __forceinline__ void group_page_scores(const float* __restrict__ s, int64_t stride,
                                                  int step, int valid_n, const float* lse, int G,
                                                  float (&out)[N]) {
  float m[N], sum[N];
#pragma unroll
  for (int i = 0; i < N; ++i) m[i] = kNegInf, sum[i] = 0.0f;
  for (int g = 0; g < G; ++g) {
    const float lg = lse[g];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i * step >= valid_n) continue;
      const float x = s[g * stride + i * step];
      if (lg == kNegInf || x == kNegInf) continue;
      m[i] = fmaxf(m[i], x - lg);
    }
  }
  for (int g = 0; g < G; ++g) {
    const float lg = lse[g];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      if (i * step >= valid_n || m[i] == kNegInf) continue;
      const float x = s[g * stride + i * step];
      if (lg == kNegInf || x == kNegInf) continue;
      sum[i] += expf(x - lg - m[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i)
    out[i] =
        (i * step >= valid_n || m[i] == kNegInf) ? kNegInf : m[i] + logf(sum[i]) - logf(float(G));
}

}  // namespace locks::cuda::detail

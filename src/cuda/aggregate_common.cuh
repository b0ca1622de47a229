// Device pieces of the GQA share-averaging (score.h) shared by the aggregation kernels
// (aggregate.cu) and the one-launch aggregation + selection (select_cluster.cu), so that
// every path produces the same bits: a head's LSE from the scoring kernel's chunk partials
// in one fixed order, and one page's group score.
#pragma once

#include "common.cuh"

namespace locks::cuda::detail {
namespace {

// A head's log-sum-exp from its chunk partials cl [n_used][2] (max, sum), reduced by the 128
// threads t = 0..127 of one group of four warps: thread t merges chunks t, t + 128, ... in
// order, each warp by the butterfly, then thread 0 merges warps 1..3 into its own. part_m /
// part_l: 4 floats of shared memory per group. Returns the LSE in thread 0 (t == 0) only;
// the caller's barrier must separate the warps' writes from thread 0's reads (two calls:
// see head_lse_128).
__device__ __forceinline__ void head_lse_partial(const float* cl, int n_used, int t, float* part_m,
                                                 float* part_l) {
  float m = kNegInf, l = 0.0f;
  for (int c = t; c < n_used; c += 128) lse_merge(m, l, cl[2 * c], cl[2 * c + 1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    lse_merge(m, l, m2, l2);
  }
  if ((t & 31) == 0) part_m[t >> 5] = m, part_l[t >> 5] = l;
}
__device__ __forceinline__ float head_lse_final(const float* part_m, const float* part_l) {
  float m = part_m[0], l = part_l[0];
  for (int w = 1; w < 4; ++w) lse_merge(m, l, part_m[w], part_l[w]);
  return (m == kNegInf) ? kNegInf : m + logf(l);
}

// One page's group score a = log((1/G) sum_g exp(s_g - lse_g)) from its G head scores
// s[g * stride]; heads or scores at -inf are skipped, -inf when all are.
__device__ __forceinline__ float group_score(const float* s, int64_t stride, const float* lse,
                                             int G) {
  float m = kNegInf;
  for (int g = 0; g < G; ++g) {
    const float x = s[int64_t(g) * stride];
    if (lse[g] == kNegInf || x == kNegInf) continue;
    m = fmaxf(m, x - lse[g]);
  }
  if (m == kNegInf) return kNegInf;
  float sum = 0.0f;
  for (int g = 0; g < G; ++g) {
    const float x = s[int64_t(g) * stride];
    if (lse[g] == kNegInf || x == kNegInf) continue;
    sum += expf(x - lse[g] - m);
  }
  return m + logf(sum) - logf(float(G));
}

// group_score in two steps: a page's G <= kG head scores loaded first (all loads in flight at
// once: the fused kernel runs few blocks, so each thread's memory parallelism sets its time),
// then the same arithmetic in the same order, so the same bits.
template <int kG>
__device__ __forceinline__ void load_head_scores(const float* s, int64_t stride, int G,
                                                 float (&x)[kG]) {
#pragma unroll
  for (int g = 0; g < kG; ++g) x[g] = g < G ? s[int64_t(g) * stride] : kNegInf;
}
template <int kG>
__device__ __forceinline__ float group_score_of(const float (&x)[kG], const float* lse, int G) {
  float m = kNegInf;
#pragma unroll
  for (int g = 0; g < kG; ++g)
    if (g < G && lse[g] != kNegInf && x[g] != kNegInf) m = fmaxf(m, x[g] - lse[g]);
  if (m == kNegInf) return kNegInf;
  float sum = 0.0f;
#pragma unroll
  for (int g = 0; g < kG; ++g)
    if (g < G && lse[g] != kNegInf && x[g] != kNegInf) sum += expf(x[g] - lse[g] - m);
  return m + logf(sum) - logf(float(G));
}
template <int kG>
__device__ __forceinline__ float group_score_batched(const float* s, int64_t stride,
                                                     const float* lse, int G) {
  float x[kG];
  load_head_scores<kG>(s, stride, G, x);
  return group_score_of<kG>(x, lse, G);
}

}  // namespace
}  // namespace locks::cuda::detail

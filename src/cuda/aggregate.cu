// GQA share-averaging on the GPU (score.h): a_j = log((1/G) sum_h exp(s_hj - LSE_h)).
// LSE_h comes from the scoring kernel's per-chunk partials (one per score chunk of 32-128
// pages, chosen at plan time), so each block reads only its own tile of pages plus
// G x n_chunks partials. With few chunks in use every aggregation block reduces its G heads'
// partials itself (in lse_kernel's order, so the same bits) and the separate LSE launch is
// skipped: up to 32 chunks always (e.g. 4096 pages with 128-page score chunks), up to 64
// when the aggregation grid is under one wave (batch 1 at 128K: the saved launch is on the
// critical path, the extra partial reads are not); with more, lse_kernel runs once per head
// first (v7: every block re-reducing all 512 chunks at 1M cost more L2 traffic than the
// launch).
#include "aggregate_common.cuh"
#include "common.cuh"
#include "kernels.cuh"
#include "locks/cuda/limits.h"
#include "locks/rules.h"

namespace locks::cuda::detail {
namespace {

constexpr int kThreads = 128;
// Pages a thread, chosen per launch (v15b): 4 when one page a thread would make a grid of
// many waves (1M batch 8: 32768 blocks of 2 KB, bound by block turnover rather than bytes),
// 1 on small grids, where fewer, longer blocks only add latency (v15 with 4 everywhere: GLM
// 1M batch 1 aggregation 12.4 -> 19.3 us, 256 blocks for 2 KV heads x G 16).
constexpr int kManyBlocks = 8192;  // one-page-a-thread blocks above which 4 pages a thread pay

// LSE_h of every (sequence, query head) from the scoring kernel's per-chunk partials: one
// block per row, so the aggregation blocks read G values instead of G x n_chunks partials.
__global__ void __launch_bounds__(kThreads)
    lse_kernel(const float* __restrict__ chunk_lse, int n_chunks, int n_used,
               float* __restrict__ head_lse) {
  static_assert(kThreads == 128, "one head a block: head_lse_partial's group of four warps");
  __shared__ float sm[4], sl[4];
  const int hq = blockIdx.x, b = blockIdx.y, Hq = gridDim.x;
  const float* cl = chunk_lse + (int64_t(b) * Hq + hq) * n_chunks * 2;
  head_lse_partial(cl, n_used, threadIdx.x, sm, sl);
  __syncthreads();
  if (threadIdx.x == 0) head_lse[int64_t(b) * Hq + hq] = head_lse_final(sm, sl);
}

constexpr int kFusedMaxChunks = 64;  // up to two chunk partials a lane (v15; was 32)
constexpr int kFusedAlwaysChunks = 32;
constexpr int64_t kFusedSmallGrid = 2048;  // blocks (about one wave of 128-thread blocks)

// Head LSE of chunk partials [0, n_used), n_used <= 64, by one warp: chunks lane and
// lane + 32 each reduced by the butterfly, then the two halves merged, i.e. lse_kernel's
// order (its warps 0 and 1, then thread 0 merging the warp results), so the same bits.
__device__ __forceinline__ void warp_head_lse(const float* cl, int n_used, int lane, float& m,
                                              float& l) {
  m = kNegInf, l = 0.0f;
  if (lane < n_used) lse_merge(m, l, cl[2 * lane], cl[2 * lane + 1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), l2 = __shfl_xor_sync(0xffffffffu, l, o);
    lse_merge(m, l, m2, l2);
  }
  if (n_used > 32) {  // warp-uniform
    float m1 = kNegInf, l1 = 0.0f;
    if (lane + 32 < n_used) lse_merge(m1, l1, cl[2 * lane + 64], cl[2 * lane + 65]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m1, o),
                  l2 = __shfl_xor_sync(0xffffffffu, l1, o);
      lse_merge(m1, l1, m2, l2);
    }
    lse_merge(m, l, m1, l1);
  }
}

// fused: head_lse is written here (by the tile-0 blocks) from chunk_lse [.., n_used <= 64]
// instead of being read.
template <bool kFused, int kPagesPerThread>
__global__ void __launch_bounds__(kThreads)
    aggregate_kernel(const float* __restrict__ hs, float* __restrict__ head_lse,
                     const float* __restrict__ chunk_lse, int n_chunks, int n_used, int M, int Hq,
                     int Hkv, const int32_t* __restrict__ seq_lens, float* __restrict__ gs) {
  __shared__ float lse[kMaxGroup];
  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int G = Hq / Hkv;
  // Pages from the row's full pages on have -inf head scores (score_pages writes them so; the
  // step's scorer leaves them unwritten, score_select): their group score is -inf without
  // reading them (the same bits; rows shorter than the plan's M).
  const int jn = rules::trusted_full_pages(seq_lens[b], M, limits::kPageSize);
  if constexpr (kFused) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int g = warp; g < G; g += kThreads / 32) {
      const int64_t hrow = int64_t(b) * Hq + h * G + g;
      float m, l;
      warp_head_lse(chunk_lse + hrow * n_chunks * 2, n_used, lane, m, l);
      if (lane == 0) {
        const float v = (m == kNegInf) ? kNegInf : m + logf(l);
        lse[g] = v;
        if (tile == 0) head_lse[hrow] = v;
      }
    }
  } else {
    if (threadIdx.x < G) lse[threadIdx.x] = head_lse[int64_t(b) * Hq + h * G + threadIdx.x];
  }
  __syncthreads();
  if constexpr (kPagesPerThread == 1) {
    // Small grids (batch 1): v14's loop, early exit and branches (the select form of the
    // 4-page path measured 2-3 us slower here at GLM 1M batch 1); the same bits.
    const int j = tile * kThreads + threadIdx.x;
    if (j >= M) return;
    const float out =
        j < jn ? group_score(hs + (int64_t(b) * Hq + h * G) * M + j, M, lse, G) : kNegInf;
    gs[(int64_t(b) * Hkv + h) * M + j] = out;
    return;
  }
  // kPagesPerThread pages a thread, kThreads apart (coalesced), their loads interleaved per
  // head; each page's arithmetic is the one-page-a-thread version's, in the same order.
  const int j0 = tile * kThreads * kPagesPerThread + threadIdx.x;
  const float* s = hs + (int64_t(b) * Hq + h * G) * M + j0;
  float m[kPagesPerThread];
#pragma unroll
  for (int p = 0; p < kPagesPerThread; ++p) m[p] = kNegInf;
  for (int g = 0; g < G; ++g) {
    const float lg = lse[g];
#pragma unroll
    for (int p = 0; p < kPagesPerThread; ++p) {
      const float x = j0 + p * kThreads < jn ? s[int64_t(g) * M + p * kThreads] : kNegInf;
      if (lg != kNegInf && x != kNegInf) m[p] = fmaxf(m[p], x - lg);
    }
  }
  float sum[kPagesPerThread];
#pragma unroll
  for (int p = 0; p < kPagesPerThread; ++p) sum[p] = 0.0f;
  for (int g = 0; g < G; ++g) {
    const float lg = lse[g];
#pragma unroll
    for (int p = 0; p < kPagesPerThread; ++p) {
      // Selects, not branches, so the loads issue together; adding the exact 0 of a skipped
      // head leaves the sum's bits as they were. (m[p] = -inf: every head skipped.)
      const float x = j0 + p * kThreads < jn ? s[int64_t(g) * M + p * kThreads] : kNegInf;
      const bool take = m[p] != kNegInf && lg != kNegInf && x != kNegInf;
      const float e = expf(x - lg - m[p]);
      sum[p] += take ? e : 0.0f;
    }
  }
  float* o = gs + (int64_t(b) * Hkv + h) * M + j0;
#pragma unroll
  for (int p = 0; p < kPagesPerThread; ++p)
    if (j0 + p * kThreads < M)
      o[p * kThreads] = m[p] == kNegInf ? kNegInf : m[p] + logf(sum[p]) - logf(float(G));
}

template <int kPPT>
void launch_aggregate_t(const float* head_scores, const float* chunk_lse, int n_chunks, int used,
                        int M, int batch_size, int Hq, int Hkv, const int32_t* seq_lens,
                        float* head_lse, float* group_scores, cudaStream_t st) {
  const dim3 grid(unsigned(ceil_div(M, kThreads * kPPT)), unsigned(Hkv), unsigned(batch_size));
  const int64_t blocks = int64_t(grid.x) * grid.y * grid.z;
  if (used <= kFusedAlwaysChunks || (used <= kFusedMaxChunks && blocks <= kFusedSmallGrid)) {
    launch_kernel(aggregate_kernel<true, kPPT>, grid, dim3(kThreads), 0, st, head_scores, head_lse,
                  chunk_lse, n_chunks, used, M, Hq, Hkv, seq_lens, group_scores);
    return;
  }
  launch_kernel(lse_kernel, dim3(unsigned(Hq), unsigned(batch_size)), dim3(kThreads), 0, st,
                chunk_lse, n_chunks, used, head_lse);
  launch_kernel(aggregate_kernel<false, kPPT>, grid, dim3(kThreads), 0, st, head_scores, head_lse,
                chunk_lse, n_chunks, used, M, Hq, Hkv, seq_lens, group_scores);
}

}  // namespace

void launch_aggregate(const float* head_scores, const float* chunk_lse, int n_chunks,
                      int chunk_pages, const BatchView& batch, int Hq, int Hkv, float* head_lse,
                      float* group_scores, cudaStream_t st) {
  const int M = batch.max_blocks_per_seq;
  const int used = ceil_div(M, chunk_pages);  // score chunk partials in use
  const int64_t one_page_blocks = int64_t(ceil_div(M, kThreads)) * Hkv * batch.batch_size;
  if (one_page_blocks > kManyBlocks)
    launch_aggregate_t<4>(head_scores, chunk_lse, n_chunks, used, M, batch.batch_size, Hq, Hkv,
                          batch.seq_lens, head_lse, group_scores, st);
  else
    launch_aggregate_t<1>(head_scores, chunk_lse, n_chunks, used, M, batch.batch_size, Hq, Hkv,
                          batch.seq_lens, head_lse, group_scores, st);
}

}  // namespace locks::cuda::detail

// A top-m split over keys spread across the blocks of a thread-block cluster, shared by the
// one-launch page selection (select_cluster.cu) and the two-level group choice (super.cu):
// radix_threshold's T and need_eq for the whole row, from one 256-bin histogram per block per
// digit pass added into every block's sum of that pass (red.async, cluster_push.cuh), and the
// candidate counts of the lower-ranked blocks (each block's count pushed to every block), which
// offset a block's stable compaction. Every block takes the same passes (the summed counts are
// the same everywhere), so the caller's branches stay cluster-uniform.
#pragma once

#include <cooperative_groups.h>

#include "cluster_push.cuh"
#include "kernels.cuh"
#include "select_common.cuh"

namespace locks::cuda::detail {
namespace {

// Receive buffers (each used once a launch) and their transaction barriers.
struct ClusterRadix {
  uint64_t bar[6];                       // the four passes' summed counts, the counts, the range
  uint32_t hist[256];                    // this block's digit counts of the current pass
  uint32_t sum[4][256];                  // the cluster's, a buffer a pass, summed by the pushes
  uint32_t packed[kMaxSelectCluster];    // every block's (> T) | (== T) << 16 candidates
  uint32_t range[2][kMaxSelectCluster];  // every block's smallest and largest valid key
};
constexpr int kRadixCountsBar = 4, kRadixRangeBar = 5;

// Before the cluster's start barrier (after which peers may push): the barriers initialised
// (the caller adds push_barrier_fence_init and a block barrier) and the sums cleared.
__device__ __forceinline__ void cluster_radix_init(ClusterRadix& cr) {
  if (threadIdx.x == 0)
    for (int i = 0; i < int(sizeof(cr.bar) / sizeof(cr.bar[0])); ++i) push_barrier_init(&cr.bar[i]);
  for (int i = threadIdx.x; i < 4 * 256; i += kThreads) cr.sum[i / 256][i % 256] = 0;
}

// T and need_eq of the m largest of the row's valid keys (1 <= m < their count), this block's
// keys being key_of(0 .. n - 1); Threshold::bound (the passes stop once the current bin is
// taken whole). solo: a cluster of one block (no pushes).
template <typename KeyFn>
__device__ void cluster_radix_threshold(const cooperative_groups::cluster_group& cluster, bool solo,
                                        KeyFn key_of, int n, int m, SelectSmem& sm,
                                        ClusterRadix& cr, uint32_t& T, int& need_eq) {
  const int n_ranks = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  // The row's key range (radix_start): each block's, pushed to every block (one exchange,
  // against the one or two passes it saves on rows whose keys share their top digits).
  if (threadIdx.x == 0 && !solo) push_expect(&cr.bar[kRadixRangeBar], uint32_t(n_ranks) * 8u);
  uint32_t lo, hi;
  block_key_range(key_of, n, sm, lo, hi);
  if (!solo) {
    if (int(threadIdx.x) < 2 * n_ranks) {  // thread i pushes the low (i even) or high end to i / 2
      const int q = int(threadIdx.x) / 2, end = int(threadIdx.x) & 1;
      push_store(peer(cluster, &cr.range[end][rank], q), end ? hi : lo,
                 peer(cluster, &cr.bar[kRadixRangeBar], q));
    }
    push_wait(&cr.bar[kRadixRangeBar], 0);
    lo = 0xffffffffu, hi = 0u;
    for (int q = 0; q < n_ranks; ++q) lo = min(lo, cr.range[0][q]), hi = max(hi, cr.range[1][q]);
  }
  if (lo == hi) {  // every valid key of the row equal: the first m of them in index order
    T = lo;
    need_eq = m;
    return;
  }
  const RadixStart st = radix_start(lo, hi);
  uint32_t prefix = st.prefix, mask = st.mask;
  int remaining = m;
  for (int pass = 0, shift = st.shift;; ++pass, shift = radix_next_shift(shift)) {
    for (int i = threadIdx.x; i < 256; i += kThreads) cr.hist[i] = 0;
    if (threadIdx.x == 0 && !solo) push_expect(&cr.bar[pass], uint32_t(n_ranks) * 256u * 4u);
    __syncthreads();
    count_digits(key_of, n, prefix, mask, shift, cr.hist);
    __syncthreads();
    // Thread t pushes bin t % 256 to the blocks t / 256, t / 256 + 2, ...
    if (!solo) {
      const int bin = int(threadIdx.x) % 256;
      const uint32_t c = cr.hist[bin];
      for (int q = int(threadIdx.x) / 256; q < n_ranks; q += kThreads / 256)
        push_add(peer(cluster, &cr.sum[pass][bin], q), c, peer(cluster, &cr.bar[pass], q));
      push_wait(&cr.bar[pass], 0);
    }
    find_digit(solo ? cr.hist : cr.sum[pass], remaining, sm);
    __syncthreads();
    prefix |= sm.digit << shift;
    mask |= 255u << shift;
    remaining = sm.remaining;
    const bool stop = sm.whole;  // the same sums in every block: cluster-uniform
    __syncthreads();
    if (stop || shift == 0) break;
  }
  T = prefix;
  need_eq = remaining;
}

// Pushes this block's packed count (agg: (> T) | (== T) << 16, each below 2^16) to every
// block and returns in gt0 / eq0 the sums of the lower-ranked blocks'. The caller has passed
// the cluster's start barrier; every thread waits for the counts.
__device__ __forceinline__ void cluster_lower_counts(
    const cooperative_groups::cluster_group& cluster, bool solo, uint32_t agg, ClusterRadix& cr,
    uint32_t& gt0, uint32_t& eq0) {
  gt0 = eq0 = 0;
  if (solo) return;
  const int rank = int(cluster.block_rank()), n_ranks = int(cluster.num_blocks());
  if (threadIdx.x == 0) push_expect(&cr.bar[kRadixCountsBar], uint32_t(n_ranks) * 4u);
  if (int(threadIdx.x) < n_ranks)  // thread q pushes this block's count to block q
    push_store(peer(cluster, &cr.packed[rank], int(threadIdx.x)), agg,
               peer(cluster, &cr.bar[kRadixCountsBar], int(threadIdx.x)));
  push_wait(&cr.bar[kRadixCountsBar], 0);
  for (int q = 0; q < rank; ++q) {
    gt0 += cr.packed[q] & 0xffffu;
    eq0 += cr.packed[q] >> 16;
  }
}

}  // namespace
}  // namespace locks::cuda::detail

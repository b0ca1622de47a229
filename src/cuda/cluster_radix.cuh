// A top-m split over keys spread across the blocks of a thread-block cluster, shared by the
// one-launch page selection (select_cluster.cu) and the two-level group choice (super.cu):
// radix_threshold's T and need_eq for the whole row, from one 256-bin histogram per block per
// digit pass added into every block's sum of that pass (red.async, cluster_push.cuh), and the
// candidate counts of the lower-ranked blocks (each block's count pushed to every block),
// which offset a block's stable compaction. Every block takes the same passes (the summed
// counts are the same everywhere), so the caller's branches stay cluster-uniform.
//
// The gather (ClusterRadixGather; v36 in docs/cuda_notes.md): the first pass pushes every
// block's 256 counts whole (two 16-bit bins a word) into a slot of every block, which sums
// them; when the bin it settles on holds at most kGatherCap keys, every block's keys of that
// bin are pushed to every block (at offsets the slots give), the later passes run on them
// inside each block with no more exchanges, and the slots and keys also give the offsets (no
// count exchange). It pays on rows of 16 blocks of 4096 keys (1M tokens: -3 to -4 us a
// selection on an H100) and loses on smaller clusters (+0.4 us at 8 blocks of 1024 keys, +2.5
// us on the step around it; the group choice +1 us), so only the selection over the separate
// aggregation's group scores takes it.
#pragma once

#include <cooperative_groups.h>

#include <type_traits>

#include "cluster_push.cuh"
#include "kernels.cuh"
#include "select_common.cuh"

namespace locks::cuda::detail {
namespace {

// Most keys the first pass's bin may hold for the gather (kGatherCap x 4 bytes a block).
constexpr int kGatherCap = 256;
// A block's count in one bin fits the gather's 16-bit slots.
static_assert(kSelectChunk < 65536, "a block's keys must fit 16-bit counts");

// Receive buffers (each used once a launch) and their transaction barriers.
struct ClusterRadix {
  uint64_t bar[6];                       // the four passes' summed counts, the counts, the range
  uint32_t hist[256];                    // this block's digit counts of the current pass
  uint32_t sum[4][256];                  // the cluster's, a buffer a pass, summed by the pushes
  uint32_t packed[kMaxSelectCluster];    // every block's (> T) | (== T) << 16 candidates
  uint32_t range[2][kMaxSelectCluster];  // every block's smallest and largest valid key
};
constexpr int kRadixCountsBar = 4, kRadixRangeBar = 5;

// With the gather's buffers (sum[0] then holds the sums of the first pass's slots).
struct ClusterRadixGather : ClusterRadix {
  uint64_t gather_bar;
  uint32_t first[kMaxSelectCluster][128];  // pass 0: every block's counts, bins 2w | 2w + 1 << 16
  uint32_t cand[kGatherCap];               // the first pass's bin's keys, block q's after q - 1's
  uint32_t n_own, gt0, eq0;                // this block's keys placed; the offsets
};

// The split of the row (radix_threshold's T and need_eq); offsets: gt0 / eq0 hold the
// lower-ranked blocks' valid keys > T and == T (from the gather), so the caller needs no
// cluster_lower_counts.
struct ClusterSplit {
  uint32_t T = 0;
  int need_eq = 0;
  bool offsets = false;
  uint32_t gt0 = 0, eq0 = 0;
};

// Block q's count in bin i of the first pass.
__device__ __forceinline__ uint32_t first_count(const ClusterRadixGather& cr, int q, int i) {
  return (cr.first[q][i >> 1] >> (16 * (i & 1))) & 0xffffu;
}

// Before the cluster's start barrier (after which peers may push): the barriers initialised
// (the caller adds push_barrier_fence_init and a block barrier) and the sums cleared.
template <typename Radix>
__device__ __forceinline__ void cluster_radix_init(Radix& cr) {
  if (threadIdx.x == 0) {
    for (int i = 0; i < int(sizeof(cr.bar) / sizeof(cr.bar[0])); ++i) push_barrier_init(&cr.bar[i]);
    if constexpr (std::is_same_v<Radix, ClusterRadixGather>) push_barrier_init(&cr.gather_bar);
  }
  for (int i = threadIdx.x; i < 4 * 256; i += kThreads) cr.sum[i / 256][i % 256] = 0;
}

// The gather after the first pass (at shift, its digit in prefix / mask, in_bin keys in that
// bin, remaining of them to take): every block's keys of the bin pushed to every block, the
// later passes over them inside the block, then the lower-ranked blocks' counts above and at T.
template <typename KeyFn>
__device__ void gather_and_finish(const cooperative_groups::cluster_group& cluster, KeyFn key_of,
                                  int n, uint32_t digit, int shift, uint32_t in_bin, bool stop,
                                  uint32_t& prefix, uint32_t& mask, int& remaining, SelectSmem& sm,
                                  ClusterRadixGather& cr, ClusterSplit& out) {
  const int n_ranks = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  const int tid = int(threadIdx.x);
  // This block's keys of the bin go to [off, off + own) of every block's cand, after the
  // lower-ranked blocks' (their order inside a block's range is free: only counts are taken
  // from them, so the result does not depend on it).
  uint32_t off = 0;
  for (int q = 0; q < rank; ++q) off += first_count(cr, q, int(digit));
  const uint32_t own = first_count(cr, rank, int(digit));
  if (tid == 0) {
    push_expect(&cr.gather_bar, (in_bin - own) * 4u);
    cr.n_own = 0;
  }
  __syncthreads();
  for (int e = tid; e < n; e += kThreads) {
    bool valid;
    const uint32_t k = key_of(e, valid);
    if (valid && (k & mask) == prefix) cr.cand[off + atomicAdd(&cr.n_own, 1u)] = k;
  }
  __syncthreads();
  for (int i = tid; i < int(own) * (n_ranks - 1); i += kThreads) {
    const int j = i % int(own), q0 = i / int(own), q = q0 + (q0 >= rank);
    push_store(peer(cluster, &cr.cand[off + j], q), cr.cand[off + j],
               peer(cluster, &cr.gather_bar, q));
  }
  push_wait(&cr.gather_bar, 0);
  // The later passes over the gathered keys, inside the block (the same keys everywhere).
  auto cand_of = [&](int e, bool& valid) {
    valid = true;
    return cr.cand[e];
  };
  for (int s = shift; !stop;) {
    s = radix_next_shift(s);
    block_radix_pass(cand_of, int(in_bin), cr.hist, sm, prefix, mask, s, remaining, stop);
    stop = stop || s == 0;
  }
  // The offsets: the lower-ranked blocks' keys in the first pass's bins above the digit and
  // their gathered keys above T count as > T; their gathered keys equal to T as == T.
  const uint32_t T = prefix;
  if (tid == 0) cr.gt0 = cr.eq0 = 0;
  __syncthreads();
  uint32_t gt = 0, eq = 0;
  for (int i = int(digit) + 1 + tid; i < 256; i += kThreads)
    for (int q = 0; q < rank; ++q) gt += first_count(cr, q, i);
  for (int p = tid; p < int(off); p += kThreads) {
    const uint32_t k = cr.cand[p];
    gt += k > T;
    eq += k == T;
  }
  gt = __reduce_add_sync(0xffffffffu, gt);
  eq = __reduce_add_sync(0xffffffffu, eq);
  if ((tid & 31) == 0 && (gt | eq)) atomicAdd(&cr.gt0, gt), atomicAdd(&cr.eq0, eq);
  __syncthreads();
  out.offsets = true;
  out.gt0 = cr.gt0;
  out.eq0 = cr.eq0;
}

// T and need_eq of the m largest of the row's valid keys (1 <= m < their count), this block's
// keys being key_of(0 .. n - 1), n < 65536; Threshold::bound (the passes stop once the
// current bin is taken whole). solo: a cluster of one block (no pushes). Radix:
// ClusterRadixGather for the gather (taken also when the first pass already settles T, for
// the offsets, in place of cluster_lower_counts: one exchange either way), else ClusterRadix.
template <typename Radix, typename KeyFn>
__device__ ClusterSplit cluster_radix_threshold(const cooperative_groups::cluster_group& cluster,
                                                bool solo, KeyFn key_of, int n, int m,
                                                SelectSmem& sm, Radix& cr) {
  constexpr bool kGather = std::is_same_v<Radix, ClusterRadixGather>;
  const int n_ranks = int(cluster.num_blocks()), rank = int(cluster.block_rank());
  ClusterSplit out;
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
    out.T = lo;
    out.need_eq = m;
    return out;
  }
  const RadixStart st = radix_start(lo, hi);
  uint32_t prefix = st.prefix, mask = st.mask;
  int remaining = m;
  for (int pass = 0, shift = st.shift;; ++pass, shift = radix_next_shift(shift)) {
    const bool slots = kGather && !solo && pass == 0;  // the gather's first pass
    for (int i = threadIdx.x; i < 256; i += kThreads) cr.hist[i] = 0;
    if (threadIdx.x == 0 && !solo)
      push_expect(&cr.bar[pass], uint32_t(n_ranks) * (slots ? 128u : 256u) * 4u);
    __syncthreads();
    count_digits(key_of, n, prefix, mask, shift, cr.hist);
    __syncthreads();
    const uint32_t* counts = solo ? cr.hist : cr.sum[pass];
    if constexpr (kGather) {
      if (slots) {
        // Thread t pushes word t % 128 (bins 2w, 2w + 1) to the blocks t / 128, t / 128 + 4,
        // ...; each block sums the slots itself.
        const int w = int(threadIdx.x) % 128;
        const uint32_t v = cr.hist[2 * w] | (cr.hist[2 * w + 1] << 16);
        for (int q = int(threadIdx.x) / 128; q < n_ranks; q += kThreads / 128)
          push_store(peer(cluster, &cr.first[rank][w], q), v, peer(cluster, &cr.bar[0], q));
        push_wait(&cr.bar[0], 0);
        for (int i = threadIdx.x; i < 256; i += kThreads) {
          uint32_t s = 0;
          for (int q = 0; q < n_ranks; ++q) s += first_count(cr, q, i);
          cr.sum[0][i] = s;
        }
        __syncthreads();
      }
    }
    // Thread t pushes bin t % 256 to the blocks t / 256, t / 256 + 2, ...
    if (!solo && !slots) {
      const int bin = int(threadIdx.x) % 256;
      const uint32_t c = cr.hist[bin];
      for (int q = int(threadIdx.x) / 256; q < n_ranks; q += kThreads / 256)
        push_add(peer(cluster, &cr.sum[pass][bin], q), c, peer(cluster, &cr.bar[pass], q));
      push_wait(&cr.bar[pass], 0);
    }
    find_digit(counts, remaining, sm);
    __syncthreads();
    const uint32_t digit = sm.digit;
    prefix |= digit << shift;
    mask |= 255u << shift;
    remaining = sm.remaining;
    const bool stop = sm.whole || shift == 0;  // the same sums in every block: cluster-uniform
    const uint32_t in_bin = counts[digit];
    __syncthreads();
    if constexpr (kGather) {
      if (slots && in_bin <= uint32_t(kGatherCap)) {
        gather_and_finish(cluster, key_of, n, digit, shift, in_bin, stop, prefix, mask, remaining,
                          sm, cr, out);
        break;
      }
    }
    if (stop) break;
  }
  out.T = prefix;
  out.need_eq = remaining;
  return out;
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

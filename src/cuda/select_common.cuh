// Block-level pieces of the GPU page selection shared by the two-stage kernels (select.cu)
// and the one-launch cluster kernel (select_cluster.cu): the budget rules of a sequence,
// order-preserving keys, the radix digit search, stable compaction and the list writer.
#pragma once

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "locks/rules.h"
#include "locks/select.h"

namespace locks::cuda::detail {
namespace {

constexpr int kThreads = 512;
using Scan = cub::BlockScan<uint32_t, kThreads>;
using Reduce = cub::BlockReduce<float, kThreads>;

struct Rules {  // the budget rules for one sequence
  int full, n_pages, has_tail, sink_end, recent_start, slots;
  bool all;
};

// An untrusted length outside [1, M P] (the block-table row) counts as 0: no page, count 0
// (the attention then writes the row as NaN; docs/bad_input.md).
__device__ Rules rules_for(int raw_len, int P, int M, const SelectConfig& cfg) {
  const int len = rules::trusted_len(raw_len, M, P);
  Rules r;
  r.full = rules::full_pages(len, P);
  r.n_pages = rules::num_pages(len, P);
  r.has_tail = r.full < r.n_pages;
  r.all = rules::selects_all(cfg.budget_tokens, len, cfg.dense_below);
  r.sink_end = min(cfg.sink_pages, r.full);
  r.recent_start = max(max(r.full - cfg.recent_pages, 0), r.sink_end);
  const int k = int(rules::budget_pages(cfg.budget_tokens, P));
  r.slots = k - r.has_tail - r.sink_end - (r.full - r.recent_start);
  return r;
}

struct SelectSmem {
  Scan::TempStorage scan;
  Reduce::TempStorage reduce;
  float bcast;
  uint32_t hist[256];
  uint32_t digit;
  int remaining;
  int whole;  // the digit's bin is taken whole (its count == remaining): no lower digit matters
  uint32_t carry_gt, carry_eq;
  uint32_t range_lo, range_hi;  // the valid keys' range (radix_threshold)
};

// Warp 0: the digit of hist (256 bins, counts of the current pass) where the count from the
// top reaches `remaining`, what remains of it inside that digit, and whether that is the
// whole bin (to sm.digit / sm.remaining / sm.whole; the caller syncs).
__device__ __forceinline__ void find_digit(const uint32_t* hist, int remaining, SelectSmem& sm) {
  if (threadIdx.x < 32) {          // warp 0: find the digit where the count from the top reaches
    const int lane = threadIdx.x;  // `remaining`; lane l owns digits 255-8l .. 248-8l
    uint32_t c[8], tot = 0;
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      c[x] = hist[255 - 8 * lane - x];
      tot += c[x];
    }
    uint32_t incl = tot;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const uint32_t excl = incl - tot;
    const bool here = excl < uint32_t(remaining) && incl >= uint32_t(remaining);
    if (here) {
      uint32_t acc = excl;
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        if (acc + c[x] >= uint32_t(remaining)) {
          sm.digit = uint32_t(255 - 8 * lane - x);
          sm.remaining = remaining - int(acc);
          sm.whole = c[x] == uint32_t(remaining) - acc;
          break;
        }
        acc += c[x];
      }
    }
  }
}

// One radix pass's counts: adds to hist[256] the digit at `shift` of every valid key whose
// higher digits equal `prefix` (under `mask`). Scores crowd into few bins, so equal bins are
// aggregated across the warp first (one shared atomic each).
template <typename KeyFn>
__device__ __forceinline__ void count_digits(KeyFn key_of, int n, uint32_t prefix, uint32_t mask,
                                             int shift, uint32_t* hist) {
  for (int e = threadIdx.x; e < n; e += kThreads) {
    bool valid;
    const uint32_t k = key_of(e, valid);
    const uint32_t bin = (valid && (k & mask) == prefix) ? (k >> shift) & 255u : 256u;
    const unsigned peers = __match_any_sync(__activemask(), bin);
    if (bin < 256u && (threadIdx.x & 31) == __ffs(peers) - 1)
      atomicAdd(&hist[bin], unsigned(__popc(peers)));
  }
}

// What radix_threshold's T must be. `bound`: any T that splits the top m as "keys > T, then
// need_eq keys == T in index order" — the passes stop as soon as the bin of the current digit
// is taken whole (T = its prefix, lower digits 0; every key of the bin is > T or == T, and all
// need_eq = bin-count of them are taken), which on continuous scores saves the last one or
// two of the four passes and selects the same set. `key`: T is the m-th largest key itself
// (callers that read its value, e.g. the adaptive budget's mass of the top m).
enum class Threshold { bound, key };

// This thread's smallest and largest valid key (UINT32_MAX / 0 when it has none): the
// range of the row, reduced by the caller, that sets the radix passes' first digit.
template <typename KeyFn>
__device__ __forceinline__ void thread_key_range(KeyFn key_of, int n, uint32_t& lo, uint32_t& hi) {
  lo = 0xffffffffu;
  hi = 0u;
  for (int e = threadIdx.x; e < n; e += kThreads) {
    bool valid;
    const uint32_t k = key_of(e, valid);
    if (valid) lo = min(lo, k), hi = max(hi, k);
  }
}

// The radix passes' start from the range [lo, hi] of the row's valid keys (lo < hi): every
// key shares the bits above the highest bit where lo and hi differ, so those are the
// prefix already and the first digit is the 8 bits from that one down. Scores crowd into a
// narrow range (the log-shares of a row mostly within a few nats), where the fixed digits
// 31-24 / 23-16 / ... spend the first pass, often two, on a bin that holds every key; the
// window from the range resolves 8 bits of the spread itself, so fewer passes reach a bin
// that is taken whole (docs/cuda_notes.md, v29).
struct RadixStart {
  uint32_t prefix, mask;
  int shift;
};
__device__ __forceinline__ RadixStart radix_start(uint32_t lo, uint32_t hi) {
  const int top = 31 - __clz(lo ^ hi);  // lo < hi: some bit differs
  const uint32_t mask = top == 31 ? 0u : ~((2u << top) - 1u);
  return {lo & mask, mask, max(top - 7, 0)};
}
// The next pass's shift after one at `shift` (> 0): 8 bits lower, the last window ending at
// bit 0 (its upper bits may be fixed already: the counted keys share them, so only their
// bins fill and the digit found repeats them).
__device__ __forceinline__ int radix_next_shift(int shift) { return max(shift - 8, 0); }

// Block-wide: the smallest and largest of the block's valid keys (UINT32_MAX / 0 when it has
// none), in every thread.
template <typename KeyFn>
__device__ void block_key_range(KeyFn key_of, int n, SelectSmem& sm, uint32_t& lo, uint32_t& hi) {
  thread_key_range(key_of, n, lo, hi);
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  if (threadIdx.x == 0) sm.range_lo = 0xffffffffu, sm.range_hi = 0u;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) atomicMin(&sm.range_lo, lo), atomicMax(&sm.range_hi, hi);
  __syncthreads();
  lo = sm.range_lo;
  hi = sm.range_hi;
  __syncthreads();  // every thread has read them before a next call may reset them
}

// Block-wide, one radix pass: the digit at `shift` of the valid keys under prefix / mask,
// counted into hist (256 bins of the caller's shared memory), where the count from the top
// reaches `remaining`; prefix, mask and remaining narrowed to it, whole set when its bin is
// taken whole (block-uniform).
template <typename KeyFn>
__device__ __forceinline__ void block_radix_pass(KeyFn key_of, int n, uint32_t* hist,
                                                 SelectSmem& sm, uint32_t& prefix, uint32_t& mask,
                                                 int shift, int& remaining, bool& whole) {
  for (int i = threadIdx.x; i < 256; i += kThreads) hist[i] = 0;
  __syncthreads();
  count_digits(key_of, n, prefix, mask, shift, hist);
  __syncthreads();
  find_digit(hist, remaining, sm);
  __syncthreads();
  prefix |= sm.digit << shift;
  mask |= 255u << shift;
  remaining = sm.remaining;
  whole = sm.whole;
  __syncthreads();
}

// Block-wide: T and need_eq as above for the m largest valid keys (1 <= m < valid count).
template <typename KeyFn>
__device__ void radix_threshold(KeyFn key_of, int n, int m, SelectSmem& sm, uint32_t& T,
                                int& need_eq, Threshold want = Threshold::bound) {
  uint32_t lo, hi;
  block_key_range(key_of, n, sm, lo, hi);
  if (lo == hi) {  // every valid key equal: the first m of them in index order
    T = lo;
    need_eq = m;
    return;
  }
  const RadixStart st = radix_start(lo, hi);
  uint32_t prefix = st.prefix, mask = st.mask;
  int remaining = m;
  for (int shift = st.shift;; shift = radix_next_shift(shift)) {
    bool whole;
    block_radix_pass(key_of, n, sm.hist, sm, prefix, mask, shift, remaining, whole);
    if ((want == Threshold::bound && whole) || shift == 0) break;
  }
  T = prefix;
  need_eq = remaining;
}

// Block-wide stable compaction over flags: flags_of(e, gt, eq) for e < n; emit(e, pos) for
// every element with gt and for the first need_eq with eq, in index order, pos its place
// among them. gt0 / eq0: the elements with gt / eq before this block's first one (the cluster
// kernels' lower-ranked blocks); the emitted positions count them, the returned count does not.
template <typename FlagFn, typename EmitFn>
__device__ int compact_flags(FlagFn flags_of, int n, int need_eq, SelectSmem& sm, EmitFn emit,
                             uint32_t gt0 = 0, uint32_t eq0 = 0) {
  uint32_t gt_base = gt0, eq_base = eq0;
  for (int base = 0; base < n; base += kThreads) {
    const int e = base + threadIdx.x;
    bool gt = false, eq = false;
    if (e < n) flags_of(e, gt, eq);
    uint32_t pre, agg;
    Scan(sm.scan).ExclusiveSum(uint32_t(gt) | (uint32_t(eq) << 16), pre, agg);
    const uint32_t gt_before = gt_base + (pre & 0xffffu), eq_before = eq_base + (pre >> 16);
    if (gt || (eq && eq_before < uint32_t(need_eq)))
      emit(e, int(gt_before + min(eq_before, uint32_t(need_eq))));
    gt_base += agg & 0xffffu;
    eq_base += agg >> 16;
    __syncthreads();  // TempStorage reuse
  }
  return int(gt_base - gt0 + min(eq_base, uint32_t(need_eq)) - min(eq0, uint32_t(need_eq)));
}

// compact_flags for the top-m split of keys (T, need_eq from radix_threshold): > T, then == T
// up to need_eq. take_all: every valid element.
template <typename KeyFn, typename EmitFn>
__device__ int compact(KeyFn key_of, int n, bool take_all, uint32_t T, int need_eq, SelectSmem& sm,
                       EmitFn emit, uint32_t gt0 = 0, uint32_t eq0 = 0) {
  auto flags_of = [&](int e, bool& gt, bool& eq) {
    bool valid;
    const uint32_t k = key_of(e, valid);
    gt = valid && (take_all || k > T);
    eq = valid && !take_all && k == T;
  };
  return compact_flags(flags_of, n, take_all ? 0 : need_eq, sm, emit, gt0, eq0);
}

// float_key's inverse: the score a key was made from.
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The budget covers the sequence: every page, in order, -1 padded.
__device__ __forceinline__ void write_all_pages(const Rules& r, int cap, int32_t* out,
                                                int32_t* count) {
  for (int i = threadIdx.x; i < cap; i += kThreads) out[i] = i < r.n_pages ? i : -1;
  if (threadIdx.x == 0) *count = r.n_pages;
}

// The final list of one (sequence, KV head) around its n_mid selected pages (already at
// out[sink_end ..]): sinks, recent pages, the tail page, -1 padding, and the count.
__device__ __forceinline__ void write_list(const Rules& r, int n_mid, int cap, int32_t* out,
                                           int32_t* count_out) {
  const int n_recent = r.full - r.recent_start;
  for (int i = threadIdx.x; i < r.sink_end; i += kThreads) out[i] = i;
  for (int i = threadIdx.x; i < n_recent; i += kThreads)
    out[r.sink_end + n_mid + i] = r.recent_start + i;
  const int count = r.sink_end + n_mid + n_recent + r.has_tail;
  if (threadIdx.x == 0) {
    if (r.has_tail) out[count - 1] = r.full;
    *count_out = count;
  }
  for (int i = count + threadIdx.x; i < cap; i += kThreads) out[i] = -1;
}

}  // namespace
}  // namespace locks::cuda::detail

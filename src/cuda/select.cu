// Top-k page selection on the GPU (select.h rules), with no host sync and a grid fixed by
// the plan. Scores become order-preserving 32-bit keys; a block-wide radix select (four
// 8-bit digit passes, histograms in shared memory) finds the m-th largest key T and how
// many keys equal to T to take; a stable block scan then keeps every key > T and the
// lowest-index keys == T (ties to the lower index), in ascending page order.
//   stage 1: one block per (chunk, KV head, sequence), chunks of 2048 or 4096 pages chosen
//            at plan time (select_chunk_pages): the chunk's top-m candidates among the
//            pages that are neither sink, recent nor tail;
//   stage 2: one block per (KV head, sequence): top-m of the candidates, then the final
//            ascending list [sinks | selected | recent | tail], -1 padded;
//   or, when one chunk covers every sequence, both in one block per (KV head, sequence).
// Adaptive budget (cfg.tau > 0): before the final radix select, the block picks how many of
// the top candidates to keep (rules::adaptive_pages: a binary search over m, each probe a
// radix select of the m-th key and a block sum of the masses above it), then selects that
// many. Stage 1 is unchanged: its per-chunk top-`slots` lists hold every global top-m.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "locks/rules.h"

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
  const int len = raw_len >= 1 && raw_len <= M * P ? raw_len : 0;
  Rules r;
  r.full = rules::full_pages(len, P);
  r.n_pages = rules::num_pages(len, P);
  r.has_tail = r.full < r.n_pages;
  r.all = rules::selects_all(cfg.budget_tokens, len);
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
  uint32_t carry_gt, carry_eq;
};

// Block-wide: the m-th largest key among valid elements (1 <= m < valid count) and the
// number of elements equal to it that belong to the top m.
template <typename KeyFn>
__device__ void radix_threshold(KeyFn key_of, int n, int m, SelectSmem& sm, uint32_t& T,
                                int& need_eq) {
  uint32_t prefix = 0, mask = 0;
  int remaining = m;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sm.hist[i] = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < n; e += kThreads) {
      bool valid;
      const uint32_t k = key_of(e, valid);
      // Scores crowd into few bins: aggregate equal bins across the warp (one atomic each).
      const uint32_t bin = (valid && (k & mask) == prefix) ? (k >> shift) & 255u : 256u;
      const unsigned peers = __match_any_sync(__activemask(), bin);
      if (bin < 256u && (threadIdx.x & 31) == __ffs(peers) - 1)
        atomicAdd(&sm.hist[bin], unsigned(__popc(peers)));
    }
    __syncthreads();
    if (threadIdx.x < 32) {          // warp 0: find the digit where the count from the top reaches
      const int lane = threadIdx.x;  // `remaining`; lane l owns digits 255-8l .. 248-8l
      uint32_t c[8], tot = 0;
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        c[x] = sm.hist[255 - 8 * lane - x];
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
            break;
          }
          acc += c[x];
        }
      }
    }
    __syncthreads();
    prefix |= sm.digit << shift;
    mask |= 255u << shift;
    remaining = sm.remaining;
    __syncthreads();
  }
  T = prefix;
  need_eq = remaining;
}

// Block-wide stable compaction: emit(e, pos) for the top-m elements in index order.
// take_all: every valid element.
template <typename KeyFn, typename EmitFn>
__device__ int compact(KeyFn key_of, int n, bool take_all, uint32_t T, int need_eq, SelectSmem& sm,
                       EmitFn emit) {
  uint32_t gt_base = 0, eq_base = 0;
  for (int base = 0; base < n; base += kThreads) {
    const int e = base + threadIdx.x;
    bool valid = false;
    uint32_t k = 0;
    if (e < n) k = key_of(e, valid);
    const uint32_t gt = valid && (take_all || k > T);
    const uint32_t eq = valid && !take_all && k == T;
    uint32_t pre, agg;
    Scan(sm.scan).ExclusiveSum(gt | (eq << 16), pre, agg);
    const uint32_t gt_before = gt_base + (pre & 0xffffu), eq_before = eq_base + (pre >> 16);
    if (gt || (eq && eq_before < uint32_t(need_eq)))
      emit(e, int(gt_before + min(eq_before, uint32_t(need_eq))));
    gt_base += agg & 0xffffu;
    eq_base += agg >> 16;
    __syncthreads();  // TempStorage reuse
  }
  return int(gt_base + (take_all ? 0u : min(eq_base, uint32_t(need_eq))));
}

// float_key's inverse: the score a key was made from.
__device__ __forceinline__ float key_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct MaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }  // as std::max
};

// Block-wide sum / max, the result in every thread (cub's order is fixed: deterministic).
__device__ float block_sum(float v, SelectSmem& sm) {
  const float t = Reduce(sm.reduce).Sum(v);
  if (threadIdx.x == 0) sm.bcast = t;
  __syncthreads();
  const float out = sm.bcast;
  __syncthreads();  // bcast and the reduce storage are reused
  return out;
}
__device__ float block_max(float v, SelectSmem& sm) {
  const float t = Reduce(sm.reduce).Reduce(v, MaxOp());
  if (threadIdx.x == 0) sm.bcast = t;
  __syncthreads();
  const float out = sm.bcast;
  __syncthreads();
  return out;
}

// The adaptive budget (select.h): how many of the best candidates to keep, hi = the fixed
// budget's count (<= the valid candidates). s: the row's group scores (full pages [0,
// r.full)); candidates come through key_of (n elements, some invalid). Masses exp(s - max)
// in float, the max over the full pages, as the CPU does in double; the total and the sink
// and recent pages' mass from the row itself, so the op needs nothing from aggregation.
// Called by every thread of the block (block-uniform arguments).
template <typename KeyFn>
__device__ int adaptive_slots(KeyFn key_of, int n, int hi, const float* s, const Rules& r,
                              const SelectConfig& cfg, SelectSmem& sm) {
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < r.full; j += kThreads) mx = MaxOp()(mx, s[j]);
  mx = block_max(mx, sm);
  float tot = 0, fix = 0;
  for (int j = threadIdx.x; j < r.full; j += kThreads) {
    const float m = expf(s[j] - mx);  // NaN when mx is not finite: the fixed budget
    tot += m;
    if (j < r.sink_end || j >= r.recent_start) fix += m;
  }
  const float total = block_sum(tot, sm), fixed = block_sum(fix, sm);
  return rules::adaptive_pages(cfg.floor_pages, hi, cfg.tau, double(total), [&](int m) {
    if (m == 0) return double(fixed);
    uint32_t T = 0;
    int need_eq = 0;
    radix_threshold(key_of, n, m, sm, T, need_eq);  // 1 <= m < hi <= valid candidates
    float part = 0;
    for (int e = threadIdx.x; e < n; e += kThreads) {
      bool valid;
      const uint32_t k = key_of(e, valid);
      if (valid && k > T) part += expf(key_float(k) - mx);
    }
    return double(fixed) + double(block_sum(part, sm)) +
           double(need_eq) * double(expf(key_float(T) - mx));
  });
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

__global__ void __launch_bounds__(kThreads)
    select_stage1(const float* __restrict__ gs, const int32_t* __restrict__ seq_lens, int M, int P,
                  SelectConfig cfg, int cap, int n_chunks, int chunk_pages, uint32_t* cand_key,
                  int32_t* cand_idx, int32_t* cand_cnt) {
  __shared__ SelectSmem sm;
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, Hkv = gridDim.y;
  const int64_t row = (int64_t(b) * Hkv + h);
  const Rules r = rules_for(seq_lens[b], P, M, cfg);
  const int lo = max(r.sink_end, c * chunk_pages);
  const int hi = min(r.recent_start, (c + 1) * chunk_pages);
  const int n = hi - lo;
  int32_t* cnt = cand_cnt + row * n_chunks + c;
  if (r.all || r.slots <= 0 || n <= 0) {
    if (threadIdx.x == 0) *cnt = 0;
    return;
  }
  const float* s = gs + row * M + lo;
  __shared__ uint32_t skeys[kSelectChunk];  // the chunk's keys, read once from global memory
  for (int e = threadIdx.x; e < n; e += kThreads) skeys[e] = float_key(s[e]);
  __syncthreads();
  auto key_of = [&](int e, bool& valid) {
    valid = true;
    return skeys[e];
  };
  uint32_t T = 0;
  int need_eq = 0;
  const bool all = n <= r.slots;
  if (!all) radix_threshold(key_of, n, r.slots, sm, T, need_eq);
  uint32_t* ok = cand_key + (row * n_chunks + c) * cap;
  int32_t* oi = cand_idx + (row * n_chunks + c) * cap;
  const int got = compact(key_of, n, all, T, need_eq, sm, [&](int e, int pos) {
    ok[pos] = skeys[e];
    oi[pos] = lo + e;
  });
  if (threadIdx.x == 0) *cnt = got;
}

__global__ void __launch_bounds__(kThreads)
    select_stage2(const float* __restrict__ gs, const int32_t* __restrict__ seq_lens, int M, int P,
                  SelectConfig cfg, int cap, int n_chunks, int n_used,
                  const uint32_t* __restrict__ cand_key, const int32_t* __restrict__ cand_idx,
                  const int32_t* __restrict__ cand_cnt, int32_t* __restrict__ pages,
                  int32_t* __restrict__ counts) {
  __shared__ SelectSmem sm;
  const int h = blockIdx.x, b = blockIdx.y, Hkv = gridDim.x;
  const int64_t row = int64_t(b) * Hkv + h;
  const Rules r = rules_for(seq_lens[b], P, M, cfg);
  int32_t* out = pages + row * cap;
  if (r.all) {
    write_all_pages(r, cap, out, counts + row);
    return;
  }
  // Candidates: chunk c holds cand_cnt[c] of them at [c * cap, c * cap + cnt).
  const int32_t* cc = cand_cnt + row * n_chunks;
  int total = 0;
  for (int c = 0; c < n_used; ++c) total += cc[c];
  const uint32_t* ck = cand_key + row * n_chunks * cap;
  const int32_t* ci = cand_idx + row * n_chunks * cap;
  auto key_of = [&](int e, bool& valid) {
    valid = (e % cap) < cc[e / cap];
    return valid ? ck[e] : 0u;
  };
  const int n = n_used * cap;
  int slots = max(r.slots, 0);
  int n_mid = 0;
  if (slots > 0 && total > 0 && cfg.tau > 0)  // block-uniform
    slots = adaptive_slots(key_of, n, min(slots, total), gs + row * M, r, cfg, sm);
  if (slots > 0 && total > 0) {
    uint32_t T = 0;
    int need_eq = 0;
    const bool all = total <= slots;
    if (!all) radix_threshold(key_of, n, slots, sm, T, need_eq);
    n_mid = compact(key_of, n, all, T, need_eq, sm,
                    [&](int e, int pos) { out[r.sink_end + pos] = ci[e]; });
  }
  write_list(r, n_mid, cap, out, counts + row);
}

// One stage for sequences that fit one chunk (max_blocks_per_seq <= chunk pages, e.g. up to
// 32K tokens with 2048-page chunks): stage 1's cached keys and stage 2's list in one block
// per (KV head, sequence), one launch and one radix select fewer. Same rules, same ties
// (lowest index among equal keys), so the same list.
__global__ void __launch_bounds__(kThreads)
    select_single(const float* __restrict__ gs, const int32_t* __restrict__ seq_lens, int M, int P,
                  SelectConfig cfg, int cap, int32_t* __restrict__ pages,
                  int32_t* __restrict__ counts) {
  __shared__ SelectSmem sm;
  __shared__ uint32_t skeys[kSelectChunk];
  const int h = blockIdx.x, b = blockIdx.y, Hkv = gridDim.x;
  const int64_t row = int64_t(b) * Hkv + h;
  const Rules r = rules_for(seq_lens[b], P, M, cfg);
  int32_t* out = pages + row * cap;
  if (r.all) {
    write_all_pages(r, cap, out, counts + row);
    return;
  }
  const int lo = r.sink_end, n = r.recent_start - r.sink_end;  // candidates: [lo, lo + n)
  int slots = max(r.slots, 0);
  int n_mid = 0;
  if (slots > 0 && n > 0) {  // block-uniform
    const float* s = gs + row * M + lo;
    for (int e = threadIdx.x; e < n; e += kThreads) skeys[e] = float_key(s[e]);
    __syncthreads();
    auto key_of = [&](int e, bool& valid) {
      valid = true;
      return skeys[e];
    };
    if (cfg.tau > 0) slots = adaptive_slots(key_of, n, min(slots, n), gs + row * M, r, cfg, sm);
    if (slots > 0) {
      uint32_t T = 0;
      int need_eq = 0;
      const bool all = n <= slots;
      if (!all) radix_threshold(key_of, n, slots, sm, T, need_eq);
      n_mid = compact(key_of, n, all, T, need_eq, sm,
                      [&](int e, int pos) { out[r.sink_end + pos] = lo + e; });
    }
  }
  write_list(r, n_mid, cap, out, counts + row);
}

}  // namespace

void launch_select(const float* group_scores, const BatchView& batch, int Hkv,
                   const SelectConfig& cfg, int P, const Selection& out, uint32_t* cand_key,
                   int32_t* cand_idx, int32_t* cand_cnt, int n_chunks, int chunk_pages,
                   cudaStream_t st) {
  LOCKS_REQUIRE(chunk_pages >= 1 && chunk_pages <= kSelectChunk, "selection chunk of ", chunk_pages,
                " pages");
  const int M = batch.max_blocks_per_seq;
  const int used = ceil_div(M, chunk_pages);
  if (used == 1) {
    launch_kernel(select_single, dim3(unsigned(Hkv), unsigned(batch.batch_size)), dim3(kThreads), 0,
                  st, group_scores, batch.seq_lens, M, P, cfg, out.capacity, out.pages, out.counts);
    return;
  }
  launch_kernel(select_stage1, dim3(unsigned(used), unsigned(Hkv), unsigned(batch.batch_size)),
                dim3(kThreads), 0, st, group_scores, batch.seq_lens, M, P, cfg, out.capacity,
                n_chunks, chunk_pages, cand_key, cand_idx, cand_cnt);
  launch_kernel(select_stage2, dim3(unsigned(Hkv), unsigned(batch.batch_size)), dim3(kThreads), 0,
                st, group_scores, batch.seq_lens, M, P, cfg, out.capacity, n_chunks, used, cand_key,
                cand_idx, cand_cnt, out.pages, out.counts);
}

}  // namespace locks::cuda::detail

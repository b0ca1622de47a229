// Top-k page selection on the GPU (select.h rules), with no host sync and a grid fixed by
// the plan. Scores become order-preserving 32-bit keys; a block-wide radix select finds the
// threshold of the top m (8-bit digits from the highest bit where the keys differ, stopping
// once the boundary bin is taken whole: usually 2 passes, one barrier each); one block scan
// then keeps every key above it and the lowest-index keys on it (ties to the lower index),
// in ascending page order. Each thread owns 8 consecutive elements of a 4096-element tile.
//   stage 1: one block per (4096-page chunk, KV head, sequence): the chunk's top-m
//            candidates among the pages that are neither sink, recent nor tail (from the
//            group scores, or fused: computed here from the head scores);
//   stage 2: one block per (KV head, sequence): top-m of the candidates, then the final
//            ascending list [sinks | selected | recent | tail], -1 padded.
#include <climits>

#include "aggregate.cuh"
#include "common.cuh"
#include "kernels.cuh"
#include "pdl.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kThreads = 512, kWarps = kThreads / 32;
constexpr int kPerThread = 8;                 // consecutive elements per thread and tile
constexpr int kTile = kThreads * kPerThread;  // elements per tile
static_assert(kTile == kSelectChunk);

struct Rules {  // the budget rules for one sequence
  int full, n_pages, has_tail, sink_end, recent_start, slots;
  bool all;
};

__device__ Rules rules_for(int len, int P, const SelectConfig& cfg) {
  Rules r;
  r.full = len / P;
  r.n_pages = (len + P - 1) / P;
  r.has_tail = r.full < r.n_pages;
  r.all = cfg.budget_tokens >= len;
  r.sink_end = min(cfg.sink_pages, r.full);
  r.recent_start = max(max(r.full - cfg.recent_pages, 0), r.sink_end);
  const int k = cfg.budget_tokens / P;
  r.slots = k - r.has_tail - r.sink_end - (r.full - r.recent_start);
  return r;
}

struct SelectSmem {
  // Rotating radix histograms: pass p fills hist[p % 3] while hist[(p + 1) % 3] is cleared
  // (its last readers finished before the previous barrier), so a pass needs one barrier.
  uint32_t hist[3][256];
  uint32_t wand[kWarps], wor[kWarps];  // per-warp AND / OR of the valid keys
  uint32_t wsum[2][kWarps];            // compaction: per-warp counts, by tile parity
};

// The top m: every key with (key & mask) > prefix, and the first need_eq (in element order)
// of those with (key & mask) == prefix. mask is a run of high bits.
struct Threshold {
  uint32_t prefix, mask;
  int need_eq;
};
__device__ __forceinline__ Threshold take_all() { return {0u, 0u, INT_MAX}; }

// Block-wide radix select of the m-th largest key (1 <= m < number of valid elements).
// load(t, k) fills this thread's kPerThread consecutive keys of tile t and returns their
// valid bits. The bits all valid keys share are skipped (one row's scores sit in a narrow
// range, so 8-bit digits from bit 31 would spend a pass or two on one bin), and the passes
// stop once the boundary bin is taken whole. Every warp scans the histogram itself, so all
// threads agree on the digit without a second barrier.
template <typename Load>
__device__ Threshold find_threshold(Load load, int n_tiles, int m, SelectSmem& sm) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint32_t a = 0xffffffffu, o = 0u;
  for (int t = 0; t < n_tiles; ++t) {
    uint32_t k[kPerThread];
    const uint32_t v = load(t, k);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if ((v >> i) & 1u) a &= k[i], o |= k[i];
  }
  a = __reduce_and_sync(0xffffffffu, a);
  o = __reduce_or_sync(0xffffffffu, o);
  if (lane == 0) sm.wand[warp] = a, sm.wor[warp] = o;
  if (threadIdx.x < 256) sm.hist[0][threadIdx.x] = 0u;
  __syncthreads();
  a = 0xffffffffu, o = 0u;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) a &= sm.wand[w], o |= sm.wor[w];
  Threshold th{a, 0xffffffffu, m};
  if (a == o) return th;        // all valid keys equal: the first m
  int top = 31 - __clz(a ^ o);  // highest bit where valid keys differ
  th.mask = top == 31 ? 0u : ~0u << (top + 1);
  th.prefix = a & th.mask;
  int remaining = m;
  for (int pass = 0;; ++pass) {
    const int shift = max(top - 7, 0);
    uint32_t* hist = sm.hist[pass % 3];
    if (threadIdx.x < 256) sm.hist[(pass + 1) % 3][threadIdx.x] = 0u;
    for (int t = 0; t < n_tiles; ++t) {
      uint32_t k[kPerThread];
      const uint32_t v = load(t, k);
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const bool in = ((v >> i) & 1u) && (k[i] & th.mask) == th.prefix;
        const uint32_t bin = in ? (k[i] >> shift) & 255u : 256u;
        // Near-ties crowd into few bins: one atomic per distinct bin of the warp.
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], unsigned(__popc(peers)));
      }
    }
    __syncthreads();
    // The digit where the count from the top reaches `remaining`; lane l owns digits
    // 255-8l .. 248-8l.
    uint32_t c[8], tot = 0;
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      c[x] = hist[255 - 8 * lane - x];
      tot += c[x];
    }
    uint32_t incl = tot;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += y;
    }
    const uint32_t excl = incl - tot, want = uint32_t(remaining);
    const bool here = excl < want && incl >= want;
    uint32_t digit = 0, rem = 0, cnt = 0;
    if (here) {
      uint32_t acc = excl;
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        if (acc + c[x] >= want) {
          digit = uint32_t(255 - 8 * lane - x), rem = want - acc, cnt = c[x];
          break;
        }
        acc += c[x];
      }
    }
    const int src = __ffs(__ballot_sync(0xffffffffu, here)) - 1;
    digit = __shfl_sync(0xffffffffu, digit, src);
    rem = __shfl_sync(0xffffffffu, rem, src);
    cnt = __shfl_sync(0xffffffffu, cnt, src);
    remaining = int(rem);
    th.prefix |= digit << shift;  // bits above `top` in the digit equal the prefix's
    th.mask |= 255u << shift;
    if (cnt == rem || shift == 0) break;  // the same in every warp: a uniform exit
    top = shift - 1;
  }
  th.need_eq = remaining;
  return th;
}

// Block-wide stable compaction: emit(e, key, pos) for the elements above the threshold, in
// element order (one warp scan and one barrier per tile). Returns how many were emitted.
template <typename Load, typename Emit>
__device__ int compact(Load load, int n_tiles, const Threshold th, SelectSmem& sm, Emit emit) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int gt_base = 0, eq_base = 0;
  for (int t = 0; t < n_tiles; ++t) {
    uint32_t k[kPerThread];
    const uint32_t v = load(t, k);
    uint32_t gt = 0, eq = 0;  // bit i: element i is above / on the threshold
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const uint32_t x = k[i] & th.mask;
      gt |= uint32_t(((v >> i) & 1u) && x > th.prefix) << i;
      eq |= uint32_t(((v >> i) & 1u) && x == th.prefix) << i;
    }
    const uint32_t mine = __popc(gt) | (__popc(eq) << 16);  // <= kTile each: 16 bits
    uint32_t incl = mine;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += y;
    }
    uint32_t* ws = sm.wsum[t & 1];  // rewritten two tiles later, after everyone read it
    if (lane == 31) ws[warp] = incl;
    __syncthreads();
    uint32_t before = incl - mine, total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const uint32_t x = ws[w];
      if (w < warp) before += x;
      total += x;
    }
    int g = gt_base + int(before & 0xffffu), q = eq_base + int(before >> 16);
    const int e0 = t * kTile + kPerThread * threadIdx.x;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      if ((gt >> i) & 1u) {
        emit(e0 + i, k[i], g + min(q, th.need_eq));
        ++g;
      } else if ((eq >> i) & 1u) {
        if (q < th.need_eq) emit(e0 + i, k[i], g + q);
        ++q;
      }
    }
    gt_base += int(total & 0xffffu);
    eq_base += int(total >> 16);
  }
  return gt_base + min(eq_base, th.need_eq);
}

// Stage 1: one block per (4096-page chunk, KV head, sequence): the chunk's top `slots`
// candidates among the pages that are neither sink, recent nor tail. kFused: the group
// scores are computed here from the head scores and the scoring kernel's chunk LSE
// partials (the aggregation, with the same operations in the same order as
// aggregate_kernel, so the same bits); otherwise they are read from group_scores.
template <bool kFused>
__global__ void __launch_bounds__(kThreads, 2)
    select_stage1(const float* __restrict__ scores, const float* __restrict__ chunk_lse,
                  int n_score_chunks, int n_score_used, int Hq,
                  const int32_t* __restrict__ seq_lens, int M, int P, SelectConfig cfg, int cap,
                  int n_chunks, uint32_t* cand_key, int32_t* cand_idx, int32_t* cand_cnt) {
  pdl_wait();
  pdl_trigger();
  __shared__ SelectSmem sm;
  __shared__ __align__(16) uint32_t skeys[kTile];  // the chunk's keys
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, Hkv = gridDim.y;
  const int64_t row = (int64_t(b) * Hkv + h);
  const Rules r = rules_for(seq_lens[b], P, cfg);
  const int lo = max(r.sink_end, c * kSelectChunk);
  const int hi = min(r.recent_start, (c + 1) * kSelectChunk);
  const int n = hi - lo;
  int32_t* cnt = cand_cnt + row * n_chunks + c;
  if (r.all || r.slots <= 0 || n <= 0) {
    if (threadIdx.x == 0) *cnt = 0;
    return;
  }
  if constexpr (kFused) {
    __shared__ float lse[16], wm[16][kLseThreads / 32], wl[16][kLseThreads / 32];
    const int G = Hq / Hkv;
    const float* hs = scores + (int64_t(b) * Hq + int64_t(h) * G) * M + lo;
    // Start the head scores' DRAM reads (into L2) while the LSE partials are reduced.
    for (int x = threadIdx.x; x < G * (kTile / 32); x += kThreads) {
      const int e = (x % (kTile / 32)) * 32;
      if (e < n)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(hs + int64_t(x / (kTile / 32)) * M + e));
    }
    // LSE_h of the group's G heads, 128 threads a head (aggregate.cuh: the lse_kernel order).
    const int lane = threadIdx.x & 31, tt = threadIdx.x % kLseThreads;
    for (int g = threadIdx.x / kLseThreads; g < G; g += kThreads / kLseThreads) {
      float m, l;
      lse_warp_partial(chunk_lse + (int64_t(b) * Hq + int64_t(h) * G + g) * n_score_chunks * 2,
                       n_score_used, tt, m, l);
      if (lane == 0) wm[g][tt >> 5] = m, wl[g][tt >> 5] = l;
    }
    __syncthreads();
    if (threadIdx.x < G) lse[threadIdx.x] = lse_finish(wm[threadIdx.x], wl[threadIdx.x]);
    __syncthreads();
    float a[kPerThread];
    group_page_scores<kPerThread>(hs + threadIdx.x, M, kThreads, n - int(threadIdx.x), lse, G, a);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = int(threadIdx.x) + i * kThreads;
      if (e < n) skeys[e] = float_key(a[i]);
    }
  } else {
    const float* s = scores + row * M + lo;
    for (int e = threadIdx.x; e < n; e += kThreads) skeys[e] = float_key(s[e]);
  }
  __syncthreads();
  auto load = [&](int, uint32_t(&k)[kPerThread]) {
    const uint4* p = reinterpret_cast<const uint4*>(skeys) + 2 * threadIdx.x;
    const uint4 x = p[0], y = p[1];
    k[0] = x.x, k[1] = x.y, k[2] = x.z, k[3] = x.w, k[4] = y.x, k[5] = y.y, k[6] = y.z, k[7] = y.w;
    const int nv = min(max(n - kPerThread * int(threadIdx.x), 0), kPerThread);
    return (1u << nv) - 1u;
  };
  const Threshold th = n <= r.slots ? take_all() : find_threshold(load, 1, r.slots, sm);
  uint32_t* ok = cand_key + (row * n_chunks + c) * cap;
  int32_t* oi = cand_idx + (row * n_chunks + c) * cap;
  const int got = compact(load, 1, th, sm, [&](int e, uint32_t key, int pos) {
    ok[pos] = key;
    oi[pos] = lo + e;
  });
  if (threadIdx.x == 0) *cnt = got;
}

// Stage 2: one block per (KV head, sequence): top `slots` of the candidates, then the final
// ascending list [sinks | selected | recent | tail], -1 padded.
__global__ void __launch_bounds__(kThreads)
    select_stage2(const int32_t* __restrict__ seq_lens, int P, SelectConfig cfg, int cap,
                  int n_chunks, int n_used, const uint32_t* __restrict__ cand_key,
                  const int32_t* __restrict__ cand_idx, const int32_t* __restrict__ cand_cnt,
                  int32_t* __restrict__ pages, int32_t* __restrict__ counts) {
  pdl_wait();
  pdl_trigger();
  __shared__ SelectSmem sm;
  const int h = blockIdx.x, b = blockIdx.y, Hkv = gridDim.x;
  const int64_t row = int64_t(b) * Hkv + h;
  const Rules r = rules_for(seq_lens[b], P, cfg);
  int32_t* out = pages + row * cap;
  if (r.all) {
    for (int i = threadIdx.x; i < cap; i += kThreads) out[i] = i < r.n_pages ? i : -1;
    if (threadIdx.x == 0) counts[row] = r.n_pages;
    return;
  }
  // Candidates: chunk c holds cand_cnt[c] of them at [c * cap, c * cap + cnt).
  const int32_t* cc = cand_cnt + row * n_chunks;
  int total = 0;
  for (int c = 0; c < n_used; ++c) total += cc[c];
  const uint32_t* ck = cand_key + row * n_chunks * cap;
  const int32_t* ci = cand_idx + row * n_chunks * cap;
  const int n = n_used * cap;
  auto load = [&](int t, uint32_t(&k)[kPerThread]) {
    const int e0 = t * kTile + kPerThread * int(threadIdx.x);
    int c = e0 / cap, j = e0 - c * cap;
    uint32_t v = 0;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const bool ok = e0 + i < n && j < cc[c];
      k[i] = ok ? ck[e0 + i] : 0u;
      v |= uint32_t(ok) << i;
      if (++j == cap) j = 0, ++c;
    }
    return v;
  };
  const int slots = max(r.slots, 0);
  int n_mid = 0;
  if (slots > 0 && total > 0) {
    const int n_tiles = (n + kTile - 1) / kTile;
    const Threshold th = total <= slots ? take_all() : find_threshold(load, n_tiles, slots, sm);
    n_mid = compact(load, n_tiles, th, sm,
                    [&](int e, uint32_t, int pos) { out[r.sink_end + pos] = ci[e]; });
  }
  const int n_recent = r.full - r.recent_start;
  for (int i = threadIdx.x; i < r.sink_end; i += kThreads) out[i] = i;
  for (int i = threadIdx.x; i < n_recent; i += kThreads)
    out[r.sink_end + n_mid + i] = r.recent_start + i;
  const int count = r.sink_end + n_mid + n_recent + r.has_tail;
  if (threadIdx.x == 0) {
    if (r.has_tail) out[count - 1] = r.full;
    counts[row] = count;
  }
  for (int i = count + threadIdx.x; i < cap; i += kThreads) out[i] = -1;
}

void launch_stage2(const BatchView& batch, int Hkv, const SelectConfig& cfg, int P,
                   const Selection& out, const uint32_t* cand_key, const int32_t* cand_idx,
                   const int32_t* cand_cnt, int n_chunks, cudaStream_t st) {
  const int used = ceil_div(batch.max_blocks_per_seq, kSelectChunk);
  launch_pdl(select_stage2, dim3(unsigned(Hkv), unsigned(batch.batch_size)), dim3(kThreads), 0, st,
             batch.seq_lens, P, cfg, out.capacity, n_chunks, used, cand_key, cand_idx, cand_cnt,
             out.pages, out.counts);
}

}  // namespace

void launch_select(const float* group_scores, const BatchView& batch, int Hkv,
                   const SelectConfig& cfg, int P, const Selection& out, uint32_t* cand_key,
                   int32_t* cand_idx, int32_t* cand_cnt, int n_chunks, cudaStream_t st) {
  const int M = batch.max_blocks_per_seq;
  const int used = ceil_div(M, kSelectChunk);
  launch_pdl(select_stage1<false>, dim3(unsigned(used), unsigned(Hkv), unsigned(batch.batch_size)),
             dim3(kThreads), 0, st, group_scores, nullptr, 0, 0, 0, batch.seq_lens, M, P, cfg,
             out.capacity, n_chunks, cand_key, cand_idx, cand_cnt);
  launch_stage2(batch, Hkv, cfg, P, out, cand_key, cand_idx, cand_cnt, n_chunks, st);
}

void launch_aggregate_select(const float* head_scores, const float* chunk_lse, int n_score_chunks,
                             const BatchView& batch, int Hq, int Hkv, const SelectConfig& cfg,
                             int P, const Selection& out, uint32_t* cand_key, int32_t* cand_idx,
                             int32_t* cand_cnt, int n_chunks, cudaStream_t st) {
  const int M = batch.max_blocks_per_seq;
  const int used = ceil_div(M, kSelectChunk);
  launch_pdl(select_stage1<true>, dim3(unsigned(used), unsigned(Hkv), unsigned(batch.batch_size)),
             dim3(kThreads), 0, st, head_scores, chunk_lse, n_score_chunks,
             ceil_div(M, kScoreChunk), Hq, batch.seq_lens, M, P, cfg, out.capacity, n_chunks,
             cand_key, cand_idx, cand_cnt);
  launch_stage2(batch, Hkv, cfg, P, out, cand_key, cand_idx, cand_cnt, n_chunks, st);
}

}  // namespace locks::cuda::detail

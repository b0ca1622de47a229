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
#include "kernels.cuh"
#include "locks/error.h"
#include "select_common.cuh"

namespace locks::cuda::detail {
namespace {

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
    // 1 <= m < hi <= valid candidates; T's value is read below
    radix_threshold(key_of, n, m, sm, T, need_eq, Threshold::key);
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

// The two-level step's group choice (super_summary.h, decode_two_level in decoder.cu; level 1
// is super_score.cu):
//   select_groups_list: the group choice as a page list, one block per (sequence, KV head):
//     share-averaging over the G heads, the m best non-forced groups by the radix threshold
//     and stable compaction of select_common.cuh (ties to the lower index), then the list
//     of the kept groups' pages (ascending) and the open group; optionally the listed
//     pages' block ids (the level-2 scorer's per-head block table);
//   map_positions: the selection over list positions back to logical pages.
// The rules (forced groups, kept count, fallbacks) restate super_layout.cpp's on the device.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/super_summary.h"
#include "ptx.cuh"
#include "select_common.cuh"
#include "super.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kListSmemMax = 160 * 1024;

// The rules of super_layout.cpp for one sequence, on the device.
struct ListRules {
  int len, n_pages, C, first_end, recent_begin, F, m;  // m < 0: fallback (every page)
};

__device__ ListRules list_rules(int raw_len, int P, int S, int M, const SelectConfig& sel,
                                const TwoLevelConfig& cfg) {
  ListRules r;
  r.len = raw_len >= 1 && raw_len <= M * P ? raw_len : 0;
  const int full = rules::full_pages(r.len, P);
  r.n_pages = rules::num_pages(r.len, P);
  r.C = full / S;
  const int listed = r.C * S;
  const int sink_end = min(min(max(sel.sink_pages, 0), full), listed);
  r.first_end = min(r.C, max(cfg.first_groups, (sink_end + S - 1) / S));
  const int recent_start = max(0, full - max(sel.recent_pages, 0));
  r.recent_begin = sel.recent_pages > 0 && recent_start < listed ? recent_start / S : r.C;
  r.F = r.first_end + (r.C - r.recent_begin) - max(0, r.first_end - r.recent_begin);
  r.m = -1;
  if (r.len == 0 || rules::selects_all(sel.budget_tokens, r.len, sel.dense_below) ||
      r.C < cfg.flat_below_groups)
    return r;
  const double want = ceil(cfg.alpha * double(rules::budget_pages(sel.budget_tokens, P)) / S);
  if (want >= r.C) return r;
  const int m = max(cfg.min_groups, int(want));
  if (m + r.F >= r.C) return r;
  r.m = m;
  return r;
}

__global__ void __launch_bounds__(kThreads)
    select_groups_list_kernel(const float* __restrict__ gh, int MG, const int32_t* seq_lens, int M,
                              const int32_t* block_table, int64_t bt_stride, int Hq, int H, int P,
                              int S, SelectConfig sel, TwoLevelConfig cfg, int L, int32_t* page_map,
                              int32_t* list_lens, int32_t* list_blocks) {
  __shared__ SelectSmem sm;
  extern __shared__ float4 dyn[];
  float* a = reinterpret_cast<float*>(dyn);  // [MG] share-averaged scores
  float* lse = a + MG;                       // [G]
  __shared__ float part[2 * kMaxGroup];      // (max, sum) of a head's LSE per warp of the head
  uint32_t* eq_w = reinterpret_cast<uint32_t*>(lse + kMaxGroup);        // [MG / 32] ties at T
  uint32_t* kept_w = eq_w + (MG + 31) / 32;                             // [MG / 32] kept groups
  uint32_t* rank_w = kept_w + (MG + 31) / 32;                           // [MG / 32] word ranks
  uint8_t* keep = reinterpret_cast<uint8_t*>(rank_w + (MG + 31) / 32);  // [MG] forced
  const int h = blockIdx.x, b = blockIdx.y, G = Hq / H;
  const int64_t row = int64_t(b) * H + h;
  int32_t* map = page_map + row * L;
  int32_t* blk = list_blocks ? list_blocks + row * L : nullptr;
  const int32_t* bt = block_table ? block_table + int64_t(b) * bt_stride : nullptr;
  const ListRules r = list_rules(seq_lens[b], P, S, M, sel, cfg);
  auto put = [&](int i, int page) {
    map[i] = page;
    if (blk) blk[i] = bt[page];
  };
  int listed;
  if (r.m < 0) {  // fallback: every page (none for an invalid length or a list too short)
    listed = r.n_pages <= L ? r.n_pages : 0;
    for (int i = threadIdx.x; i < listed; i += kThreads) put(i, i);
  } else {
    const float* s0 = gh + (int64_t(b) * Hq + int64_t(h) * G) * MG;
    // Each head's log-sum-exp over the complete groups: W = 16 / G warps a head (one when
    // G > 16), online (max, sum) per lane, merged across the lanes, then the head's warps.
    const int nw = kThreads / 32, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int W = max(1, nw / G);
    for (int g = warp / W; g < G; g += nw / W) {
      const float* s = s0 + int64_t(g) * MG;
      float m = kNegInf, l = 0.0f;
      // Eight independent loads in flight per lane (a plain loop waited on each: the
      // L2 latency times C / 32 W was most of this kernel's time at G 16).
      for (int j0 = (warp % W) * 32 + lane; j0 < r.C; j0 += 8 * 32 * W) {
        float x[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int jj = j0 + u * 32 * W;
          x[u] = jj < r.C ? s[jj] : kNegInf;
        }
        float bm = x[0];
#pragma unroll
        for (int u = 1; u < 8; ++u) bm = fmaxf(bm, x[u]);
        if (bm != kNegInf) {
          float bl = 0.0f;
#pragma unroll
          for (int u = 0; u < 8; ++u) bl += x[u] == kNegInf ? 0.0f : expf(x[u] - bm);
          lse_merge(m, l, bm, bl);
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(kFull, m, o), l2 = __shfl_xor_sync(kFull, l, o);
        lse_merge(m, l, m2, l2);
      }
      if (lane == 0) {
        part[2 * (g * W + warp % W)] = m;
        part[2 * (g * W + warp % W) + 1] = l;
      }
    }
    __syncthreads();
    for (int g = threadIdx.x; g < G; g += kThreads) {
      float m = kNegInf, l = 0.0f;
      for (int w = 0; w < W; ++w) lse_merge(m, l, part[2 * (g * W + w)], part[2 * (g * W + w) + 1]);
      lse[g] = m == kNegInf ? kNegInf : m + logf(l);
    }
    __syncthreads();
    // a_j = log((1/G) sum_h exp(s_hj - LSE_h)) (score.h's rule on groups).
    const float log_g = logf(float(G));
    for (int j = threadIdx.x; j < r.C; j += kThreads) {
      // The G heads' scores of group j, loaded together (independent loads).
      float x[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        x[g] = g < G && lse[g] != kNegInf ? s0[int64_t(g) * MG + j] - lse[g] : kNegInf;
      float mx = kNegInf;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) mx = fmaxf(mx, x[g]);
      float t = 0.0f;
      if (mx != kNegInf)
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) t += x[g] == kNegInf ? 0.0f : expf(x[g] - mx);
      a[j] = mx == kNegInf ? kNegInf : mx + logf(t) - log_g;
      keep[j] = j < r.first_end || j >= r.recent_begin;
    }
    __syncthreads();
    // The m best non-forced groups (ties to the lower index).
    auto key_of = [&](int e, bool& valid) {
      valid = e < r.C && !keep[e];
      return valid ? float_key(a[e]) : 0u;
    };
    uint32_t T;
    int need_eq;
    radix_threshold(key_of, r.C, r.m, sm, T, need_eq);
    // The kept set as one bit a group, 32 groups a word (ballots), and the ranks from two
    // block scans over the words: the ties at T kept in index order up to need_eq, then the
    // kept groups' list order. (Two block compactions over 512-group chunks took 8 scans.)
    const int nwords = (r.C + 31) / 32;
    const uint32_t lt = (1u << lane) - 1u;
    for (int w = warp; w < nwords; w += kThreads / 32) {
      bool valid;
      const int e = w * 32 + lane;
      const uint32_t k = key_of(e, valid);
      const uint32_t eqm = __ballot_sync(kFull, valid && k == T);
      const uint32_t gtm = __ballot_sync(kFull, (valid && k > T) || (e < r.C && keep[e]));
      if (lane == 0) eq_w[w] = eqm, kept_w[w] = gtm;
    }
    __syncthreads();
    auto scan_words = [&](const uint32_t* words) {  // exclusive prefix of popc into rank_w
      uint32_t carry = 0;
      for (int base = 0; base < nwords; base += kThreads) {
        const int w = base + threadIdx.x;
        const uint32_t x = w < nwords ? uint32_t(__popc(words[w])) : 0u;
        uint32_t pre, agg;
        Scan(sm.scan).ExclusiveSum(x, pre, agg);
        if (w < nwords) rank_w[w] = carry + pre;
        carry += agg;
        __syncthreads();
      }
    };
    scan_words(eq_w);
    for (int w = warp; w < nwords; w += kThreads / 32) {
      const uint32_t eqm = eq_w[w];
      const bool take = (eqm >> lane & 1u) && rank_w[w] + __popc(eqm & lt) < uint32_t(need_eq);
      const uint32_t tm = __ballot_sync(kFull, take);
      if (lane == 0) kept_w[w] |= tm;
    }
    __syncthreads();
    scan_words(kept_w);
    // a[] is free now: the kept groups in order, then every thread writes pages.
    int32_t* grp = reinterpret_cast<int32_t*>(a);
    for (int w = warp; w < nwords; w += kThreads / 32) {
      const uint32_t km = kept_w[w];
      if (km >> lane & 1u) grp[rank_w[w] + __popc(km & lt)] = w * 32 + lane;
    }
    __syncthreads();
    const int base = (r.m + r.F) * S;
    for (int i = threadIdx.x; i < base; i += kThreads) put(i, grp[i / S] * S + i % S);
    for (int i = threadIdx.x; i < r.n_pages - r.C * S; i += kThreads) put(base + i, r.C * S + i);
    listed = base + r.n_pages - r.C * S;
  }
  for (int i = listed + threadIdx.x; i < L; i += kThreads) {
    map[i] = -1;
    if (blk) blk[i] = -1;
  }
  if (h == 0 && threadIdx.x == 0) list_lens[b] = listed == 0 ? 0 : r.len - (r.n_pages - listed) * P;
}

// Selected list positions -> logical pages, in place (one block per (sequence, KV head)).
__global__ void map_positions_kernel(const int32_t* page_map, int L, int32_t* pages,
                                     const int32_t* counts, int cap) {
  const int64_t row = blockIdx.x;
  const int n = min(max(counts[row], 0), cap);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t x = pages[row * cap + i];
    pages[row * cap + i] = x >= 0 && x < L ? page_map[row * L + x] : -1;
  }
}

}  // namespace

size_t select_groups_list_smem(int max_groups) {
  return sizeof(float) * (size_t(max_groups) + kMaxGroup) + 3 * 4 * size_t((max_groups + 31) / 32) +
         size_t(max_groups);
}

void prepare_super_kernels() {
  LOCKS_CUDA_CHECK(cudaFuncSetAttribute(select_groups_list_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kListSmemMax));
}

int max_list_groups() {
  // 4 + 1 bytes a group, 12 bytes per 32 groups.
  return int((kListSmemMax - sizeof(float) * kMaxGroup - 64) / (5.0 + 12.0 / 32)) / 32 * 32;
}

void launch_select_groups_list(const float* gh, int MG, const BatchView& batch, int Hq, int H,
                               int P, int S, const SelectConfig& sel, const TwoLevelConfig& cfg,
                               int L, int32_t* page_map, int32_t* list_lens, int32_t* list_blocks,
                               cudaStream_t st) {
  LOCKS_REQUIRE(MG <= max_list_groups(), "select_groups_list: ", MG,
                " groups a sequence, more than the kernel's ", max_list_groups());
  launch_kernel(select_groups_list_kernel, dim3(unsigned(H), unsigned(batch.batch_size)),
                dim3(kThreads), select_groups_list_smem(MG), st, gh, MG, batch.seq_lens,
                batch.max_blocks_per_seq, batch.block_table, batch.block_table_stride, Hq, H, P, S,
                sel, cfg, L, page_map, list_lens, list_blocks);
}

void launch_map_positions(const int32_t* page_map, int L, const Selection& sel, int64_t rows,
                          cudaStream_t st) {
  launch_kernel(map_positions_kernel, dim3(unsigned(rows)), dim3(128), 0, st, page_map, L,
                sel.pages, sel.counts, sel.capacity);
}

}  // namespace locks::cuda::detail

namespace locks::cuda {

void super_score(const SuperView& supers, const SuperTableView& table, const BatchView& batch,
                 const QueryView& q, float scale, const TwoLevelConfig& cfg,
                 float* group_head_scores, cudaStream_t stream) {
  const SuperLayout& l = supers.layout;
  validate_super_layout(l);
  validate_two_level(cfg);
  LOCKS_REQUIRE(!cfg.use_extent || l.extent, "use_extent needs a super layout with extent");
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.max_blocks_per_seq >= 1 && batch.seq_lens,
                "super_score: empty batch or null seq_lens");
  LOCKS_REQUIRE(q.q != nullptr && q.num_q_heads >= l.num_kv_heads &&
                    q.num_q_heads % l.num_kv_heads == 0 && dtype_known(q.dtype),
                "super_score: q is null, of an unknown dtype, or num_q_heads ", q.num_q_heads,
                " is not a multiple of num_kv_heads ", l.num_kv_heads);
  LOCKS_REQUIRE(std::isfinite(scale) && scale > 0.0f, "scale must be positive and finite");
  LOCKS_REQUIRE(group_head_scores != nullptr, "group_head_scores is null");
  LOCKS_REQUIRE(supers.mu_q && supers.mu_scale && supers.basis_q && supers.basis_scale &&
                    supers.coord_q && supers.coord_scale && supers.radius_q && supers.radius_scale,
                "super summary arrays are null");
  LOCKS_REQUIRE(!l.extent || (supers.lo_q && supers.hi_q && supers.extent_scale),
                "extent arrays are null");
  const int S = l.group_pages;
  LOCKS_REQUIRE(
      table.table != nullptr &&
          table.max_groups_per_seq >= (batch.max_blocks_per_seq + S - 1) / S &&
          table.stride >= table.max_groups_per_seq,
      "super table is null or holds ", table.max_groups_per_seq,
      " groups, need ceil(max_blocks_per_seq / S) = ", (batch.max_blocks_per_seq + S - 1) / S);
  LOCKS_REQUIRE(q.stride == 0 || q.stride >= int64_t(q.num_q_heads) * l.head_dim,
                "super_score: q.stride ", q.stride, " is below num_q_heads * head_dim");
  detail::launch_super_score(supers, table, batch, detail::q_in(q, l.head_dim), q.num_q_heads,
                             scale, cfg, group_head_scores, stream);
}

void select_groups_list(const float* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens, cudaStream_t stream) {
  validate_select(sel, page_size);
  validate_two_level(cfg);
  LOCKS_REQUIRE(group_pages >= 2 && group_pages <= 256, "group_pages must be in [2, 256], got ",
                group_pages);
  LOCKS_REQUIRE(num_kv_heads >= 1 && num_q_heads >= num_kv_heads &&
                    num_q_heads % num_kv_heads == 0 &&
                    num_q_heads / num_kv_heads <= detail::kMaxGroup,
                "num_q_heads (", num_q_heads, ") must be a multiple of num_kv_heads (",
                num_kv_heads, "), group <= ", detail::kMaxGroup);
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.max_blocks_per_seq >= 1 && batch.seq_lens,
                "select_groups_list: empty batch or null seq_lens");
  LOCKS_REQUIRE(group_head_scores && page_map && list_lens, "null argument");
  const int S = group_pages, MG = table.max_groups_per_seq;
  LOCKS_REQUIRE(
      MG >= (batch.max_blocks_per_seq + S - 1) / S, "super table holds ", MG,
      " groups, need ceil(max_blocks_per_seq / S) = ", (batch.max_blocks_per_seq + S - 1) / S);
  LOCKS_REQUIRE(
      list_cap >= two_level_list_capacity(cfg, sel, page_size, S, batch.max_blocks_per_seq),
      "list_cap ", list_cap, " < two_level_list_capacity ",
      two_level_list_capacity(cfg, sel, page_size, S, batch.max_blocks_per_seq));
  static const bool prepared = (detail::prepare_super_kernels(), true);
  (void)prepared;
  detail::launch_select_groups_list(group_head_scores, MG, batch, num_q_heads, num_kv_heads,
                                    page_size, S, sel, cfg, list_cap, page_map, list_lens, nullptr,
                                    stream);
}

}  // namespace locks::cuda

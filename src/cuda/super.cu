// The two-level step's own kernels (super_summary.h, decode_two_level in decoder.cu):
//   super_score: level 1, one warp per (sequence, KV head, group), the group's codes read
//     once into registers and scored for the G query heads of the KV head;
//   select_groups_list: the group choice as a page list, one block per (sequence, KV head):
//     share-averaging over the G heads, the m best non-forced groups by the radix threshold
//     and stable compaction of select_common.cuh (ties to the lower index), then the list
//     of the kept groups' pages (ascending) and the open group; optionally the listed
//     pages' block ids (the level-2 scorer's per-head block table);
//   map_positions: the selection over list positions back to logical pages.
// The rules (forced groups, kept count, fallbacks) restate super_layout.cpp's on the device.
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/super_summary.h"
#include "select_common.cuh"
#include "super.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kSuperWarps = 8;
constexpr int kListSmemMax = 160 * 1024;

struct SupArrays {  // the super summary arrays, by value for kernels
  const int8_t* mu_q;
  const float* mu_scale;
  const uint8_t* basis_q;
  const float* basis_scale;
  const int8_t* coord_q;
  const float* coord_scale;
  const uint8_t* radius_q;
  const float* radius_scale;
  const int8_t* lo_q;
  const int8_t* hi_q;
  const float* extent_scale;
  int64_t num_slots;
};

SupArrays sup_arrays(const SuperView& s) {
  return {s.mu_q,     s.mu_scale,     s.basis_q, s.basis_scale, s.coord_q,      s.coord_scale,
          s.radius_q, s.radius_scale, s.lo_q,    s.hi_q,        s.extent_scale, s.layout.num_slots};
}

// Level 1. RM: the most basis rows (R <= RM), NP: the most dim pairs a lane holds
// (d / 2 <= 32 NP), PL: the most pages a lane holds (S <= 32 PL). mode: 0 centroid,
// 1 extent, 2 mixed.
template <int RM, int NP, int PL>
__global__ void __launch_bounds__(kSuperWarps * 32)
    super_score_kernel(SupArrays A, int H, int d, int R, int S, int P, const int32_t* table,
                       int64_t t_stride, int MG, const int32_t* seq_lens, int M,
                       const float* __restrict__ q, int Hq, float scale, int mode, bool lse,
                       float gamma, float* out) {
  extern __shared__ float4 sm4[];
  float* qs = reinterpret_cast<float*>(sm4);  // [G][d]
  const int h = blockIdx.y, b = blockIdx.z, G = Hq / H;
  float* q2 = qs + G * d;  // [G] |q|^2
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int e = threadIdx.x; e < G * d; e += blockDim.x)
    qs[e] = q[(int64_t(b) * Hq + int64_t(h) * G) * d + e];
  __syncthreads();
  for (int g = warp; g < G; g += kSuperWarps) {
    float x = 0.0f;
    for (int c = lane; c < d; c += 32) x = fmaf(qs[g * d + c], qs[g * d + c], x);
    x = warp_sum(x);
    if (lane == 0) q2[g] = x;
  }
  __syncthreads();
  const int j = blockIdx.x * kSuperWarps + warp;
  if (j >= MG) return;
  // Untrusted device values (docs/bad_input.md): an invalid length has no complete group,
  // an invalid slot scores -inf.
  const int len = seq_lens[b];
  const int C = len >= 1 && len <= M * P ? (len / P) / S : 0;
  float* dst = out + (int64_t(b) * Hq + int64_t(h) * G) * MG + j;
  const int32_t slot = j < C ? table[int64_t(b) * t_stride + j] : -1;
  if (j >= C || slot < 0 || slot >= A.num_slots) {
    for (int g = lane; g < G; g += 32) dst[int64_t(g) * MG] = kNegInf;
    return;
  }
  const int64_t gh = int64_t(slot) * H + h;
  // The group's codes in registers: lane owns dim pairs e = lane + 32 i and pages
  // p = lane + 32 t.
  float mu[NP][2], bs[RM][NP][2];
#pragma unroll
  for (int i = 0; i < NP; ++i) {
    const int e = lane + 32 * i;
    const bool ok = e < d / 2;
    mu[i][0] = ok ? float(A.mu_q[gh * d + 2 * e]) : 0.0f;
    mu[i][1] = ok ? float(A.mu_q[gh * d + 2 * e + 1]) : 0.0f;
#pragma unroll
    for (int k = 0; k < RM; ++k) {
      const uint8_t byte = (ok && k < R) ? A.basis_q[(gh * R + k) * (d / 2) + e] : uint8_t(0);
      bs[k][i][0] = float(int(int8_t(uint8_t(byte << 4))) >> 4);
      bs[k][i][1] = float(int(int8_t(byte)) >> 4);
    }
  }
  const float mu_sc = A.mu_scale[gh];
  float bsc[RM];
#pragma unroll
  for (int k = 0; k < RM; ++k) bsc[k] = k < R ? A.basis_scale[gh * R + k] : 0.0f;
  // Per page: hi / lo (extent) or coordinates (centroid), dequantized; radius.
  float hi[PL][RM], lo[PL][RM], co[PL][RM], rad[PL];
#pragma unroll
  for (int t = 0; t < PL; ++t) {
    const int p = lane + 32 * t;
    const bool ok = p < S;
    rad[t] = ok ? float(A.radius_q[gh * S + p]) * A.radius_scale[gh] : 0.0f;
#pragma unroll
    for (int k = 0; k < RM; ++k) {
      const bool okk = ok && k < R;
      const int64_t i = (gh * S + p) * R + k;
      co[t][k] = okk && mode != 1 ? float(A.coord_q[i]) * A.coord_scale[gh * R + k] : 0.0f;
      const float es = okk && mode != 0 ? A.extent_scale[gh * R + k] : 0.0f;
      hi[t][k] = okk && mode != 0 ? float(A.hi_q[i]) * es : 0.0f;
      lo[t][k] = okk && mode != 0 ? float(A.lo_q[i]) * es : 0.0f;
    }
  }
  const float logP = logf(float(P));
  for (int g = 0; g < G; ++g) {
    const float* qg = qs + g * d;
    float pm = 0.0f, pw[RM];
#pragma unroll
    for (int k = 0; k < RM; ++k) pw[k] = 0.0f;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int e = lane + 32 * i;
      if (e < d / 2) {
        const float2 qv = *reinterpret_cast<const float2*>(qg + 2 * e);
        pm = fmaf(mu[i][0], qv.x, fmaf(mu[i][1], qv.y, pm));
#pragma unroll
        for (int k = 0; k < RM; ++k)
          pw[k] = fmaf(bs[k][i][0], qv.x, fmaf(bs[k][i][1], qv.y, pw[k]));
      }
    }
    const float qM = warp_sum(pm) * mu_sc;
    float w2 = 0.0f;
#pragma unroll
    for (int k = 0; k < RM; ++k) {
      pw[k] = k < R ? warp_sum(pw[k]) * bsc[k] : 0.0f;
      w2 = fmaf(pw[k], pw[k], w2);
    }
    const float gq = gamma * sqrtf(fmaxf(q2[g] - w2, 0.0f));
    float est[PL], mx = kNegInf;
#pragma unroll
    for (int t = 0; t < PL; ++t) {
      est[t] = kNegInf;
      if (lane + 32 * t < S) {
        const float base = qM + gq * rad[t];
        float cen = base, ext = base;
#pragma unroll
        for (int k = 0; k < RM; ++k) {
          cen = fmaf(pw[k], co[t][k], cen);
          ext += fmaxf(pw[k] * hi[t][k], pw[k] * lo[t][k]);
        }
        if (mode == 0) {
          est[t] = logP + scale * cen;
        } else if (mode == 1) {
          est[t] = logP + scale * ext;
        } else {  // log(P e^{scale cen} + e^{scale ext}), shifted by the larger term
          const float a = logP + scale * cen, c = scale * ext, top = fmaxf(a, c);
          est[t] = top + logf(expf(a - top) + expf(c - top));
        }
      }
      mx = fmaxf(mx, est[t]);
    }
    mx = warp_max(mx);
    float score = mx;
    if (lse) {
      float s = 0.0f;
#pragma unroll
      for (int t = 0; t < PL; ++t) s += lane + 32 * t < S ? expf(est[t] - mx) : 0.0f;
      score = mx + logf(warp_sum(s));
    }
    if (lane == 0) dst[int64_t(g) * MG] = score;
  }
}

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
  if (r.len == 0 || rules::selects_all(sel.budget_tokens, r.len) || r.C < cfg.flat_below_groups)
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
  float* a = reinterpret_cast<float*>(dyn);                     // [MG] share-averaged scores
  float* lse = a + MG;                                          // [G]
  uint8_t* keep = reinterpret_cast<uint8_t*>(lse + kMaxGroup);  // [MG]
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
    // Each head's log-sum-exp over the complete groups (one warp a head).
    for (int g = threadIdx.x >> 5; g < G; g += kThreads / 32) {
      const float* s = s0 + int64_t(g) * MG;
      float mx = kNegInf;
      for (int j = threadIdx.x & 31; j < r.C; j += 32) mx = fmaxf(mx, s[j]);
      mx = warp_max(mx);
      float t = 0.0f;
      if (mx != kNegInf)
        for (int j = threadIdx.x & 31; j < r.C; j += 32) t += expf(s[j] - mx);
      t = warp_sum(t);
      if ((threadIdx.x & 31) == 0) lse[g] = mx == kNegInf ? kNegInf : mx + logf(t);
    }
    __syncthreads();
    // a_j = log((1/G) sum_h exp(s_hj - LSE_h)) (score.h's rule on groups).
    const float log_g = logf(float(G));
    for (int j = threadIdx.x; j < r.C; j += kThreads) {
      float mx = kNegInf;
      for (int g = 0; g < G; ++g)
        if (lse[g] != kNegInf) mx = fmaxf(mx, s0[int64_t(g) * MG + j] - lse[g]);
      float t = 0.0f;
      if (mx != kNegInf)
        for (int g = 0; g < G; ++g)
          if (lse[g] != kNegInf) t += expf(s0[int64_t(g) * MG + j] - lse[g] - mx);
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
    // Flags written after the compaction's reads of keep (into a[] as a marker: a kept
    // non-forced group gets +inf, which no share-averaged score reaches).
    compact(key_of, r.C, false, T, need_eq, sm,
            [&](int e, int) { a[e] = __int_as_float(0x7f800000); });
    __syncthreads();
    for (int j = threadIdx.x; j < r.C; j += kThreads)
      if (a[j] == __int_as_float(0x7f800000)) keep[j] = 1;
    __syncthreads();
    // The kept groups' pages in ascending order, then the open group and the tail.
    auto kept_of = [&](int e, bool& valid) {
      valid = e < r.C && keep[e];
      return 0u;
    };
    compact(kept_of, r.C, true, 0u, 0, sm, [&](int e, int pos) {
      for (int p = 0; p < S; ++p) put(pos * S + p, e * S + p);
    });
    const int base = (r.m + r.F) * S;
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

template <int RM, int NP, int PL>
void launch_super_t(const SuperView& s, const SuperTableView& t, const BatchView& batch,
                    const float* q, int Hq, float scale, const TwoLevelConfig& cfg, float* out,
                    cudaStream_t st) {
  const SuperLayout& l = s.layout;
  const int H = l.num_kv_heads, G = Hq / H, MG = t.max_groups_per_seq;
  const size_t smem = sizeof(float) * (size_t(G) * l.head_dim + G);
  const int mode = !cfg.use_extent ? 0 : cfg.mix ? 2 : 1;
  const dim3 grid(unsigned(ceil_div(MG, kSuperWarps)), unsigned(H), unsigned(batch.batch_size));
  launch_kernel(super_score_kernel<RM, NP, PL>, grid, dim3(kSuperWarps * 32), smem, st,
                sup_arrays(s), H, l.head_dim, l.rank, l.group_pages, l.page_size, t.table, t.stride,
                MG, batch.seq_lens, batch.max_blocks_per_seq, q, Hq, scale, mode,
                cfg.agg == GroupAgg::lse, float(cfg.gamma), out);
}

}  // namespace

bool super_score_supported(const SuperLayout& l, int group) {
  return l.group_pages <= 64 && group >= 1 && group <= kMaxGroup &&
         ((l.rank <= 8 && l.head_dim <= 256) || (l.rank <= 16 && l.head_dim <= 128));
}

void launch_super_score(const SuperView& s, const SuperTableView& t, const BatchView& batch,
                        const float* q, int Hq, float scale, const TwoLevelConfig& cfg, float* out,
                        cudaStream_t st) {
  const SuperLayout& l = s.layout;
  LOCKS_REQUIRE(super_score_supported(l, Hq / l.num_kv_heads), "CUDA super_score: rank ", l.rank,
                ", head_dim ", l.head_dim, ", S ", l.group_pages, " unsupported");
  const bool two_pl = l.group_pages > 32;
  if (l.rank <= 8 && l.head_dim <= 128) {
    if (two_pl)
      launch_super_t<8, 2, 2>(s, t, batch, q, Hq, scale, cfg, out, st);
    else
      launch_super_t<8, 2, 1>(s, t, batch, q, Hq, scale, cfg, out, st);
  } else if (l.rank <= 8) {
    if (two_pl)
      launch_super_t<8, 4, 2>(s, t, batch, q, Hq, scale, cfg, out, st);
    else
      launch_super_t<8, 4, 1>(s, t, batch, q, Hq, scale, cfg, out, st);
  } else {
    if (two_pl)
      launch_super_t<16, 2, 2>(s, t, batch, q, Hq, scale, cfg, out, st);
    else
      launch_super_t<16, 2, 1>(s, t, batch, q, Hq, scale, cfg, out, st);
  }
}

size_t select_groups_list_smem(int max_groups) {
  return sizeof(float) * (size_t(max_groups) + kMaxGroup) + size_t(max_groups);
}

void prepare_super_kernels() {
  LOCKS_CUDA_CHECK(cudaFuncSetAttribute(select_groups_list_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, kListSmemMax));
}

int max_list_groups() {
  return int((kListSmemMax - sizeof(float) * kMaxGroup) / (sizeof(float) + 1)) / 16 * 16;
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
  LOCKS_REQUIRE(
      q.q != nullptr && q.num_q_heads >= l.num_kv_heads && q.num_q_heads % l.num_kv_heads == 0,
      "super_score: q is null or num_q_heads ", q.num_q_heads,
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
  detail::launch_super_score(supers, table, batch, q.q, q.num_q_heads, scale, cfg,
                             group_head_scores, stream);
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

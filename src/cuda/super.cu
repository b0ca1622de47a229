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

constexpr int kSuperWarps = 8;
constexpr int kMaxGpw = 4;  // most groups a level-1 warp scores
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

// Sum over the warp of V = 2^n values per lane, scattered: lane l returns the full sum of
// value l >> (5 - n). The first n butterfly levels each halve the values a lane keeps (a
// lane sends the half its partner keeps), the rest reduce one value: V - 1 + 5 - n
// shuffles instead of 5 V for V separate reductions.
template <int V, int HALF, int OFF, bool MAX>
__device__ __forceinline__ void scatter_level(float (&v)[V], int lane) {
  const bool up = lane & OFF;
#pragma unroll
  for (int i = 0; i < HALF; ++i) {
    const float send = up ? v[i] : v[i + HALF];
    const float keep = up ? v[i + HALF] : v[i];
    const float got = __shfl_xor_sync(kFull, send, OFF);
    v[i] = MAX ? fmaxf(keep, got) : keep + got;
  }
  if constexpr (HALF > 1) scatter_level<V, HALF / 2, OFF / 2, MAX>(v, lane);
}
template <int V, bool MAX>
__device__ __forceinline__ float scatter_reduce(float (&v)[V], int lane) {
  if constexpr (V > 1) scatter_level<V, V / 2, 16, MAX>(v, lane);
  float x = v[0];
#pragma unroll
  for (int off = 16 / V; off >= 1; off /= 2) {
    const float got = __shfl_xor_sync(kFull, x, off);
    x = MAX ? fmaxf(x, got) : x + got;
  }
  return x;
}
template <int V>
__device__ __forceinline__ float reduce_scatter(float (&v)[V], int lane) {
  return scatter_reduce<V, false>(v, lane);
}
template <int V>
__device__ __forceinline__ float max_scatter(float (&v)[V], int lane) {
  return scatter_reduce<V, true>(v, lane);
}

// Level 1. RM: basis rows held (R <= RM, 8 or 16), HC = 32 / RM query heads a pass (the
// HC x RM dot products of a pass are one 32-value reduce-scatter), NP: dim pairs a lane
// holds (d / 2 <= 32 NP), PL: pages a lane holds (S <= 32 PL), MODE: 0 centroid, 1 extent,
// 2 mixed. One warp per (group, KV head, sequence): the group's codes are read once into
// registers; per pass the dots (q.M, W q) of HC heads, then each lane's pages' estimates
// and the group log-sum-exps (or max) of the HC heads, again by scattered reductions.
template <int RM, int NP, int PL, int MODE>
__global__ void __launch_bounds__(kSuperWarps * 32, 2)
    super_score_kernel(SupArrays A, int H, int d, int R, int S, int P, const int32_t* table,
                       int64_t t_stride, int MG, const int32_t* seq_lens, int M, QIn q, int Hq,
                       float scale, bool lse, float gamma, float* out, int gpw) {
  constexpr int HC = 32 / RM;
  extern __shared__ float4 sm4[];
  const int h = blockIdx.y, b = blockIdx.z, G = Hq / H;
  const int GP = (G + HC - 1) / HC * HC;      // heads padded to whole passes (zero queries)
  float* qs = reinterpret_cast<float*>(sm4);  // [GP][d]
  float* q2 = qs + GP * d;                    // [GP] |q|^2
  float* wsm = q2 + GP;                       // per warp: [HC][RM] w, [HC] q.M, [HC] max
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* ww = wsm + warp * (32 + 2 * HC);
  for (int e = threadIdx.x; e < GP * d; e += blockDim.x)
    qs[e] = e < G * d ? load_q(q, int64_t(b) * q.stride + int64_t(h) * G * d + e) : 0.0f;
  __syncthreads();
  for (int g = warp; g < GP; g += kSuperWarps) {
    float x = 0.0f;
    for (int c = lane; c < d; c += 32) x = fmaf(qs[g * d + c], qs[g * d + c], x);
    x = warp_sum(x);
    if (lane == 0) q2[g] = x;
  }
  __syncthreads();
  // Untrusted device values (docs/bad_input.md): an invalid length has no complete group,
  // an invalid slot scores -inf.
  const int len = seq_lens[b];
  const int C = len >= 1 && len <= M * P ? (len / P) / S : 0;
  // gpw groups a warp (the block's query staging paid once for all), their slots loaded
  // together up front.
  int32_t slots[kMaxGpw];
#pragma unroll
  for (int it = 0; it < kMaxGpw; ++it) {
    const int j = (blockIdx.x * gpw + it) * kSuperWarps + warp;
    slots[it] = it < gpw && j < C ? table[int64_t(b) * t_stride + j] : -1;
  }
#pragma unroll 1
  for (int it = 0; it < gpw; ++it) {
    const int j = (blockIdx.x * gpw + it) * kSuperWarps + warp;
    if (j >= MG) break;
    float* dst = out + (int64_t(b) * Hq + int64_t(h) * G) * MG + j;
    int32_t slot = slots[0];
#pragma unroll
    for (int x = 1; x < kMaxGpw; ++x)
      if (x == it) slot = slots[x];
    if (j >= C || slot < 0 || slot >= A.num_slots) {
      for (int g = lane; g < G; g += 32) dst[int64_t(g) * MG] = kNegInf;
      continue;
    }
    const int64_t gh = int64_t(slot) * H + h;
    // The group's codes in registers: lane owns dim pairs e = lane + 32 i and pages
    // p = lane + 32 t; scales folded in after the reductions.
    // The basis codes stay packed (byte i of bsp[k] = dims 2e, 2e + 1 of row k), decoded once
    // a pass: unpacked floats took 32 more registers, which halved the resident warps.
    float mu[NP][2];
    uint32_t bsp[RM];
#pragma unroll
    for (int k = 0; k < RM; ++k) bsp[k] = 0;
#pragma unroll
    for (int i = 0; i < NP; ++i) {
      const int e = lane + 32 * i;
      const bool ok = e < d / 2;
      const char2 m2 = ok ? *reinterpret_cast<const char2*>(A.mu_q + gh * d + 2 * e) : char2{0, 0};
      mu[i][0] = float(m2.x);
      mu[i][1] = float(m2.y);
#pragma unroll
      for (int k = 0; k < RM; ++k) {
        const uint32_t byte = (ok && k < R) ? A.basis_q[(gh * R + k) * (d / 2) + e] : 0u;
        bsp[k] |= byte << (8 * i);
      }
    }
    const float mu_sc = A.mu_scale[gh];
    const float bsc = lane % RM < R ? A.basis_scale[gh * R + lane % RM] : 0.0f;  // lane's row
    float e1[PL][RM], e2[PL][RM], rad[PL];  // extent: hi, lo; centroid: coordinates in e1
#pragma unroll
    for (int t = 0; t < PL; ++t) {
      const int p = lane + 32 * t;
      const bool ok = p < S;
      rad[t] = ok ? float(A.radius_q[gh * S + p]) * A.radius_scale[gh] : 0.0f;
#pragma unroll
      for (int k = 0; k < RM; ++k) {
        const bool okk = ok && k < R;
        const int64_t i = (gh * S + p) * R + k;
        if (MODE == 0) {
          e1[t][k] = okk ? float(A.coord_q[i]) * A.coord_scale[gh * R + k] : 0.0f;
          e2[t][k] = 0.0f;
        } else {
          const float es = okk ? A.extent_scale[gh * R + k] : 0.0f;
          e1[t][k] = okk ? float(A.hi_q[i]) * es : 0.0f;
          e2[t][k] = okk ? float(A.lo_q[i]) * es : 0.0f;
        }
      }
    }
    float cf[PL][MODE == 2 ? RM : 1];  // mixed mode: the coordinates too
#pragma unroll
    for (int t = 0; t < PL; ++t)
#pragma unroll
      for (int k = 0; k < (MODE == 2 ? RM : 1); ++k) {
        const int p = lane + 32 * t;
        cf[t][k] = MODE == 2 && p < S && k < R
                       ? float(A.coord_q[(gh * S + p) * R + k]) * A.coord_scale[gh * R + k]
                       : 0.0f;
      }
    const float logP = logf(float(P));
    for (int g0 = 0; g0 < GP; g0 += HC) {
      // Dots of HC heads: v[hh * RM + k] = W_k . q, u[hh] = M . q (lane partials).
      float v[32], u[HC];
#pragma unroll
      for (int x = 0; x < 32; ++x) v[x] = 0.0f;
#pragma unroll
      for (int hh = 0; hh < HC; ++hh) u[hh] = 0.0f;
#pragma unroll
      for (int i = 0; i < NP; ++i) {
        const int e = lane + 32 * i;
        if (e < d / 2) {
          float2 qv[HC];
#pragma unroll
          for (int hh = 0; hh < HC; ++hh) {
            qv[hh] = *reinterpret_cast<const float2*>(qs + (g0 + hh) * d + 2 * e);
            u[hh] = fmaf(mu[i][0], qv[hh].x, fmaf(mu[i][1], qv[hh].y, u[hh]));
          }
#pragma unroll
          for (int k = 0; k < RM; ++k) {
            const int word = int(bsp[k] >> (8 * i));
            const float lo = float((word << 28) >> 28), hi = float((word << 24) >> 28);
#pragma unroll
            for (int hh = 0; hh < HC; ++hh)
              v[hh * RM + k] = fmaf(lo, qv[hh].x, fmaf(hi, qv[hh].y, v[hh * RM + k]));
          }
        }
      }
      const float wl = reduce_scatter<32>(v, lane) * bsc;  // w of (head lane / RM, row lane % RM)
      const float ul = reduce_scatter<HC>(u, lane) * mu_sc;
      __syncwarp();
      ww[lane] = wl;
      if ((lane & (32 / HC - 1)) == 0) ww[32 + lane / (32 / HC)] = ul;
      __syncwarp();
      // Each lane's pages under the HC heads.
      float est[HC][PL], mx[HC];
#pragma unroll
      for (int hh = 0; hh < HC; ++hh) {
        const float* w = ww + hh * RM;
        float w2 = 0.0f;
#pragma unroll
        for (int k = 0; k < RM; ++k) w2 = fmaf(w[k], w[k], w2);
        const float qM = ww[32 + hh];
        const float gq = gamma * sqrtf(fmaxf(q2[g0 + hh] - w2, 0.0f));
        mx[hh] = kNegInf;
#pragma unroll
        for (int t = 0; t < PL; ++t) {
          est[hh][t] = kNegInf;
          if (lane + 32 * t < S) {
            const float base = qM + gq * rad[t];
            float x = base, c = base;
#pragma unroll
            for (int k = 0; k < RM; ++k) {
              if (MODE == 0) {
                x = fmaf(w[k], e1[t][k], x);
              } else {
                x += fmaxf(w[k] * e1[t][k], w[k] * e2[t][k]);
                if (MODE == 2) c = fmaf(w[k], cf[t][k], c);
              }
            }
            if (MODE != 2) {
              est[hh][t] = logP + scale * x;
            } else {  // log(P e^{scale cen} + e^{scale ext}), shifted by the larger term
              const float a = logP + scale * c, z = scale * x, top = fmaxf(a, z);
              est[hh][t] = top + logf(expf(a - top) + expf(z - top));
            }
          }
          mx[hh] = fmaxf(mx[hh], est[hh][t]);
        }
      }
      float ml = max_scatter<HC>(mx, lane);  // the max of head lane / (32 / HC)
      float res = ml;
      if (lse) {
        __syncwarp();
        if ((lane & (32 / HC - 1)) == 0) ww[32 + HC + lane / (32 / HC)] = ml;
        __syncwarp();
        float sum[HC];
#pragma unroll
        for (int hh = 0; hh < HC; ++hh) {
          const float m = ww[32 + HC + hh];
          sum[hh] = 0.0f;
#pragma unroll
          for (int t = 0; t < PL; ++t) sum[hh] += lane + 32 * t < S ? expf(est[hh][t] - m) : 0.0f;
        }
        res = ml + logf(reduce_scatter<HC>(sum, lane));
      }
      const int hh = lane / (32 / HC);
      if ((lane & (32 / HC - 1)) == 0 && g0 + hh < G) dst[int64_t(g0 + hh) * MG] = res;
      __syncwarp();
    }
  }  // groups of the warp
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

template <int RM, int NP, int PL>
void launch_super_t(const SuperView& s, const SuperTableView& t, const BatchView& batch, QIn q,
                    int Hq, float scale, const TwoLevelConfig& cfg, float* out, cudaStream_t st) {
  const SuperLayout& l = s.layout;
  constexpr int HC = 32 / RM;
  const int H = l.num_kv_heads, G = Hq / H, MG = t.max_groups_per_seq;
  const int GP = (G + HC - 1) / HC * HC;
  const size_t smem =
      sizeof(float) * (size_t(GP) * l.head_dim + GP + size_t(kSuperWarps) * (32 + 2 * HC));
  const int mode = !cfg.use_extent ? 0 : cfg.mix ? 2 : 1;
  // Groups a warp: enough blocks for ~2 waves of 2 blocks an SM (132 SMs assumed; only the
  // grid shape depends on it), at most kMaxGpw.
  const int64_t warps = int64_t(ceil_div(MG, kSuperWarps)) * kSuperWarps * H * batch.batch_size;
  const int gpw =
      int(std::clamp<int64_t>(warps / (int64_t(132) * 2 * kSuperWarps * 2), 1, kMaxGpw));
  const dim3 grid(unsigned(ceil_div(MG, kSuperWarps * gpw)), unsigned(H),
                  unsigned(batch.batch_size));
  auto go = [&](auto kernel) {
    launch_kernel(kernel, grid, dim3(kSuperWarps * 32), smem, st, sup_arrays(s), H, l.head_dim,
                  l.rank, l.group_pages, l.page_size, t.table, t.stride, MG, batch.seq_lens,
                  batch.max_blocks_per_seq, q, Hq, scale, cfg.agg == GroupAgg::lse,
                  float(cfg.gamma), out, gpw);
  };
  if (mode == 0)
    go(super_score_kernel<RM, NP, PL, 0>);
  else if (mode == 1)
    go(super_score_kernel<RM, NP, PL, 1>);
  else
    go(super_score_kernel<RM, NP, PL, 2>);
}

}  // namespace

bool super_score_supported(const SuperLayout& l, int group) {
  return l.group_pages <= 64 && group >= 1 && group <= kMaxGroup &&
         ((l.rank <= 8 && l.head_dim <= 256) || (l.rank <= 16 && l.head_dim <= 128));
}

void launch_super_score(const SuperView& s, const SuperTableView& t, const BatchView& batch, QIn q,
                        int Hq, float scale, const TwoLevelConfig& cfg, float* out,
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

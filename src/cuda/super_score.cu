// Level 1 of the two-level step (super_summary.h, decode_two_level in decoder.cu): the score
// of every complete group of S pages for each query head, from the super summaries alone,
// with cpu::super_score's estimates (centroid, extent or mixed; LSE or max over the pages).
//
// One warp per (group, KV head, sequence), gpw groups a warp, about one wave of 2 blocks an
// SM. Per group (v25, docs/cuda_notes.md; the kernel before it held 4 dims a lane, summed 32
// partial dots a pass by shuffles, loaded bytes one at a time and waited for each group's
// codes: 41 us for 25 MB at Llama 1M batch 1):
//  - the next group's codes are loaded into registers while this one is scored (where the
//    registers allow; rank 16 with 64 pages and the mixed estimate still spills ~1.5 KB), with
//    16- / 8-byte loads where the rows and the arrays' addresses are aligned, bytes otherwise;
//  - the query's projections on the basis rows and on the centroid (W q, M q) run on the
//    tensor cores, 4 query heads a pass: mma.m16n8k16 with the int4 / int8 codes as fp16
//    (exact) and the query as fp16 hi + lo columns (about 22 bits; fp32 accumulation), the
//    same operand layout as score_mma's V q. A rows are the basis rows (gid, and gid + 8 at
//    rank 16) and, in the rows after them, the centroid split by word: row RM + v holds the
//    centroid's dims of word v of each lane (the rest zero), so its loads and conversions are
//    spread over the warp and M q is a sum over those rows;
//  - each lane scores its pages (lane + 32 t) under the 4 heads from the projected weights,
//    with the extent / coordinate scales folded into them (one multiply a weight instead of
//    one a page value), and the group log-sum-exps (or maxima) are scattered reductions.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "ptx.cuh"
#include "score_common.cuh"
#include "super.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kSuperWarps = 8;
constexpr int kMaxGpw = 8;  // most groups a warp scores
constexpr int kPass = 4;    // query heads a pass (an n-tile of hi / lo columns)

using MmaH = Mma<__half>;

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

// Sum (or max) over the warp of V = 2^n values per lane, scattered: lane l returns the full
// reduction of value l >> (5 - n). The first n butterfly levels each halve the values a lane
// keeps (a lane sends the half its partner keeps), the rest reduce one value: V - 1 + 5 - n
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

// Sum over the 8 lanes of a quad column (the lanes with this lane's tig).
__device__ __forceinline__ float column_sum(float x) {
  x += __shfl_xor_sync(kFull, x, 4);
  x += __shfl_xor_sync(kFull, x, 8);
  return x + __shfl_xor_sync(kFull, x, 16);
}

// N (even) 4-byte words of a row: bytes [off, off + 4 N), the words from n on zero and every
// byte from len on zero. align: the alignment of row + off (4, 8 or 16; then the n words lie
// inside the row and the widest loads it allows are used), or 0 (unknown: byte loads).
template <int N>
__device__ __forceinline__ void load_words(const uint8_t* row, int off, int len, int n, int align,
                                           uint32_t (&w)[N]) {
  static_assert(N % 2 == 0, "whole pairs of words");
  const uint8_t* p = row + off;
  if (align >= 4) {
    if constexpr (N % 4 == 0) {
      if (align >= 16) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
          if (i + 4 <= n) {
            const uint4 u = *reinterpret_cast<const uint4*>(p + 4 * i);
            w[i] = u.x, w[i + 1] = u.y, w[i + 2] = u.z, w[i + 3] = u.w;
          } else {
#pragma unroll
            for (int j = i; j < i + 4; ++j)
              w[j] = j < n ? *reinterpret_cast<const uint32_t*>(p + 4 * j) : 0u;
          }
        }
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < N; j += 2) {
      if (align >= 8 && j + 2 <= n) {
        const uint2 u = *reinterpret_cast<const uint2*>(p + 4 * j);
        w[j] = u.x, w[j + 1] = u.y;
      } else {
        w[j] = j < n ? *reinterpret_cast<const uint32_t*>(p + 4 * j) : 0u;
        w[j + 1] = j + 1 < n ? *reinterpret_cast<const uint32_t*>(p + 4 * (j + 1)) : 0u;
      }
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < N; ++i) {
    uint32_t x = 0;
    for (int b = 0; b < 4; ++b) {
      const int e = off + 4 * i + b;
      if (i < n && e < len) x |= uint32_t(row[e]) << (8 * b);
    }
    w[i] = x;
  }
}

// A lane's registers for one group: raw codes and the scales it applies. MT = basis rows a
// lane holds (gid, gid + 8); NW = words (8 dims) of a lane's dims, at most.
template <int RM, int NW, int PL, int MODE>
struct GroupRegs {
  static constexpr int MT = RM / 8, RW = RM / 4;
  uint32_t bw[MT][NW];                          // basis nibbles of rows gid + 8 m, the lane's dims
  uint32_t mw[2];                               // centroid bytes: word gid of the lane's dims
  uint32_t ew[PL][RW];                          // per page: hi (extent modes) or coordinates (0)
  uint32_t lw[PL][MODE == 0 ? 1 : RW];          // per page: lo (extent modes)
  uint32_t cw[PL][MODE == 2 ? RW : 1];          // per page: coordinates (mixed)
  uint32_t rad[PL];                             // per page: radius code
  float mu_sc, rsc, bsc[MT], esc[MT], csc[MT];  // scales (rows gid + 8 m; 0 past the rank)
};

struct GroupGeom {
  int d, KP, nw, R, S;  // KP: head dim rounded up to 32; nw = KP / 32 words a lane
  // Alignments (load_words) of a lane's basis words, centroid word and page rows.
  int a_basis, a_mu, a_rows;
};

template <int RM, int NW, int PL, int MODE>
__device__ __forceinline__ void load_group(GroupRegs<RM, NW, PL, MODE>& g, const SupArrays& A,
                                           int64_t gh, const GroupGeom& m, int lane) {
  constexpr int MT = RM / 8, RW = RM / 4;
  const int gid = lane >> 2, tig = lane & 3;
  const int row_bytes = m.d / 2;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const int k = gid + 8 * t;
    const bool ok = k < m.R;
    const uint8_t* row = A.basis_q + (gh * m.R + (ok ? k : 0)) * row_bytes;
    load_words<NW>(row, tig * (m.KP / 8), row_bytes, ok ? m.nw : 0, m.a_basis, g.bw[t]);
    g.bsc[t] = ok ? A.basis_scale[gh * m.R + k] : 0.0f;
    g.esc[t] = MODE != 0 && ok ? A.extent_scale[gh * m.R + k] : 0.0f;
    g.csc[t] = MODE != 1 && ok ? A.coord_scale[gh * m.R + k] : 0.0f;
  }
  {
    uint32_t w[2];
    const uint8_t* row = reinterpret_cast<const uint8_t*>(A.mu_q + gh * m.d);
    load_words<2>(row, tig * (m.KP / 4) + 8 * gid, m.d, gid < m.nw ? 2 : 0, m.a_mu, w);
    g.mw[0] = w[0], g.mw[1] = w[1];
  }
  g.mu_sc = A.mu_scale[gh];
  g.rsc = A.radius_scale[gh];
#pragma unroll
  for (int t = 0; t < PL; ++t) {
    const int p = lane + 32 * t;
    const bool ok = p < m.S;
    const int64_t off = (gh * m.S + (ok ? p : 0)) * m.R;
    const int n = ok ? RW : 0;
    auto rows = [&](const int8_t* base, uint32_t(&w)[RW]) {
      load_words<RW>(reinterpret_cast<const uint8_t*>(base + off), 0, m.R, n, m.a_rows, w);
    };
    rows(MODE == 0 ? A.coord_q : A.hi_q, g.ew[t]);
    if constexpr (MODE != 0) rows(A.lo_q, g.lw[t]);
    if constexpr (MODE == 2) rows(A.coord_q, g.cw[t]);
    g.rad[t] = ok ? A.radius_q[gh * m.S + p] : 0u;
  }
}

__device__ __forceinline__ float code_at(const uint32_t* w, int k) {
  return float(int8_t(w[k >> 2] >> (8 * (k & 3))));
}

// RM: basis rows held (R <= RM, 8 or 16); NW: words of 8 dims a lane (head dim <= 32 NW);
// PL: pages a lane (S <= 32 PL); MODE: 0 centroid, 1 extent, 2 mixed.
template <int RM, int NW, int PL, int MODE>
__global__ void __launch_bounds__(kSuperWarps * 32, 2)
    super_score_kernel(SupArrays A, int H, GroupGeom geo, int P, const int32_t* table,
                       int64_t t_stride, int MG, const int32_t* seq_lens, int M, QIn q, int Hq,
                       float scale, bool lse, float gamma, float* out, int gpw) {
  constexpr int MT = RM / 8;
  // The next group's codes are prefetched where the registers allow it (the page values as
  // floats, RM x PL x 2 or 3 of them, are the other large share): not at rank 16 with 64
  // pages, nor in the mixed mode at rank 16 or 64 pages.
  constexpr bool kPrefetch = RM * PL * (MODE == 2 ? 3 : 2) <= 32;
  extern __shared__ float4 sm4[];
  const int h = blockIdx.y, b = blockIdx.z, G = Hq / H;
  const int GP = (G + kPass - 1) / kPass * kPass;  // heads padded to whole passes (zero queries)
  const int KS = geo.KP / 16;                      // k-steps over the (padded) head dim
  // Shared memory: the query's B fragments [GP / 4][KS][32], per head its 2^e normaliser's
  // inverse and |q|^2, per warp the projected weights of a pass.
  uint2* bfr = reinterpret_cast<uint2*>(sm4);
  float* invf = reinterpret_cast<float*>(bfr + (GP / kPass) * KS * 32);
  float* q2 = invf + GP;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;
  float* wf = q2 + GP + warp * (kPass * (2 * RM + 3));  // [4][RM] extent (or centroid) weights
  float* wc = wf + kPass * RM;                          // [4][RM] coordinate weights (mixed)
  float* qm = wc + kPass * RM;                          // [4] q.M
  float* gq = qm + kPass;                               // [4] gamma |q_perp| radius scale
  float* mh = gq + kPass;                               // [4] the group max of each head

  // Untrusted device values (docs/bad_input.md): an invalid length has no complete group,
  // an invalid slot scores -inf.
  const int len = seq_lens[b];
  const int C = len >= 1 && len <= M * P ? (len / P) / geo.S : 0;
  int32_t slots[kMaxGpw];
#pragma unroll
  for (int it = 0; it < kMaxGpw; ++it) {
    const int j = (blockIdx.x * gpw + it) * kSuperWarps + warp;
    const int32_t s = it < gpw && j < C ? table[int64_t(b) * t_stride + j] : -1;
    slots[it] = s >= 0 && s < A.num_slots ? s : -1;
  }
  auto slot_of = [&](int it) {
    int32_t s = slots[0];
#pragma unroll
    for (int x = 1; x < kMaxGpw; ++x)
      if (x == it) s = slots[x];
    return s;
  };
  using Regs = GroupRegs<RM, NW, PL, MODE>;
  Regs cur, nxt;
  // The first group's codes are in flight while the query is staged.
  if (slots[0] >= 0) load_group(cur, A, int64_t(slots[0]) * H + h, geo, lane);

  // Per head: max |q| -> a power-of-two normaliser f (exact scaling into fp16's range), |q|^2.
  const int64_t qrow = int64_t(b) * q.stride + int64_t(h) * G * geo.d;
  for (int g = warp; g < GP; g += kSuperWarps) {
    float mx = 0.0f, s2 = 0.0f;
    for (int c = lane; c < geo.d; c += 32) {
      const float x = g < G ? load_q(q, qrow + int64_t(g) * geo.d + c) : 0.0f;
      mx = fmaxf(mx, fabsf(x));
      s2 = fmaf(x, x, s2);
    }
    mx = warp_max(mx);
    s2 = warp_sum(s2);
    if (lane == 0) invf[g] = 1.0f / pow2_normaliser(mx), q2[g] = s2;
  }
  __syncthreads();
  // B fragments: column n = gid of pass c is head 4 c + n / 2, hi (n even) or lo; register x
  // of k-step s holds dims (KP / 4) tig + 8 (ri / 4) + ri % 4 and + 4, ri = 2 s + x (the
  // dims of int4x8_to_half2's pairs over the lane's words).
  for (int e = threadIdx.x; e < (GP / kPass) * KS * 32; e += blockDim.x) {
    const int l = e & 31, s = (e >> 5) % KS, c = (e >> 5) / KS;
    const int g = kPass * c + (l >> 3), t = l & 3;
    const bool lo = (l >> 2) & 1;
    const float f = 1.0f / invf[g];
    auto qv = [&](int dim) {
      return g < G && dim < geo.d ? load_q(q, qrow + int64_t(g) * geo.d + dim) * f : 0.0f;
    };
    uint32_t r[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int ri = 2 * s + x;
      const int dim = (geo.KP / 4) * t + 8 * (ri / 4) + ri % 4;
      const float v0 = qv(dim), v1 = qv(dim + 4);
      r[x] = MmaH::pack(lo ? v0 - MmaH::round(v0) : v0, lo ? v1 - MmaH::round(v1) : v1);
    }
    bfr[e] = make_uint2(r[0], r[1]);
  }
  __syncthreads();

  const float logP = logf(float(P));
#pragma unroll 1
  for (int it = 0; it < gpw; ++it) {
    const int j = (blockIdx.x * gpw + it) * kSuperWarps + warp;
    if (j >= MG) break;
    const int32_t slot = slot_of(it);
    if constexpr (kPrefetch) {
      const int32_t next = it + 1 < gpw ? slot_of(it + 1) : -1;
      if (next >= 0) load_group(nxt, A, int64_t(next) * H + h, geo, lane);  // in flight below
    } else if (it > 0 && slot >= 0) {
      load_group(cur, A, int64_t(slot) * H + h, geo, lane);
    }
    float* dst = out + (int64_t(b) * Hq + int64_t(h) * G) * MG + j;
    if (slot < 0) {  // past the complete groups, or an invalid slot
      for (int g = lane; g < G; g += 32) dst[int64_t(g) * MG] = kNegInf;
      if constexpr (kPrefetch) cur = nxt;
      continue;
    }
    // The centroid word of this lane's row (gid < nw) as fp16 pairs; the page values.
    uint32_t mo[4];
    int8x8_to_half2(cur.mw[0], cur.mw[1], mo);
    // The page values as floats once a group where the registers allow (kPrefetch), else
    // converted where used (4 times: once a head of a pass).
    constexpr int KF = kPrefetch ? RM : 1;
    float e1[PL][KF], e2[PL][MODE == 0 ? 1 : KF], cf[PL][MODE == 2 ? KF : 1], rad[PL];
#pragma unroll
    for (int t = 0; t < PL; ++t) {
      rad[t] = float(cur.rad[t]);
      if constexpr (kPrefetch) {
#pragma unroll
        for (int k = 0; k < RM; ++k) {
          e1[t][k] = code_at(cur.ew[t], k);
          if constexpr (MODE != 0) e2[t][k] = code_at(cur.lw[t], k);
          if constexpr (MODE == 2) cf[t][k] = code_at(cur.cw[t], k);
        }
      }
    }
    auto E1 = [&](int t, int k) {
      if constexpr (kPrefetch)
        return e1[t][k];
      else
        return code_at(cur.ew[t], k);
    };
    auto E2 = [&](int t, int k) {
      if constexpr (MODE == 0)
        return 0.0f;
      else if constexpr (kPrefetch)
        return e2[t][k];
      else
        return code_at(cur.lw[t], k);
    };
    auto CF = [&](int t, int k) {
      if constexpr (MODE != 2)
        return 0.0f;
      else if constexpr (kPrefetch)
        return cf[t][k];
      else
        return code_at(cur.cw[t], k);
    };
    for (int c = 0; c < GP / kPass; ++c) {
      // W q (rows gid [, gid + 8]) and the centroid rows' share of M q, for heads 4 c + tig.
      float acc[MT == 1 ? 1 : 2][4] = {};
#pragma unroll
      for (int v = 0; v < NW; ++v) {
        if (v >= geo.nw) break;  // warp-uniform
        uint32_t ob[MT][4];
#pragma unroll
        for (int t = 0; t < MT; ++t) int4x8_to_half2(cur.bw[t][v], ob[t]);
        const bool mine = v == gid;  // this lane's centroid word
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const uint2 bf = bfr[(c * KS + 2 * v + kk) * 32 + lane];
          const uint32_t m0 = mine ? mo[2 * kk] : 0u, m1 = mine ? mo[2 * kk + 1] : 0u;
          if constexpr (MT == 1) {
            MmaH::run(acc[0], ob[0][2 * kk], m0, ob[0][2 * kk + 1], m1, bf.x, bf.y);
          } else {
            MmaH::run(acc[0], ob[0][2 * kk], ob[1][2 * kk], ob[0][2 * kk + 1], ob[1][2 * kk + 1],
                      bf.x, bf.y);
            MmaH::run(acc[1], m0, 0u, m1, 0u, bf.x, bf.y);
          }
        }
      }
      const int g = kPass * c + tig;
      const float inv = invf[g];
      float w[MT], w2 = 0.0f;
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const float a = t == 0 ? acc[0][0] + acc[0][1] : acc[0][2] + acc[0][3];
        w[t] = gid + 8 * t < geo.R ? a * inv * cur.bsc[t] : 0.0f;
        w2 = fmaf(w[t], w[t], w2);
      }
      const float qpart = MT == 1 ? acc[0][2] + acc[0][3] : acc[MT - 1][0] + acc[MT - 1][1];
      const float qM = column_sum(qpart) * inv * cur.mu_sc;
      w2 = column_sum(w2);
      __syncwarp();  // the previous pass's readers are done with wf / qm / gq / mh
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int k = gid + 8 * t;
        wf[tig * RM + k] = w[t] * (MODE == 0 ? cur.csc[t] : cur.esc[t]);
        if constexpr (MODE == 2) wc[tig * RM + k] = w[t] * cur.csc[t];
      }
      if (gid == 0) {
        qm[tig] = qM;
        gq[tig] = gamma * sqrtf(fmaxf(q2[g] - w2, 0.0f)) * cur.rsc;
      }
      __syncwarp();
      // Each lane's pages under the 4 heads (cpu::super_score's estimates).
      float est[kPass][PL], mx[kPass];
#pragma unroll
      for (int hh = 0; hh < kPass; ++hh) {
        const float* wh = wf + hh * RM;
        const float* ch = wc + hh * RM;
        mx[hh] = kNegInf;
#pragma unroll
        for (int t = 0; t < PL; ++t) {
          est[hh][t] = kNegInf;
          if (lane + 32 * t < geo.S) {
            const float base = qm[hh] + gq[hh] * rad[t];
            float x = base, cen = base;
#pragma unroll
            for (int k = 0; k < RM; ++k) {
              if constexpr (MODE == 0) {
                x = fmaf(wh[k], E1(t, k), x);
              } else {
                x += fmaxf(wh[k] * E1(t, k), wh[k] * E2(t, k));
                if constexpr (MODE == 2) cen = fmaf(ch[k], CF(t, k), cen);
              }
            }
            if constexpr (MODE != 2) {
              est[hh][t] = logP + scale * x;
            } else {  // log(P e^{scale cen} + e^{scale ext}), shifted by the larger term
              const float a = logP + scale * cen, z = scale * x, top = fmaxf(a, z);
              est[hh][t] = top + logf(expf(a - top) + expf(z - top));
            }
          }
          mx[hh] = fmaxf(mx[hh], est[hh][t]);
        }
      }
      const float ml = scatter_reduce<kPass, true>(mx, lane);  // the max of head lane / 8
      float res = ml;
      if (lse) {
        if ((lane & 7) == 0) mh[lane >> 3] = ml;
        __syncwarp();
        float sum[kPass];
#pragma unroll
        for (int hh = 0; hh < kPass; ++hh) {
          const float m = mh[hh];
          sum[hh] = 0.0f;
#pragma unroll
          for (int t = 0; t < PL; ++t)
            sum[hh] += lane + 32 * t < geo.S ? expf(est[hh][t] - m) : 0.0f;
        }
        res = ml + logf(scatter_reduce<kPass, false>(sum, lane));
      }
      const int hh = lane >> 3;
      if ((lane & 7) == 0 && kPass * c + hh < G) dst[int64_t(kPass * c + hh) * MG] = res;
    }
    if constexpr (kPrefetch) cur = nxt;
  }  // groups of the warp
}

template <int RM, int NW, int PL>
void launch_super_t(const SuperView& s, const SuperTableView& t, const BatchView& batch, QIn q,
                    int Hq, float scale, const TwoLevelConfig& cfg, float* out, cudaStream_t st) {
  const SuperLayout& l = s.layout;
  const int H = l.num_kv_heads, G = Hq / H, MG = t.max_groups_per_seq;
  const int GP = (G + kPass - 1) / kPass * kPass, KP = (l.head_dim + 31) / 32 * 32;
  const size_t smem = sizeof(uint2) * size_t(GP / kPass) * (KP / 16) * 32 +
                      sizeof(float) * (2 * size_t(GP) + kSuperWarps * kPass * (2 * RM + 3));
  const int mode = !cfg.use_extent ? 0 : cfg.mix ? 2 : 1;
  // Vector loads where the rows' sizes and the arrays' addresses allow them.
  auto a16 = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vd = l.head_dim % 32 == 0 && a16(s.basis_q) && a16(s.mu_q);
  const bool vr = l.rank == RM && a16(s.coord_q) && a16(s.hi_q) && a16(s.lo_q);
  const int d = l.head_dim;
  const GroupGeom geo{d,
                      KP,
                      KP / 32,
                      l.rank,
                      l.group_pages,
                      vd ? (d % 128 == 0  ? 16
                            : d % 64 == 0 ? 8
                                          : 4)
                         : 0,
                      vd ? 8 : 0,
                      vr ? RM : 0};
  // Groups a warp: about one wave of 2 blocks an SM (132 SMs assumed; only the grid shape
  // depends on it), at most kMaxGpw: the next group's loads overlap this one's work, so
  // fewer, longer warps pay the block's query staging less often.
  const int64_t warps = int64_t(ceil_div(MG, kSuperWarps)) * kSuperWarps * H * batch.batch_size;
  const int gpw =
      int(std::clamp<int64_t>(ceil_div(warps, int64_t(132) * 2 * kSuperWarps), 1, kMaxGpw));
  const dim3 grid(unsigned(ceil_div(MG, kSuperWarps * gpw)), unsigned(H),
                  unsigned(batch.batch_size));
  auto go = [&](auto kernel) {
    launch_kernel(kernel, grid, dim3(kSuperWarps * 32), smem, st, sup_arrays(s), H, geo,
                  l.page_size, t.table, t.stride, MG, batch.seq_lens, batch.max_blocks_per_seq, q,
                  Hq, scale, cfg.agg == GroupAgg::lse, float(cfg.gamma), out, gpw);
  };
  if (mode == 0)
    go(super_score_kernel<RM, NW, PL, 0>);
  else if (mode == 1)
    go(super_score_kernel<RM, NW, PL, 1>);
  else
    go(super_score_kernel<RM, NW, PL, 2>);
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
      launch_super_t<8, 4, 2>(s, t, batch, q, Hq, scale, cfg, out, st);
    else
      launch_super_t<8, 4, 1>(s, t, batch, q, Hq, scale, cfg, out, st);
  } else if (l.rank <= 8) {
    if (two_pl)
      launch_super_t<8, 8, 2>(s, t, batch, q, Hq, scale, cfg, out, st);
    else
      launch_super_t<8, 8, 1>(s, t, batch, q, Hq, scale, cfg, out, st);
  } else {
    if (two_pl)
      launch_super_t<16, 4, 2>(s, t, batch, q, Hq, scale, cfg, out, st);
    else
      launch_super_t<16, 4, 1>(s, t, batch, q, Hq, scale, cfg, out, st);
  }
}

}  // namespace locks::cuda::detail

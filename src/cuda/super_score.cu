// Level 1 of the two-level step (super_summary.h, decode_two_level in decoder.cu): the score
// of every complete group of S pages for each query head, from the super summaries alone,
// with cpu::super_score's estimates (centroid, extent or mixed; LSE or max over the pages).
//
// One warp per (group, KV head, sequence), gpw groups a warp, about one wave of 2 blocks an
// SM. Per group (v25, docs/cuda_notes.md; the kernel before it held 4 dims a lane, summed 32
// partial dots a pass by shuffles, loaded bytes one at a time and waited for each group's
// codes: 41 us for 25 MB at Llama 1M batch 1):
//  - the next group's codes are loaded into registers while this one is scored;
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
// lane holds (gid, gid + 8); NW = words (8 dims) of a lane's dims, at most. Page codes are
// held as the A fragments of the estimate products need them: page 16 m + 8 r + gid (m-tile
// m of 16 pages, row half r), code pair j = dims k 2 tig + 8 j, + 1 of the group's basis.
template <int RM, int NW, int PL, int MODE>
struct GroupRegs {
  static constexpr int MT = RM / 8, NMT = 2 * PL, KJ = RM / 8;
  uint32_t bw[MT][NW];                          // basis nibbles of rows gid + 8 m, the lane's dims
  uint32_t mw[2];                               // centroid bytes: word gid of the lane's dims
  uint32_t hl[NMT][2][MODE == 0 ? 1 : KJ];      // hi codes (low 16 bits), lo codes (high 16)
  uint32_t cd[NMT][2][MODE == 1 ? 1 : KJ];      // coordinate codes (low 16 bits)
  uint32_t rad[NMT];                            // radius codes: row half r in byte r
  float mu_sc, rsc, bsc[MT], esc[MT], csc[MT];  // scales (rows gid + 8 m; 0 past the rank)
};

struct GroupGeom {
  int d, KP, nw, R, S;  // KP: head dim rounded up to 32; nw = KP / 32 words a lane
  // Alignments (load_words) of a lane's basis words and centroid word; page code pairs as
  // 2-byte loads (even rank, 2-byte aligned arrays).
  int a_basis, a_mu;
  bool pairs16;
};

// Codes k0, k0 + 1 of a page row (R codes), zero past the rank, in the low 16 bits.
__device__ __forceinline__ uint32_t load_pair(const int8_t* row, int k0, int R, bool pairs16) {
  if (k0 >= R) return 0u;
  if (pairs16) return *reinterpret_cast<const uint16_t*>(row + k0);
  uint32_t x = uint8_t(row[k0]);
  if (k0 + 1 < R) x |= uint32_t(uint8_t(row[k0 + 1])) << 8;
  return x;
}

template <int RM, int NW, int PL, int MODE>
__device__ __forceinline__ void load_group(GroupRegs<RM, NW, PL, MODE>& g, const SupArrays& A,
                                           int64_t gh, const GroupGeom& m, int lane) {
  using Regs = GroupRegs<RM, NW, PL, MODE>;
  constexpr int MT = Regs::MT, NMT = Regs::NMT, KJ = Regs::KJ;
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
  for (int mt = 0; mt < NMT; ++mt) {
    uint32_t rad = 0;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int p = 16 * mt + 8 * r + gid;
      const bool ok = p < m.S;
      const int64_t off = (gh * m.S + (ok ? p : 0)) * m.R;
#pragma unroll
      for (int j = 0; j < KJ; ++j) {
        const int k0 = ok ? 2 * tig + 8 * j : m.R;  // past the page count: zero codes
        if constexpr (MODE != 0)
          g.hl[mt][r][j] = load_pair(A.hi_q + off, k0, m.R, m.pairs16) |
                           load_pair(A.lo_q + off, k0, m.R, m.pairs16) << 16;
        if constexpr (MODE != 1) g.cd[mt][r][j] = load_pair(A.coord_q + off, k0, m.R, m.pairs16);
      }
      if (ok) rad |= uint32_t(A.radius_q[gh * m.S + p]) << (8 * r);
    }
    g.rad[mt] = rad;
  }
}

// B fragment pair of weights v0, v1 (k, k + 1 of a column) scaled by the column's
// normaliser: the fp16 hi part, or the residual lo part.
__device__ __forceinline__ uint32_t weight_pair(float v0, float v1, float f, bool lo) {
  v0 *= f, v1 *= f;
  return MmaH::pack(lo ? v0 - MmaH::round(v0) : v0, lo ? v1 - MmaH::round(v1) : v1);
}

// RM: basis rows held (R <= RM, 8 or 16); NW: words of 8 dims a lane (head dim <= 32 NW);
// PL: 32-page halves of a group (S <= 32 PL); MODE: 0 centroid, 1 extent, 2 mixed.
// Per pass of 4 heads, after the projections: the estimates of every page of the group for
// the 4 heads as tensor-core products, [pages x codes] x [codes x (head, hi / lo)]:
//   extent: sum_k max(w_k hi_pk, w_k lo_pk) = sum_k w+_k H_pk + w-_k L_pk with H = max(hi, lo),
//     L = min(hi, lo), w+ = w where w >= 0 else 0, w- = w where w <= 0 else 0 (a NaN weight
//     stays NaN in both), the extent scales folded into w: A columns are (H codes, L codes);
//   centroid: sum_k w_k c_pk with the coordinate scales folded into w.
// The int8 codes are exact in fp16; the weights enter as fp16 hi + lo halves after a
// power-of-two normaliser per head, fp32 accumulation. Lane (gid, tig) then holds head tig's
// estimates of pages 16 m + gid and 16 m + gid + 8, and each head's log-sum-exp (or max) is
// a reduction over the 8 lanes of its column.
template <int RM, int NW, int PL, int MODE>
__global__ void __launch_bounds__(kSuperWarps * 32, 2)
    super_score_kernel(SupArrays A, int H, GroupGeom geo, int P, const int32_t* table,
                       int64_t t_stride, int MG, const int32_t* seq_lens, int M, QIn q, int Hq,
                       float scale, bool lse, float gamma, float* out, int gpw) {
  using Regs = GroupRegs<RM, NW, PL, MODE>;
  constexpr int MT = Regs::MT, NMT = Regs::NMT, KJ = Regs::KJ;
  // The next group's codes are prefetched where the registers allow (a second set of page
  // codes: not at rank 16 with 64 pages, nor in the mixed mode past rank 8 with 32 pages).
  constexpr bool kPrefetch = RM * PL <= 8 || (RM * PL <= 16 && MODE != 2);
  extern __shared__ float4 sm4[];
  const int h = blockIdx.y, b = blockIdx.z, G = Hq / H;
  const int GP = (G + kPass - 1) / kPass * kPass;  // heads padded to whole passes (zero queries)
  const int KS = geo.KP / 16;                      // k-steps over the (padded) head dim
  // Shared memory: the query's B fragments [GP / 4][KS][32], per head its 2^e normaliser's
  // inverse and |q|^2, per warp the folded weights of a pass and their normalisers.
  uint2* bfr = reinterpret_cast<uint2*>(sm4);
  float* invf = reinterpret_cast<float*>(bfr + (GP / kPass) * KS * 32);
  float* q2 = invf + GP;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;
  float* wf = q2 + GP + warp * (kPass * (2 * RM + 2));  // [4][RM] extent (or centroid) weights
  float* wc = wf + kPass * RM;                          // [4][RM] coordinate weights (mixed)
  float* nf = wc + kPass * RM;                          // [4] normalisers of wf
  float* nc = nf + kPass;                               // [4] normalisers of wc

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
  const int bh = gid >> 1;   // head (in the pass) of this lane's estimate B column
  const bool blo = gid & 1;  // its lo half
  const float* wfb = wf + bh * RM;
  const float* wcb = wc + bh * RM;
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
    // The centroid word of this lane's row (gid < nw) as fp16 pairs.
    uint32_t mo[4];
    int8x8_to_half2(cur.mw[0], cur.mw[1], mo);
    // A fragments of the estimates: extent (H, L per code pair) and coordinates.
    uint32_t ah[NMT][2][MODE == 0 ? 1 : KJ], al[NMT][2][MODE == 0 ? 1 : KJ];
    uint32_t ac[NMT][2][MODE == 1 ? 1 : KJ];
#pragma unroll
    for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int jj = 0; jj < KJ; ++jj) {
          if constexpr (MODE != 0) {
            const __half2 hv = bits_h2(int8x2_to_half2(cur.hl[mt][r][jj]));
            const __half2 lv = bits_h2(int8x2_to_half2(cur.hl[mt][r][jj] >> 16));
            ah[mt][r][jj] = h2_bits(__hmax2(hv, lv));
            al[mt][r][jj] = h2_bits(__hmin2(hv, lv));
          }
          if constexpr (MODE != 1) ac[mt][r][jj] = int8x2_to_half2(cur.cd[mt][r][jj]);
        }
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
      float w[MT], w2 = 0.0f, mf = 0.0f, mc = 0.0f;
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const float a = t == 0 ? acc[0][0] + acc[0][1] : acc[0][2] + acc[0][3];
        w[t] = gid + 8 * t < geo.R ? a * inv * cur.bsc[t] : 0.0f;
        w2 = fmaf(w[t], w[t], w2);
      }
      const float qpart = MT == 1 ? acc[0][2] + acc[0][3] : acc[MT - 1][0] + acc[MT - 1][1];
      const float qM = column_sum(qpart) * inv * cur.mu_sc;
      w2 = column_sum(w2);
      const float gq = gamma * sqrtf(fmaxf(q2[g] - w2, 0.0f)) * cur.rsc;
      __syncwarp();  // the previous pass's B fragments are built
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const int k = gid + 8 * t;
        const float f = w[t] * (MODE == 0 ? cur.csc[t] : cur.esc[t]);
        wf[tig * RM + k] = f;
        mf = fmaxf(mf, fabsf(f));
        if constexpr (MODE == 2) {
          wc[tig * RM + k] = w[t] * cur.csc[t];
          mc = fmaxf(mc, fabsf(w[t] * cur.csc[t]));
        }
      }
      mf = fmaxf(mf, __shfl_xor_sync(kFull, mf, 4));
      mf = fmaxf(mf, __shfl_xor_sync(kFull, mf, 8));
      mf = fmaxf(mf, __shfl_xor_sync(kFull, mf, 16));
      if constexpr (MODE == 2) {
        mc = fmaxf(mc, __shfl_xor_sync(kFull, mc, 4));
        mc = fmaxf(mc, __shfl_xor_sync(kFull, mc, 8));
        mc = fmaxf(mc, __shfl_xor_sync(kFull, mc, 16));
      }
      if (gid == 0) {
        nf[tig] = pow2_normaliser(mf);
        if constexpr (MODE == 2) nc[tig] = pow2_normaliser(mc);
      }
      __syncwarp();
      // The estimates' B fragments (column gid: head bh, hi / lo) and products.
      float ext[NMT][4], cen[NMT][4];
      {
        const float fb = nf[bh];
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) ext[mt][e] = 0.0f;
        // Pairs of weights k0, k0 + 1 for entry pairs of the K dimension.
        auto wpair = [&](const float* wsrc, int k0, float f, int sign) {
          const float2 v = *reinterpret_cast<const float2*>(wsrc + k0);
          float v0 = v.x, v1 = v.y;
          if (sign > 0) v0 = v0 < 0.0f ? 0.0f : v0, v1 = v1 < 0.0f ? 0.0f : v1;
          if (sign < 0) v0 = v0 > 0.0f ? 0.0f : v0, v1 = v1 > 0.0f ? 0.0f : v1;
          return weight_pair(v0, v1, f, blo);
        };
        if constexpr (MODE == 0) {
          // centroid only: [coords] x [w], entries k < RM
          const uint32_t b0 = wpair(wfb, 2 * tig, fb, 0);
          const uint32_t b1 = KJ == 2 ? wpair(wfb, 2 * tig + 8, fb, 0) : 0u;
#pragma unroll
          for (int mt = 0; mt < NMT; ++mt)
            MmaH::run(ext[mt], ac[mt][0][0], ac[mt][1][0], KJ == 2 ? ac[mt][0][KJ - 1] : 0u,
                      KJ == 2 ? ac[mt][1][KJ - 1] : 0u, b0, b1);
        } else if constexpr (KJ == 1) {
          // one k-step: entries 0-7 the H codes (w+), 8-15 the L codes (w-)
          const uint32_t b0 = wpair(wfb, 2 * tig, fb, 1), b1 = wpair(wfb, 2 * tig, fb, -1);
#pragma unroll
          for (int mt = 0; mt < NMT; ++mt)
            MmaH::run(ext[mt], ah[mt][0][0], ah[mt][1][0], al[mt][0][0], al[mt][1][0], b0, b1);
        } else {
          // two k-steps: the H codes k 0-15 (w+), then the L codes (w-)
          const uint32_t p0 = wpair(wfb, 2 * tig, fb, 1), p1 = wpair(wfb, 2 * tig + 8, fb, 1);
          const uint32_t n0 = wpair(wfb, 2 * tig, fb, -1), n1 = wpair(wfb, 2 * tig + 8, fb, -1);
#pragma unroll
          for (int mt = 0; mt < NMT; ++mt) {
            MmaH::run(ext[mt], ah[mt][0][0], ah[mt][1][0], ah[mt][0][KJ - 1], ah[mt][1][KJ - 1], p0,
                      p1);
            MmaH::run(ext[mt], al[mt][0][0], al[mt][1][0], al[mt][0][KJ - 1], al[mt][1][KJ - 1], n0,
                      n1);
          }
        }
        if constexpr (MODE == 2) {
          const float fc = nc[bh];
          const uint32_t b0 = wpair(wcb, 2 * tig, fc, 0);
          const uint32_t b1 = KJ == 2 ? wpair(wcb, 2 * tig + 8, fc, 0) : 0u;
#pragma unroll
          for (int mt = 0; mt < NMT; ++mt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) cen[mt][e] = 0.0f;
            MmaH::run(cen[mt], ac[mt][0][0], ac[mt][1][0], KJ == 2 ? ac[mt][0][KJ - 1] : 0u,
                      KJ == 2 ? ac[mt][1][KJ - 1] : 0u, b0, b1);
          }
        }
      }
      // Head tig's estimates of this lane's pages (16 mt + 8 r + gid) and their LSE / max.
      const float inf_e = 1.0f / nf[tig];
      const float inf_c = MODE == 2 ? 1.0f / nc[tig] : 0.0f;
      float est[NMT][2], mx = kNegInf;
#pragma unroll
      for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int p = 16 * mt + 8 * r + gid;
          const float base = qM + gq * float((cur.rad[mt] >> (8 * r)) & 0xffu);
          const float x = base + (ext[mt][2 * r] + ext[mt][2 * r + 1]) * inf_e;
          float v;
          if constexpr (MODE != 2) {
            v = logP + scale * x;
          } else {  // log(P e^{scale cen} + e^{scale ext}), shifted by the larger term
            const float cx = base + (cen[mt][2 * r] + cen[mt][2 * r + 1]) * inf_c;
            const float a = logP + scale * cx, z = scale * x, top = fmaxf(a, z);
            v = top + logf(expf(a - top) + expf(z - top));
          }
          est[mt][r] = p < geo.S ? v : kNegInf;
          mx = fmaxf(mx, est[mt][r]);
        }
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 16));
      float res = mx;
      if (lse) {
        float sum = 0.0f;
#pragma unroll
        for (int mt = 0; mt < NMT; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            sum += 16 * mt + 8 * r + gid < geo.S ? expf(est[mt][r] - mx) : 0.0f;
        res = mx + logf(column_sum(sum));
      }
      if (gid == 0 && g < G) dst[int64_t(g) * MG] = res;
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
                      sizeof(float) * (2 * size_t(GP) + kSuperWarps * kPass * (2 * RM + 2));
  const int mode = !cfg.use_extent ? 0 : cfg.mix ? 2 : 1;
  // Vector loads where the rows' sizes and the arrays' addresses allow them.
  auto aligned = [](const void* p, uintptr_t n) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % n == 0;
  };
  const int d = l.head_dim;
  const bool vd = d % 32 == 0 && aligned(s.basis_q, 16) && aligned(s.mu_q, 16);
  const int a_basis = !vd ? 0 : d % 128 == 0 ? 16 : d % 64 == 0 ? 8 : 4;
  const bool pairs16 =
      l.rank % 2 == 0 && aligned(s.coord_q, 2) && aligned(s.hi_q, 2) && aligned(s.lo_q, 2);
  const GroupGeom geo{d, KP, KP / 32, l.rank, l.group_pages, a_basis, vd ? 8 : 0, pairs16};
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

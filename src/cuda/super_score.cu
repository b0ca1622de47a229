// Level 1 of the two-level step (super_summary.h, decode_two_level in decoder.cu): the score
// of every complete group of S pages for each query head, from the super summaries alone,
// with cpu::super_score's estimates (centroid, extent or mixed; LSE or max over the pages).
//
// One warp per (group, KV head, sequence), gpw groups a warp, about one wave of 2 blocks an
// SM. Per group (v32, docs/cuda_notes.md; v25 scored the pages on the CUDA cores, ~845
// instructions a group at Llama-3.1-8B shapes, issue-bound: 29 us at 1M batch 1):
//  - the next group's codes are loaded into registers while this one is scored (where the
//    registers allow), with 16- / 8- / 2-byte loads where the rows and the arrays' addresses
//    are aligned, bytes otherwise;
//  - the query's projections on the basis rows and on the centroid (W q, M q) run on the
//    tensor cores, 4 query heads a pass: mma.m16n8k16 with the int4 / int8 codes as fp16
//    (exact) and the query as fp16 hi + lo columns (about 22 bits; fp32 accumulation), the
//    same operand layout as score_mma's V q. A rows are the basis rows (gid, and gid + 8 at
//    rank 16) and, in the rows after them, the centroid split by word: row RM + v holds the
//    centroid's dims of word v of each lane (the rest zero), so its loads and conversions are
//    spread over the warp and M q is a sum over those rows;
//  - the page estimates run on the tensor cores too (v32): with max(w hi, w lo) =
//    w (hi + lo) / 2 + |w| |hi - lo| / 2 the extent term of every page is one dot product of
//    length 2 R between the page's codes (A rows = pages, exact in fp16) and the pass's
//    weights (B columns = the 4 heads' fp16 hi and lo parts, each head scaled by a power of
//    two into fp16's range), so a pass costs S / 16 mma a rank block instead of 4 R
//    multiply-max-adds a page and head on the CUDA cores; the mma leaves head tig's pages in
//    the lanes of that tig, so the group's max and log-sum-exp are 3-shuffle column
//    reductions, without shared memory.
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

// Codes k0, k0 + 1 (k0 even) of a per-page row of R bytes into the low 16 bits of x (left as
// it is where ok is false: the caller zeroes it first); zero past R. wide: the row holds RM = R
// codes at an aligned address, one 16-bit load straight into x.
__device__ __forceinline__ void load_pair(uint32_t& x, bool ok, const int8_t* row, int k0, int R,
                                          bool wide) {
  if (!ok) return;
  if (wide) {
    x = *reinterpret_cast<const uint16_t*>(row + k0);
  } else {  // rows of R != RM codes or unaligned arrays: bytes (combined here, not prefetched)
    const uint32_t b0 = k0 < R ? uint8_t(row[k0]) : 0u;
    const uint32_t b1 = k0 + 1 < R ? uint8_t(row[k0 + 1]) : 0u;
    x = b0 | b1 << 8;
  }
}

// A lane's registers for one group: raw codes and the scales it applies. MT = basis row tiles
// a lane holds (rows gid, gid + 8) = rank blocks of 8; NW = words (8 dims) of a lane's dims,
// at most; ROWS = rows of the page mma a lane holds (pages gid + 8 r, S <= 32 PL).
template <int RM, int NW, int PL, int MODE>
struct GroupRegs {
  static constexpr int MT = RM / 8, ROWS = 4 * PL;
  uint32_t bw[MT][NW];  // basis nibbles of rows gid + 8 m, the lane's dims
  uint32_t mw[2];       // centroid bytes: word gid of the lane's dims
  // Ranks 8 s + 2 tig, + 1 of page gid + 8 r, in the low 16 bits: the coordinates (centroid
  // mode) or hi, and lo. Each load lands in a register of its own, untouched until the group is
  // scored: combining two loads (hi | lo << 16) or selecting a loaded value made the prefetch
  // wait for its loads where it was issued (Llama 1M b1 level 1 35.6 us, v25 28.6).
  uint32_t pc[ROWS][MT];
  uint32_t pl[ROWS][MODE == 0 ? 1 : MT];        // lo (extent modes)
  uint32_t cc[ROWS][MODE == 2 ? MT : 1];        // the coordinates (mixed)
  uint32_t rad[ROWS];                           // radius codes (0 unless gamma != 0)
  float mu_sc, rsc, bsc[MT], esc[MT], csc[MT];  // scales (rows gid + 8 m; 0 past the rank)
  static constexpr int kWords = MT * NW + 2 +
                                ROWS * MT *
                                    (MODE == 0   ? 1
                                     : MODE == 1 ? 2
                                                 : 3) +
                                ROWS + 2 + 3 * MT;
};

struct GroupGeom {
  int d, KP, nw, R, S;  // KP: head dim rounded up to 32; nw = KP / 32 words a lane
  // Alignments (load_words) of a lane's basis words and centroid word; a_rows != 0: the page
  // rows hold RM codes at 16-byte aligned arrays (16-bit pair loads).
  int a_basis, a_mu, a_rows;
};

template <int RM, int NW, int PL, int MODE>
__device__ __forceinline__ void load_group(GroupRegs<RM, NW, PL, MODE>& g, const SupArrays& A,
                                           int64_t gh, const GroupGeom& m, bool radius, int lane) {
  using Regs = GroupRegs<RM, NW, PL, MODE>;
  constexpr int MT = Regs::MT, ROWS = Regs::ROWS;
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
  // The group's per-page rows from this lane's first page (gid); row r is 8 r pages on. Rows
  // of RM codes at aligned addresses (a_rows) take 16-bit loads at compile-time offsets.
  const bool wide = m.a_rows != 0;
  const int rs = wide ? RM : m.R;
  const int64_t first = gh * m.S + gid;
  const int8_t* const co = A.coord_q + first * rs;
  const int8_t* const hi = A.hi_q + first * rs;
  const int8_t* const lo = A.lo_q + first * rs;
  const uint8_t* const ra = A.radius_q + first;
  auto row = [&](int r, int s, bool ok, bool w, int R) {
    const int off = 8 * r * R + 8 * s + 2 * tig;  // read only where the page exists
    const int left = R - 8 * s - 2 * tig;
    load_pair(g.pc[r][s], ok, (MODE == 0 ? co : hi) + off, 0, left, w);
    if constexpr (MODE != 0) load_pair(g.pl[r][s], ok, lo + off, 0, left, w);
    if constexpr (MODE == 2) load_pair(g.cc[r][s], ok, co + off, 0, left, w);
  };
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const bool ok = gid + 8 * r < m.S;
#pragma unroll
    for (int s = 0; s < MT; ++s) {
      g.pc[r][s] = 0u;
      g.pl[r][MODE == 0 ? 0 : s] = 0u;
      g.cc[r][MODE == 2 ? s : 0] = 0u;
      if (wide)
        row(r, s, ok, true, RM);
      else
        row(r, s, ok, false, m.R);
    }
    g.rad[r] = 0u;
    if (ok && radius) g.rad[r] = ra[8 * r];
  }
}

// RM: basis rows held (R <= RM, 8 or 16); NW: words of 8 dims a lane (head dim <= 32 NW);
// PL: S <= 32 PL; MODE: 0 centroid, 1 extent, 2 mixed.
template <int RM, int NW, int PL, int MODE>
__global__ void __launch_bounds__(kSuperWarps * 32, 2)
    super_score_kernel(SupArrays A, int H, GroupGeom geo, int P, const int32_t* table,
                       int64_t t_stride, int MG, const int32_t* seq_lens, int M, QIn q, int Hq,
                       float scale, bool lse, float gamma, float* out, int gpw) {
  using Regs = GroupRegs<RM, NW, PL, MODE>;
  constexpr int MT = Regs::MT, ROWS = Regs::ROWS, NMT = 2 * PL;  // NMT: m-tiles of 16 pages
  // The next group's codes are prefetched where the registers allow it (not at rank 16 with
  // 64 pages and the mixed estimate); the basis and page codes are converted to fp16 once a
  // group rather than once a pass where that holds few registers.
  constexpr bool kPrefetch = Regs::kWords <= 32;
  constexpr bool kHoistBasis = MT * NW * 4 <= 16;
  constexpr bool kHoistPages = ROWS * MT * (MODE == 2 ? 3 : 2) <= 16;
  extern __shared__ float4 sm4[];
  const int h = blockIdx.y, b = blockIdx.z, G = Hq / H;
  const int GP = (G + kPass - 1) / kPass * kPass;  // heads padded to whole passes (zero queries)
  const int KS = geo.KP / 16;                      // k-steps over the (padded) head dim
  // Shared memory: the query's B fragments [GP / 4][KS][32], per head its 2^e normaliser's
  // inverse and |q|^2.
  uint2* bfr = reinterpret_cast<uint2*>(sm4);
  float* invf = reinterpret_cast<float*>(bfr + (GP / kPass) * KS * 32);
  float* q2 = invf + GP;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;
  const bool radius = gamma != 0.0f;  // the radius term is read only when it counts

  // Untrusted device values (docs/bad_input.md): an invalid length has no complete group,
  // an invalid slot scores -inf.
  const int len = seq_lens[b];
  const int C = rules::trusted_full_pages(len, M, P) / geo.S;
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
  if (slots[0] >= 0) load_group(cur, A, int64_t(slots[0]) * H + h, geo, radius, lane);

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
  // Source lanes of the page mma's B fragments: lane (gid, tig) holds head gid / 2's weights
  // of ranks 8 s + 2 tig + e, which the W q step left in lane (2 tig + e, gid / 2).
  const int src0 = 4 * (2 * tig) + (gid >> 1), src1 = src0 + 4;
  const bool lo_col = gid & 1;  // this lane's B column holds the fp16 residual parts
#pragma unroll 1
  for (int it = 0; it < gpw; ++it) {
    const int j = (blockIdx.x * gpw + it) * kSuperWarps + warp;
    if (j >= MG) break;
    const int32_t slot = slot_of(it);
    if constexpr (kPrefetch) {
      const int32_t next = it + 1 < gpw ? slot_of(it + 1) : -1;
      if (next >= 0) load_group(nxt, A, int64_t(next) * H + h, geo, radius, lane);  // in flight
    } else if (it > 0 && slot >= 0) {
      load_group(cur, A, int64_t(slot) * H + h, geo, radius, lane);
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
    // The basis rows' fp16 pairs (W q's A fragments), once a group where they fit.
    uint32_t obh[kHoistBasis ? MT : 1][kHoistBasis ? NW : 1][4];
    if constexpr (kHoistBasis) {
#pragma unroll
      for (int v = 0; v < NW; ++v)
#pragma unroll
        for (int t = 0; t < MT; ++t) int4x8_to_half2(cur.bw[t][v], obh[t][v]);
    }
    // The page mma's A fragments of row r (pages gid + 8 r) and rank block s: the first term's
    // pair (centroid mode: the coordinates; extent: hi + lo) and the second's (|hi - lo|), and
    // the mixed estimate's coordinates. Integers of at most 9 bits: exact in fp16. With
    // max(w hi, w lo) = w (hi + lo) / 2 + |w| |hi - lo| / 2 the extent term is one dot
    // product of length 2 R, on the tensor cores.
    auto page_frag = [&](int r, int s, uint32_t& first, uint32_t& second, uint32_t& cen) {
      if constexpr (MODE == 0) {
        first = int8x2_to_half2(cur.pc[r][s]);
        second = 0u;
      } else {
        const __half2 hi = bits_h2(int8x2_to_half2(cur.pc[r][s]));
        const __half2 lo = bits_h2(int8x2_to_half2(cur.pl[r][MODE == 0 ? 0 : s]));
        first = h2_bits(__hadd2(hi, lo));
        second = h2_bits(__habs2(__hsub2(hi, lo)));
      }
      cen = MODE == 2 ? int8x2_to_half2(cur.cc[r][MODE == 2 ? s : 0]) : 0u;
    };
    uint32_t pfh[kHoistPages ? ROWS : 1][kHoistPages ? MT : 1][3];
    if constexpr (kHoistPages) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int s = 0; s < MT; ++s) page_frag(r, s, pfh[r][s][0], pfh[r][s][1], pfh[r][s][2]);
    }
    auto frag = [&](int r, int s, uint32_t(&f)[3]) {
      if constexpr (kHoistPages)
        f[0] = pfh[r][s][0], f[1] = pfh[r][s][1], f[2] = pfh[r][s][2];
      else
        page_frag(r, s, f[0], f[1], f[2]);
    };
    for (int c = 0; c < GP / kPass; ++c) {
      // W q (rows gid [, gid + 8]) and the centroid rows' share of M q, for heads 4 c + tig.
      float acc[MT == 1 ? 1 : 2][4] = {};
#pragma unroll
      for (int v = 0; v < NW; ++v) {
        if (v >= geo.nw) break;  // warp-uniform
        uint32_t ob[MT][4];
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          if constexpr (kHoistBasis) {
#pragma unroll
            for (int x = 0; x < 4; ++x) ob[t][x] = obh[t][v][x];
          } else {
            int4x8_to_half2(cur.bw[t][v], ob[t]);
          }
        }
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
      const int g = kPass * c + tig;  // this lane's head in W q's and the page mma's outputs
      const float inv = invf[g];
      float wx[MT], wcx[MT], w2 = 0.0f;  // weights of rank gid + 8 t, head g, scales folded
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        const float a = t == 0 ? acc[0][0] + acc[0][1] : acc[0][2] + acc[0][3];
        const float w = gid + 8 * t < geo.R ? a * inv * cur.bsc[t] : 0.0f;
        w2 = fmaf(w, w, w2);
        wx[t] = w * (MODE == 0 ? cur.csc[t] : cur.esc[t]);
        wcx[t] = w * cur.csc[t];
      }
      const float qpart = MT == 1 ? acc[0][2] + acc[0][3] : acc[MT - 1][0] + acc[MT - 1][1];
      const float qM = column_sum(qpart) * inv * cur.mu_sc;
      // gamma |q_perp| times the radius scale (cpu::super_score's; not evaluated at gamma 0,
      // the default, where the term is zero).
      const float gq = radius ? gamma * sqrtf(fmaxf(q2[g] - column_sum(w2), 0.0f)) * cur.rsc : 0.0f;

      // The page mma's B fragments: column gid = head gid / 2's hi (even) or lo (odd) fp16 part,
      // k-rows 2 tig, 2 tig + 1 the first term's weights of ranks 8 s + 2 tig, + 1, k-rows
      // 2 tig + 8, + 9 the second term's (|w| / 2; zero in centroid mode). Each head's weights
      // are scaled by a power of two into fp16's range and the products scaled back.
      float vx[MT][2], vc[MT][2], mxx = 0.0f, mxc = 0.0f;
#pragma unroll
      for (int s = 0; s < MT; ++s) {
        vx[s][0] = __shfl_sync(kFull, wx[s], src0);
        vx[s][1] = __shfl_sync(kFull, wx[s], src1);
        mxx = fmaxf(mxx, fmaxf(fabsf(vx[s][0]), fabsf(vx[s][1])));
        if constexpr (MODE == 2) {
          vc[s][0] = __shfl_sync(kFull, wcx[s], src0);
          vc[s][1] = __shfl_sync(kFull, wcx[s], src1);
          mxc = fmaxf(mxc, fmaxf(fabsf(vc[s][0]), fabsf(vc[s][1])));
        }
      }
      mxx = fmaxf(mxx, __shfl_xor_sync(kFull, mxx, 1));
      mxx = fmaxf(mxx, __shfl_xor_sync(kFull, mxx, 2));
      const float fx = pow2_normaliser(mxx);
      float fc = 1.0f;
      if constexpr (MODE == 2) {
        mxc = fmaxf(mxc, __shfl_xor_sync(kFull, mxc, 1));
        mxc = fmaxf(mxc, __shfl_xor_sync(kFull, mxc, 2));
        fc = pow2_normaliser(mxc);
      }
      auto part = [&](float x0, float x1) {
        uint32_t hi, lo;
        split_half2(x0, x1, hi, lo);
        return lo_col ? lo : hi;
      };
      uint32_t bx0[MT], bx1[MT], bc0[MT];
#pragma unroll
      for (int s = 0; s < MT; ++s) {
        const float hx = MODE == 0 ? fx : 0.5f * fx;
        bx0[s] = part(vx[s][0] * hx, vx[s][1] * hx);
        bx1[s] = MODE == 0 ? 0u : part(fabsf(vx[s][0]) * hx, fabsf(vx[s][1]) * hx);
        bc0[s] = MODE == 2 ? part(vc[s][0] * fc, vc[s][1] * fc) : 0u;
      }
      // Head g's normalisers' inverses (exact: powers of two in the normal range), from a lane
      // whose B column is head g's (gid = 2 tig).
      auto inverse = [](float f) { return __uint_as_float((254u << 23) - __float_as_uint(f)); };
      const float unx = inverse(__shfl_sync(kFull, fx, 8 * tig));
      const float unc = MODE == 2 ? inverse(__shfl_sync(kFull, fc, 8 * tig)) : 1.0f;

      // Page mma: m-tile mt holds pages 16 mt + gid (accumulators 0, 1: head g's hi and lo
      // columns) and 16 mt + gid + 8 (2, 3), i.e. rows r = 2 mt and 2 mt + 1.
      float est[ROWS], mx = kNegInf;
#pragma unroll
      for (int mt = 0; mt < NMT; ++mt) {
        if (16 * mt >= geo.S) {  // warp-uniform
#pragma unroll
          for (int x = 0; x < 2; ++x) est[2 * mt + x] = kNegInf;
          continue;
        }
        float dx[4] = {}, dc[4] = {};
#pragma unroll
        for (int s = 0; s < MT; ++s) {
          uint32_t f0[3], f1[3];
          frag(2 * mt, s, f0);
          frag(2 * mt + 1, s, f1);
          MmaH::run(dx, f0[0], f1[0], f0[1], f1[1], bx0[s], bx1[s]);
          if constexpr (MODE == 2) MmaH::run(dc, f0[2], f1[2], 0u, 0u, bc0[s], 0u);
        }
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int r = 2 * mt + x;
          float e = kNegInf;
          if (gid + 8 * r < geo.S) {
            const float base = qM + gq * float(cur.rad[r]);
            const float ext = base + (dx[2 * x] + dx[2 * x + 1]) * unx;
            if constexpr (MODE != 2) {
              e = logP + scale * ext;
            } else {  // log(P e^{scale cen} + e^{scale ext}), shifted by the larger term
              const float cen = base + (dc[2 * x] + dc[2 * x + 1]) * unc;
              const float a = logP + scale * cen, z = scale * ext, top = fmaxf(a, z);
              e = top + logf(expf(a - top) + expf(z - top));
            }
          }
          est[r] = e;
          mx = fmaxf(mx, e);
        }
      }
      // Head g's maximum (or log-sum-exp) over the group: the lanes of this tig.
#pragma unroll
      for (int off = 4; off < 32; off *= 2) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, off));
      float res = mx;
      if (lse) {  // SFU exp2 / log2 (2 ulp): the group LSE's bound allows it (test_two_level.cpp)
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
          sum += gid + 8 * r < geo.S ? fast_exp2((est[r] - mx) * kLog2e) : 0.0f;
        res = mx + __log2f(column_sum(sum)) * kLn2;
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
  const size_t smem =
      sizeof(uint2) * size_t(GP / kPass) * (KP / 16) * 32 + sizeof(float) * 2 * size_t(GP);
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

// The tensor-core scoring kernel and its launch chain, included by score_mma.cu (the general
// query instances, QV true) and score_mma_fp32.cu (the contiguous fp32 query, QV false): two
// translation units, so that the two sets of instances compile in parallel. Everything here
// is internal to each of them (anonymous namespace).
// Page scoring on the tensor cores (int4 summaries, rank 8, P 16, d 64 / 128 / 256; int4 basis
// scales one a row, or per 32 dims at d 128 / 256, the default layouts):
// s_j = log sum_i exp(scale * (q.mu_j + (V_j q).c_i)) for every full page j and query head.
// One block of 4 warps per (chunk of 32-128 pages, KV head [x head slice], sequence), so the
// grid depends on the plan only; pages past the sequence get -inf. The three per-page
// products run as mma.sync m16n8k16 (fp16 in, fp32 accumulate): the int8/int4 codes are
// exact in fp16. The query (and the projected query) is either split into fp16 hi + lo
// columns (about 22 bits; G <= 4, and d 256) or rounded once to fp16 (G 5-16 at d 64/128,
// where the hi/lo doubling made the kernel issue-bound; see score_mma's HL parameter).
// Products: [2 pages x 8 basis rows] x [d x G columns] (V q), [query rows x 2 halves of d] x
// [d/2 x (4 pages x 2 halves)] (q.mu; hi/lo at G > 4, d 128 or d 256: [16 pages] x [d x 2G]),
// [(16 / G pages) x G heads] x [K x 16 keys] (the per-key logits, transposed so that each
// head's 16 keys sum within a lane quad). G here is a block's head slice: at most 16 heads
// (4 at d 256), wider groups take several blocks per page chunk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "locks/error.h"
#include "score.cuh"
#include "score_common.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kMmaWarps = 4;  // 4 warps x (chunk pages / 4): 32, 16 or 8 pages a warp

using MmaH = Mma<__half>;  // summaries' integer codes are exact in fp16

// One stage of a warp's pipeline: the summaries of kSP consecutive pages, copied verbatim.
// Small stages keep shared memory per block low (about 37 KB at d 128, G 4), so six blocks
// (24 warps) fit on an SM: the scoring kernel needs many warps in flight to hide latency.
constexpr int kSP = 4;
// NG: int4 basis scales per row (summary.h's basis_group: 1 = one a row, or D / 32).
template <int D, int NG>
struct Stage {
  static constexpr int kPages = kSP, R = 8, P = 16;
  uint8_t basis[kPages][R * D / 2];
  int8_t mu[kPages][D];
  int8_t coeff[kPages][P * R];
  float bscale[kPages][R * NG];
  float cscale[kPages][R];
  float muscale[kPages];
};

// A lane's share of the stage copies: lane l copies page l / 8 of the stage, 16-byte chunk
// l % 8 (+ 8 i) of its basis, centroid and coefficients, and lanes l % 8 < 5 one scale
// chunk. The per-lane source offsets and shared-memory slots are fixed for the whole
// kernel, so a stage costs one shuffle (the page's block id) and one wide multiply-add
// per array: no per-chunk address arithmetic. Group scales (NG > 1: R * NG floats, 2 NG
// 16-byte chunks a page) are copied by every lane of the page, NG / 4 chunks each.
template <int D, int NG>
struct StageLoader {
  static_assert(kSP * 8 == 32, "8 lanes per page of the stage");
  static_assert(NG == 1 || (NG % 4 == 0 && NG * 32 <= D), "basis scale groups: 1 or D/32");
  static constexpr int R = 8, P = 16;
  static constexpr int NB = R * D / 2 / 16 / 8;  // basis chunks per lane (8, 4 or 2)
  static constexpr int MC = D / 16;              // centroid chunks per page (16, 8 or 4)
  const uint8_t* basis;                          // basis_q + lane chunk offset, etc.
  const int8_t* mu;
  const int8_t* coeff;
  const char* scl;      // this lane's scale array + offset (lanes l % 8 < 5)
  uint32_t scl_stride;  // bytes per (block, head) of that scale array
  const float* bscl;    // NG > 1: this lane's first chunk of the group scales
  uint32_t dst;         // shared address of this lane's basis slot in stage buffer 0
  uint32_t mu_off, coeff_off, scl_off, bscl_off;  // slots of the other arrays, relative to dst
  int page, role;                                 // page of the stage (lane / 8), lane % 8

  __device__ void init(const SumView& S, Stage<D, NG>* my, int lane) {
    page = lane >> 3;
    role = lane & 7;
    basis = S.basis_q + role * 16;
    mu = S.mu_q + (role < MC ? role : 0) * 16;
    coeff = S.coeff_q + role * 16;
    const int half = role & 1;
    scl = role < 2   ? reinterpret_cast<const char*>(S.basis_scale + 4 * half)
          : role < 4 ? reinterpret_cast<const char*>(S.coeff_scale + 4 * half)
                     : reinterpret_cast<const char*>(S.mu_scale);
    scl_stride = role < 2 ? R * NG * 4 : role < 4 ? R * 4 : 4;
    bscl = S.basis_scale + 4 * role;
    Stage<D, NG>& st = my[0];
    const uint32_t base = smem_u32(&st.basis[page][role * 16]);
    dst = base;
    mu_off = smem_u32(&st.mu[page][(role < MC ? role : 0) * 16]) - base;
    coeff_off = smem_u32(&st.coeff[page][role * 16]) - base;
    scl_off = (role < 2   ? smem_u32(&st.bscale[page][4 * half])
               : role < 4 ? smem_u32(&st.cscale[page][4 * half])
                          : smem_u32(&st.muscale[page])) -
              base;
    bscl_off = smem_u32(&st.bscale[page][4 * role]) - base;
  }
  // blk: block id of this lane's page (-1 past the sequence's full pages: zero-filled).
  __device__ __forceinline__ void load(int buf, int32_t blk, int H, int h) const {
    const bool valid = blk >= 0;
    const uint32_t bh = uint32_t(valid ? blk : 0) * uint32_t(H) + uint32_t(h);
    const uint32_t d = dst + uint32_t(buf * sizeof(Stage<D, NG>));
    const uint8_t* sb = basis + uint64_t(bh) * (R * D / 2);
#pragma unroll
    for (int i = 0; i < NB; ++i) cp_async16_zfill(d + 128 * i, sb + 128 * i, valid);
    // (at d 64, lanes past the 4 centroid chunks copy none: not even a zero fill; at d 256
    // each lane copies chunks role and role + 8)
    if (MC >= 8 || role < MC) cp_async16_zfill(d + mu_off, mu + uint64_t(bh) * D, valid);
    if constexpr (MC == 16) cp_async16_zfill(d + mu_off + 128, mu + uint64_t(bh) * D + 128, valid);
    cp_async16_zfill(d + coeff_off, coeff + uint64_t(bh) * (P * R), valid);
    const char* ss = scl + uint64_t(bh) * scl_stride;
    if (role < 4) {
      if (NG == 1 || role >= 2) cp_async16_zfill(d + scl_off, ss, valid);
    } else if (role == 4) {
      cp_async4_zfill(d + scl_off, ss, valid);
    }
    if constexpr (NG > 1) {
      const float* bs = bscl + uint64_t(bh) * (R * NG);
#pragma unroll
      for (int i = 0; i < NG / 4; ++i) cp_async16_zfill(d + bscl_off + 128 * i, bs + 32 * i, valid);
    }
  }
};

// Query precision of a kernel instance. HL (hi + lo): the query and the projected query enter
// the fp16 tensor cores as hi + lo halves (about 22 bits), two n-tile columns per head, 4 heads
// an n-tile: G <= 4, and every group at d 256. Rounded once (HL false, G 5-16 at d 64/128):
// one fp16 column per head, 8 heads an n-tile. The summaries' int4 basis codes carry a
// quantization step of 1/7 of a row's largest entry, so the query's 2^-11 rounding is far
// below the summary's own error, and it halves the tensor-core work where it dominates (V q
// is 8 d G products a page: at G 16 the hi/lo kernel was issue-bound at 26% of the read
// ceiling). The error bound of either mode is tests/cuda/backend_cuda.cpp's u_score.
//
// D = head_dim, NT1 = n-tiles of 8 columns in the V q product (4 heads x {hi, lo}, or 8
// heads). Block: 4 warps; warp w scores pages [w*32, w*32+32) of the 128-page chunk in stages
// of kSP pages, two stages in flight (cp.async), so the loads of the next pages overlap the
// tensor-core work on the current ones.
// Blocks per SM that shared memory leaves room for (hi/lo at d 128: 6, 5, 4 for G <= 4, 8, 16;
// d 256, 4 heads: 4 blocks of 55 KB; rounded once: 6 at G <= 8, 5 at G <= 16); registers are
// capped to match, so they never lower the occupancy further.
template <int D, int NT1, bool HL>
constexpr int score_min_blocks() {
  // G 9-16 (NT1 2): 5, with the V q query fragments in shared memory (v23; with them in
  // registers 5 spilled, v15).
  if constexpr (!HL) return NT1 == 1 ? 6 : 5;
  return D == 256 ? 4 : NT1 == 1 ? 6 : NT1 == 2 ? 5 : 4;
}

// CP = pages per block (128, 96, 64 or 32: see score_chunk_pages), a template parameter so
// the stage loop keeps a compile-time trip count.
// Head slices: a GQA group of G heads is scored by n_sl blocks per (chunk, KV head), slice
// s taking heads [s gw, min(G, (s + 1) gw)) (gw <= GMAX), so groups wider than one
// block's query fragments (G > 16; G > 4 at d 256) read each summary n_sl times, from L2
// for all but the first: blockIdx.x = KV head * n_sl + slice keeps a page's slices adjacent.
// NG: basis scales per row (1, or D / 32 with basis_group 32; see (b)).
// QV: the query as QIn (fp32 / fp16 / bf16, any row stride: q16), else a contiguous fp32 query
// (q): that instance is the kernel as it was before the model-dtype query (the same
// instructions), since the general one, otherwise identical, scheduled the issue-bound G 16
// stage loop 5% slower at GLM 1M batch 1.
template <int D, int NT1, int CP, bool HL, int NG, bool QV>
__global__ void __launch_bounds__(kMmaWarps * 32, score_min_blocks<D, NT1, HL>())
    score_mma(SumView S, int H, const int32_t* __restrict__ block_table, int64_t bt_stride,
              int64_t bt_head_stride, const int32_t* __restrict__ seq_lens, int M,
              const float* __restrict__ q, QIn q16, int Hq, float scale, float* head_scores,
              float* chunk_lse, int n_chunks, int n_sl, int gw, bool whole) {
  constexpr int KS = D / 16;       // k-steps over the head dim
  constexpr int R = 8;             // rank
  constexpr int HPT = HL ? 4 : 8;  // heads per n-tile of the query
  constexpr int GMAX = HPT * NT1;
  constexpr int ppw = CP / kMmaWarps;  // pages per warp: 32, 24, 16 or 8
  constexpr int n_st = ppw / kSP;      // stages of the warp
  // The query rows (read once, to build the fragments) share their shared memory with the
  // chunk's scores (written from the stage loop on, after a barrier). A score row is padded to
  // an odd number of words: the stage loop stores one page's G head scores at once (G rows,
  // one column), which a stride of 128 words put in one bank (a G-way conflict: 16 wavefronts
  // a store at G 16; ncu counted 36% of the kernel's shared wavefronts excessive).
  constexpr int kScLd = kScoreChunk + 1;
  constexpr int kQsc = GMAX * (D + 4) > GMAX * kScLd ? GMAX * (D + 4) : GMAX * kScLd;
  __shared__ float qsc[kQsc];
  float(*qs)[D + 4] = reinterpret_cast<float(*)[D + 4]>(qsc);
  float* sc = qsc;
  // Per head: 2^e normalisers of the query (q.mu) and of the query over the query weights
  // (V q; the same unless the summaries are query-weighted), and their inverses.
  __shared__ float qf[GMAX], qfw[GMAX], unscale[GMAX], unscale_w[GMAX];
  __shared__ float mt[kMmaWarps][kSP][GMAX + 1];  // q.mu per page of the stage
  // scaled (V q)_k per page of the stage: [page][head][k], so a lane's two k are one 8-byte (or,
  // rounded once, 4-byte) load. Rounded once, they enter the per-key mma as fp16 anyway, so
  // they are stored as fp16 (the same bits; half the shared memory).
  using WyT = std::conditional_t<HL, float, __half>;
  __shared__ __align__(16) WyT wy[kMmaWarps][kSP * GMAX * R];
  // Two n-tiles (G 9-16): the V q query fragments live in shared memory, one copy for the
  // block's warps (identical in every warp), read per k-step: 32 registers a thread fewer,
  // which lets 5 blocks (20 warps) share an SM instead of 4 (v23).
  constexpr bool kBqShared = NT1 == 2;
  __shared__ __align__(16) uint2 bqs[kBqShared ? NT1 * KS * 32 : 1];
  extern __shared__ float4 dyn[];
  Stage<D, NG>* stages = reinterpret_cast<Stage<D, NG>*>(dyn);

  const int h = int(blockIdx.x) / n_sl, chunk = blockIdx.y, b = blockIdx.z;  // heads fastest
  const int sl = int(blockIdx.x) - h * n_sl;
  const int G = Hq / H, g0 = sl * gw, gc = min(gw, G - g0);  // this slice's heads
  const int hq0 = h * G + g0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;
  // Untrusted device values (docs/bad_input.md): an invalid length scores no page; an invalid
  // block id is not loaded (zero-filled) and its page scores -inf.
  // The three independent global reads of the prologue are issued together (ncu at Llama
  // 128K batch 1: the query load, issued after the block ids, which waited for the length,
  // took 10% of the kernel's stall samples): the length, the warp's block ids (bounded by the
  // row's M entries; the length decides below which are pages) and the query values this
  // lane converts further down.
  const int len = seq_lens[b];
  const int jw = chunk * CP + warp * ppw;  // first page of the warp
  const int32_t* bt = block_table + int64_t(b) * bt_stride + h * bt_head_stride;
  const int32_t blk_pre = (lane < ppw && jw + lane < M) ? bt[jw + lane] : -1;
  constexpr int kQRows = (GMAX + kMmaWarps - 1) / kMmaWarps, kQCols = D / 32;
  float qpre[kQRows][kQCols];
  if constexpr (!QV) {
#pragma unroll
    for (int i = 0; i < kQRows; ++i) {
      const int g = warp + i * kMmaWarps;
#pragma unroll
      for (int j = 0; j < kQCols; ++j)
        qpre[i][j] = g < GMAX && g < gc ? q[(int64_t(b) * Hq + hq0 + g) * D + lane + 32 * j] : 0.0f;
    }
  } else {
    // One branch on the query's dtype, outside the unrolled loads.
    auto load_query = [&](auto tag) {
      using E = decltype(tag);
      const E* qb =
          static_cast<const E*>(q16.p) + int64_t(b) * q16.stride + int64_t(hq0) * D + lane;
#pragma unroll
      for (int i = 0; i < kQRows; ++i) {
        const int g = warp + i * kMmaWarps;
#pragma unroll
        for (int j = 0; j < kQCols; ++j)
          qpre[i][j] = g < GMAX && g < gc ? to_float(qb[g * D + 32 * j]) : 0.0f;
      }
    };
    if (q16.t == DType::f32)
      load_query(float{});
    else if (q16.t == DType::bf16)
      load_query(__nv_bfloat16{});
    else
      load_query(__half{});
  }
  const int n_full = rules::trusted_full_pages(len, M, 16);
  // A chunk past the row's full pages (block-uniform): -inf partials, and -inf scores where the
  // rows are to be written whole; no query work.
  if (chunk * CP >= n_full) {
    write_empty_chunk(CP, gc, b, hq0, Hq, M, chunk, n_chunks, whole ? head_scores : nullptr,
                      chunk_lse);
    return;
  }
  Stage<D, NG>* my = stages + 2 * warp;
  // Block ids of the warp's pages: lane l holds page jw + l (-1 past the full pages).
  const int32_t blk_raw = (lane < ppw && jw + lane < n_full) ? blk_pre : -1;
  const bool blk_ok = blk_raw >= 0 && blk_raw < S.num_blocks;
  const unsigned bad_pages = __ballot_sync(kFull, !blk_ok && lane < ppw && jw + lane < n_full);
  const int32_t blk_all = blk_ok ? blk_raw : -1;
  const int n_stages = jw < n_full ? min(n_st, (n_full - jw + kSP - 1) / kSP) : 0;
  StageLoader<D, NG> ld;
  ld.init(S, my, lane);
  auto issue = [&](int s) {
    if (s < n_stages)  // warp-uniform: the whole warp takes part in the shuffle
      ld.load(s & 1, __shfl_sync(kFull, blk_all, kSP * s + ld.page), H, h);
    cp_async_commit();
  };
  issue(0);
  issue(1);

  // Query rows (scaled to log2 units); per head a power-of-two normaliser for q and one for
  // q / w (query-weighted summaries: the basis multiplies q / w, the centroid q).
  const float* qw = S.qweight ? S.qweight + int64_t(h) * D : nullptr;
#pragma unroll
  for (int i = 0; i < kQRows; ++i) {
    const int g = warp + i * kMmaWarps;
    if (g >= GMAX) break;  // warp-uniform
    float mx = 0.0f, mxw = 0.0f;
#pragma unroll
    for (int j = 0; j < kQCols; ++j) {
      const int c = lane + 32 * j;
      const float x = qpre[i][j] * (scale * kLog2e);
      qs[g][c] = x;
      mx = fmaxf(mx, fabsf(x));
      mxw = fmaxf(mxw, fabsf(qw ? x / qw[c] : x));
    }
    const float f = pow2_normaliser(warp_max(mx)), fw = pow2_normaliser(warp_max(mxw));
    if (lane == 0) qf[g] = f, qfw[g] = fw, unscale[g] = 1.0f / f, unscale_w[g] = 1.0f / fw;
  }
  __syncthreads();
  // The fragments' values: q * f (exact: a power of two) and (q / w) * fw.
  auto q_at = [&](int g, int dim) { return qs[g][dim] * qf[g]; };
  auto qw_at = [&](int g, int dim) { return (qw ? qs[g][dim] / qw[dim] : qs[g][dim]) * qfw[g]; };

  // B fragments of the query: column n = gid of n-tile nt is head nt*4 + gid/2, hi or lo
  // (HL), or head nt*8 + gid.
  uint32_t bq[NT1][KS][2];
#pragma unroll
  for (int nt = 0; nt < NT1; ++nt) {
    const int g = HL ? nt * 4 + (gid >> 1) : nt * 8 + gid;
    const bool lo = HL && (gid & 1);
#pragma unroll
    for (int s = 0; s < KS; ++s) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int ri = 2 * s + x;
        const int dim = (D / 4) * tig + 8 * (ri / 4) + (ri % 4);
        const float v0 = qw_at(g, dim), v1 = qw_at(g, dim + 4);
        const float e0 = lo ? v0 - MmaH::round(v0) : v0, e1 = lo ? v1 - MmaH::round(v1) : v1;
        bq[nt][s][x] = MmaH::pack(e0, e1);
      }
      if (kBqShared && warp == 0)
        bqs[(nt * KS + s) * 32 + lane] = make_uint2(bq[nt][s][0], bq[nt][s][1]);
    }
  }

  // A fragments of the query for q.mu: m-tile mt holds heads 4 mt .. 4 mt + 3 (HL; row gid is
  // head 4 mt + gid / 2, hi or lo) or 8 mt .. 8 mt + 7 (row gid is head 8 mt + gid), over
  // dims [0, d/2); row gid + 8 the same over [d/2, d). The dims of a k-step match the
  // centroid chunk a lane converts (see (a)).
  uint32_t aq[NT1][KS / 2][4];
#pragma unroll
  for (int mt_ = 0; mt_ < NT1; ++mt_) {
    const int g = HL ? mt_ * 4 + (gid >> 1) : mt_ * 8 + gid;
    const bool lo = HL && (gid & 1);
#pragma unroll
    for (int k = 0; k < KS / 2; ++k)
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = 2 * k + x;
          const int dim = r * (D / 2) + (D / 8) * tig + 8 * (i / 4) + (i % 4);
          const float v0 = q_at(g, dim), v1 = q_at(g, dim + 4);
          const float e0 = lo ? v0 - MmaH::round(v0) : v0, e1 = lo ? v1 - MmaH::round(v1) : v1;
          aq[mt_][k][2 * x + r] = MmaH::pack(e0, e1);
        }
  }
  __syncthreads();  // every warp has its query fragments: qs is the scores' memory from here

  for (int s = 0; s < n_st; ++s) {
    const int j0 = jw + kSP * s;
    float* scw = sc + warp * ppw + kSP * s;  // sc[g * kScLd + ...]
    if (s >= n_stages) {                     // warp-uniform: nothing of the sequence here
      for (int e = lane; e < GMAX * kSP; e += 32) scw[(e / kSP) * kScLd + e % kSP] = kNegInf;
      continue;
    }
    cp_async_wait<1>();
    __syncwarp();
    const Stage<D, NG>& st = my[s & 1];
    // (a) q.mu for the stage's pages, transposed so that no mma row is padding: A rows are
    // (head [, hi/lo]) of the query over the first (rows gid) or second (rows gid + 8) half
    // of the head dim, B columns n = (page n / 2, half n % 2) of the centroids, K = d / 2.
    // Lane (gid, tig) then holds page tig's two matching halves in acc[0] and acc[3].
    {
      uint32_t rb[KS];  // B fragments, KS / 2 k-steps: 8-byte (d 64), 16 (d 128), 32 (d 256)
      const int8_t* src = &st.mu[gid >> 1][(gid & 1) * (D / 2) + (D / 8) * tig];
#pragma unroll
      for (int v = 0; v < (D == 64 ? 1 : D / 128); ++v) {
        uint32_t o[4];
        if constexpr (D == 64) {
          const uint2 u = *reinterpret_cast<const uint2*>(src);
          int8x8_to_half2(u.x, u.y, o);
#pragma unroll
          for (int m = 0; m < 4; ++m) rb[m] = o[m];
        } else {
          const uint4 u = reinterpret_cast<const uint4*>(src)[v];
          int8x8_to_half2(u.x, u.y, o);
#pragma unroll
          for (int m = 0; m < 4; ++m) rb[8 * v + m] = o[m];
          int8x8_to_half2(u.z, u.w, o);
#pragma unroll
          for (int m = 0; m < 4; ++m) rb[8 * v + 4 + m] = o[m];
        }
      }
      const float ms = st.muscale[tig];
#pragma unroll
      for (int mt_ = 0; mt_ < NT1; ++mt_) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < KS / 2; ++k)
          MmaH::run(acc, aq[mt_][k][0], aq[mt_][k][1], aq[mt_][k][2], aq[mt_][k][3], rb[2 * k],
                    rb[2 * k + 1]);
        float v = acc[0] + acc[3];
        if constexpr (HL) {
          v += __shfl_xor_sync(kFull, v, 4);  // + the other of hi / lo (row gid ^ 1)
          const int g = mt_ * 4 + (gid >> 1);
          if (!(gid & 1)) mt[warp][tig][g] = v * ms * unscale[g];
        } else {
          const int g = mt_ * 8 + gid;
          mt[warp][tig][g] = v * ms * unscale[g];
        }
      }
    }
    __syncwarp();

    // (b) V q for the pairs of pages of the stage on the tensor cores: A rows gid are basis row
    // gid of page p, rows gid + 8 that of page p + 1. The codes are converted one word (two
    // k-steps) at a time, inside the k loop, so that few A registers are live at once.
    // Group scales (NG > 1): a k-step sums dims of all four lanes of a quad (lane tig holds
    // dims [tig D/4, (tig + 1) D/4): D/128 groups of 32), so the groups cannot be accumulated
    // apart without another fragment layout; instead each code is multiplied in fp16 by its
    // group's scale over the row's largest, s_kj / max_j s_kj in (0, 1], and the row's largest
    // scale multiplies the product like the single scale does. That adds two fp16 roundings
    // (the ratio's and the product's, 2^-10 relative per basis entry; tests/cuda/cuda_arith.h),
    // far below the int4 step itself (1/14 of the group's largest entry).
    constexpr int LG = NG > 1 ? D / 128 : 1;  // groups of a lane's dims
#pragma unroll
    for (int p = 0; p < kSP; p += 2) {
      uint32_t w[2][D / 32];
      float wsc[2];
      __half2 ratio[2][LG];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const uint8_t* src = &st.basis[p + x][gid * (D / 2) + (D / 8) * tig];
        if constexpr (D == 256) {
          const uint4 u = reinterpret_cast<const uint4*>(src)[0];
          const uint4 u2 = reinterpret_cast<const uint4*>(src)[1];
          w[x][0] = u.x, w[x][1] = u.y, w[x][2] = u.z, w[x][3] = u.w;
          w[x][4] = u2.x, w[x][5] = u2.y, w[x][6] = u2.z, w[x][7] = u2.w;
        } else if constexpr (D == 128) {
          const uint4 u = *reinterpret_cast<const uint4*>(src);
          w[x][0] = u.x, w[x][1] = u.y, w[x][2] = u.z, w[x][3] = u.w;
        } else {
          const uint2 u = *reinterpret_cast<const uint2*>(src);
          w[x][0] = u.x, w[x][1] = u.y;
        }
        if constexpr (NG == 1) {
          wsc[x] = st.bscale[p + x][gid] * st.cscale[p + x][gid];
        } else {
          const float* bs = &st.bscale[p + x][gid * NG];
          float mx = 0.0f;
#pragma unroll
          for (int j = 0; j < NG; j += 4) {
            const float4 f = *reinterpret_cast<const float4*>(bs + j);
            mx = fmaxf(fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y))), fmaxf(fabsf(f.z), fabsf(f.w)));
          }
          // a zero row has codes 0 (ratio 0); NaN / Inf scales give NaN ratios (NaN scores)
          const float inv = mx > 0.0f ? 1.0f / mx : 0.0f;
          wsc[x] = mx * st.cscale[p + x][gid];
#pragma unroll
          for (int j = 0; j < LG; ++j) ratio[x][j] = __float2half2_rn(bs[LG * tig + j] * inv);
        }
      }
      float acc[NT1][4];
#pragma unroll
      for (int nt = 0; nt < NT1; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
      for (int v = 0; v < D / 32; ++v) {
        uint32_t o0[4], o1[4];
        int4x8_to_half2(w[0][v], o0);
        int4x8_to_half2(w[1][v], o1);
        if constexpr (NG > 1) {  // word v of lane tig: dims tig D/4 + 8 v ..: group LG tig + v / 4
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            o0[i] = h2_bits(__hmul2(bits_h2(o0[i]), ratio[0][v / 4]));
            o1[i] = h2_bits(__hmul2(bits_h2(o1[i]), ratio[1][v / 4]));
          }
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk)
#pragma unroll
          for (int nt = 0; nt < NT1; ++nt) {
            uint32_t b0 = bq[nt][2 * v + kk][0], b1 = bq[nt][2 * v + kk][1];
            if constexpr (kBqShared) {
              const uint2 f = bqs[(nt * KS + 2 * v + kk) * 32 + lane];
              b0 = f.x, b1 = f.y;
            }
            MmaH::run(acc[nt], o0[2 * kk], o1[2 * kk], o0[2 * kk + 1], o1[2 * kk + 1], b0, b1);
          }
      }
#pragma unroll
      for (int nt = 0; nt < NT1; ++nt) {
        if constexpr (HL) {  // columns 2 tig, 2 tig + 1: hi and lo of head nt*4 + tig
          const int g = nt * 4 + tig;
          wy[warp][(p * GMAX + g) * R + gid] = (acc[nt][0] + acc[nt][1]) * wsc[0] * unscale_w[g];
          wy[warp][((p + 1) * GMAX + g) * R + gid] =
              (acc[nt][2] + acc[nt][3]) * wsc[1] * unscale_w[g];
        } else {  // columns 2 tig, 2 tig + 1: heads nt*8 + 2 tig and the next
          const int g = nt * 8 + 2 * tig;
          wy[warp][(p * GMAX + g) * R + gid] = WyT(acc[nt][0] * wsc[0] * unscale_w[g]);
          wy[warp][(p * GMAX + g + 1) * R + gid] = WyT(acc[nt][1] * wsc[0] * unscale_w[g + 1]);
          wy[warp][((p + 1) * GMAX + g) * R + gid] = WyT(acc[nt][2] * wsc[1] * unscale_w[g]);
          wy[warp][((p + 1) * GMAX + g + 1) * R + gid] =
              WyT(acc[nt][3] * wsc[1] * unscale_w[g + 1]);
        }
      }
    }
    __syncwarp();
    // (c) per-key logits and each page's log-sum-exp, transposed: an M-tile's 16 rows are
    // (page, head) pairs of PM = 16 / GMAX pages, its columns the 16 keys (two n-tiles). K:
    // HL: the page's (8 hi; 8 lo) halves of the projected query, block-diagonal over the
    // tile's pages (k-step kk holds page kk); rounded once: two pages' projected queries
    // (k-step kk holds pages 2 kk and 2 kk + 1, one in each half of K). Every accumulator is
    // a useful logit, and a row's 16 keys lie in one lane quad: 4 exps, 2 shuffles. The
    // projected query w = (V q)_k * scales stays far inside fp16's range for any sane logit
    // scale.
    {
      constexpr int PM = 16 / GMAX, NMT = kSP / PM;
      constexpr int KSTEPS = HL ? PM : (PM + 1) / 2;
      // B: coefficients of key 8 nt + gid, codes 2 tig, 2 tig + 1 (HL: the hi and lo halves of
      // K multiply the same codes, so b1 = b0).
      uint32_t bc[kSP][2];
#pragma unroll
      for (int p = 0; p < kSP; ++p)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
          bc[p][nt] = int8x2_to_half2(
              *reinterpret_cast<const uint16_t*>(st.coeff[p] + (8 * nt + gid) * R + 2 * tig));
      const int plA = gid / GMAX, gA = gid % GMAX;              // row gid
      const int plB = (gid + 8) / GMAX, gB = (gid + 8) % GMAX;  // row gid + 8
#pragma unroll
      for (int t = 0; t < NMT; ++t) {
        const WyT* yA = &wy[warp][((t * PM + plA) * GMAX + gA) * R + 2 * tig];
        const WyT* yB = &wy[warp][((t * PM + plB) * GMAX + gB) * R + 2 * tig];
        uint32_t hiA, loA, hiB, loB;
        if constexpr (HL) {
          const float2 wA = *reinterpret_cast<const float2*>(yA);
          const float2 wB = *reinterpret_cast<const float2*>(yB);
          split_half2(wA.x, wA.y, hiA, loA);
          split_half2(wB.x, wB.y, hiB, loB);
        } else {  // the fp16 pair as stored (== MmaH::pack of the fp32 values: round to nearest)
          hiA = *reinterpret_cast<const uint32_t*>(yA);
          hiB = *reinterpret_cast<const uint32_t*>(yB);
          loA = loB = 0u;
        }
        float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
          if constexpr (HL) {
            const bool onA = plA == kk, onB = plB == kk;
            const uint32_t a0 = onA ? hiA : 0u, a2 = onA ? loA : 0u;
            const uint32_t a1 = onB ? hiB : 0u, a3 = onB ? loB : 0u;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
              MmaH::run(acc[nt], a0, a1, a2, a3, bc[t * PM + kk][nt], bc[t * PM + kk][nt]);
          } else {
            const int pa = 2 * kk, pb = 2 * kk + 1;  // pages of the K halves (pb < PM or none)
            const uint32_t a0 = plA == pa ? hiA : 0u, a2 = plA == pb ? hiA : 0u;
            const uint32_t a1 = plB == pa ? hiB : 0u, a3 = plB == pb ? hiB : 0u;
#pragma unroll
            for (int nt = 0; nt < 2; ++nt)
              MmaH::run(acc[nt], a0, a1, a2, a3, bc[t * PM + pa][nt],
                        bc[t * PM + (pb < PM ? pb : pa)][nt]);
          }
        }
        // log2-sum-exp over the 16 keys of each row (rows gid: acc[.][0..1], gid + 8:
        // acc[.][2..3]; the quad's lanes hold the other keys). The coefficients of a page sum
        // to zero over its keys, so max_i Z_i >= 0 and sum_i 2^Z_i >= 1: no max subtraction
        // is needed unless some |Z| is large (then the exact max-shifted form runs; one
        // warp-uniform vote per M-tile).
        float amax = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(acc[nt][e]));
        float sA = 0.0f, sB = 0.0f;
        if (__any_sync(kFull, amax > 64.0f)) {
          sA = fmaxf(fmaxf(acc[0][0], acc[0][1]), fmaxf(acc[1][0], acc[1][1]));
          sB = fmaxf(fmaxf(acc[0][2], acc[0][3]), fmaxf(acc[1][2], acc[1][3]));
          sA = fmaxf(sA, __shfl_xor_sync(kFull, sA, 1));
          sB = fmaxf(sB, __shfl_xor_sync(kFull, sB, 1));
          sA = fmaxf(sA, __shfl_xor_sync(kFull, sA, 2));
          sB = fmaxf(sB, __shfl_xor_sync(kFull, sB, 2));
        }
        float lA = (fast_exp2(acc[0][0] - sA) + fast_exp2(acc[0][1] - sA)) +
                   (fast_exp2(acc[1][0] - sA) + fast_exp2(acc[1][1] - sA));
        float lB = (fast_exp2(acc[0][2] - sB) + fast_exp2(acc[0][3] - sB)) +
                   (fast_exp2(acc[1][2] - sB) + fast_exp2(acc[1][3] - sB));
        lA += __shfl_xor_sync(kFull, lA, 1);
        lB += __shfl_xor_sync(kFull, lB, 1);
        lA += __shfl_xor_sync(kFull, lA, 2);
        lB += __shfl_xor_sync(kFull, lB, 2);
        if (tig < 2) {  // lane tig 0 writes row gid, lane tig 1 row gid + 8
          const bool second = tig == 1;
          const int jj = t * PM + (second ? plB : plA), g = second ? gB : gA;
          const float l = second ? lB : lA, sh = second ? sB : sA;
          scw[g * kScLd + jj] = j0 + jj < n_full && !((bad_pages >> (kSP * s + jj)) & 1u)
                                    ? (mt[warp][jj][g] + sh + __log2f(l)) * kLn2
                                    : kNegInf;
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
    issue(s + 2);
  }
  cp_async_wait<0>();
  __syncthreads();
  write_chunk(sc, kScLd, CP, gc, b, hq0, Hq, M, chunk, n_chunks, head_scores, chunk_lse);
}

template <int D, int NG = 1>
constexpr int mma_smem() {
  return int(2 * kMmaWarps * sizeof(Stage<D, NG>));
}

// Head slices of a GQA group on the tensor-core path: the fewest slices of at most
// mma_max_heads(d) heads, balanced (G 32 at d 128: 2 x 16; G 8 at d 256: 2 x 4).
constexpr int mma_max_heads(int d) { return d == 256 ? 4 : 16; }
HeadSlices mma_slices(int d, int group) { return head_slices(group, mma_max_heads(d)); }

// The launch chain for one query instance (QV, see score_mma): score_mma.cu instantiates it
// for the general query, score_mma_fp32.cu for the contiguous fp32 one, so that the two
// halves of the instances compile in parallel.
template <int D, int NT1, int CP, bool HL, int NG, bool QV>
void launch_mma(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale, float* hs,
                float* cl, int n_chunks, HeadSlices hsl, cudaStream_t st, int64_t bths,
                bool whole) {
  const int H = s.layout.num_kv_heads;
  // KV heads (and their head slices) vary fastest across the grid, so the blocks in flight
  // read the summaries of all heads of the same pages (adjacent in memory) rather than one
  // head across far pages.
  const dim3 grid(unsigned(H * hsl.n), unsigned(ceil_div(batch.max_blocks_per_seq, CP)),
                  unsigned(batch.batch_size));
  score_mma<D, NT1, CP, HL, NG, QV><<<grid, kMmaWarps * 32, mma_smem<D, NG>(), st>>>(
      sum_view(s), H, batch.block_table, batch.block_table_stride, bths, batch.seq_lens,
      batch.max_blocks_per_seq, static_cast<const float*>(q.p), q, Hq, scale, hs, cl, n_chunks,
      hsl.n, hsl.width, whole);
}

template <int D, int NT1, bool HL, int NG, bool QV>
void launch_mma_cp(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                   float* hs, float* cl, int n_chunks, int cp, HeadSlices hsl, cudaStream_t st,
                   int64_t bths, bool w) {
  if (cp == 128)
    launch_mma<D, NT1, 128, HL, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, hsl, st, bths, w);
  else if (cp == 96)
    launch_mma<D, NT1, 96, HL, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, hsl, st, bths, w);
  else if (cp == 64)
    launch_mma<D, NT1, 64, HL, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, hsl, st, bths, w);
  else
    launch_mma<D, NT1, 32, HL, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, hsl, st, bths, w);
}

// The instance for a slice width: hi/lo with one n-tile of 4 heads (width <= 4, and d 256),
// else the query rounded once with n-tiles of 8 heads (1 for width <= 8, 2 for <= 16).
template <int D, int NG, bool QV>
void launch_mma_g(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                  float* hs, float* cl, int n_chunks, int cp, cudaStream_t st, int64_t bths,
                  bool w) {
  const HeadSlices hsl = mma_slices(D, Hq / s.layout.num_kv_heads);
  if constexpr (D == 256) {
    launch_mma_cp<D, 1, true, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, cp, hsl, st, bths,
                                      w);
  } else {
    if (hsl.width <= 4)
      launch_mma_cp<D, 1, true, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, cp, hsl, st, bths,
                                        w);
    else if (hsl.width <= 8)
      launch_mma_cp<D, 1, false, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, cp, hsl, st,
                                         bths, w);
    else
      launch_mma_cp<D, 2, false, NG, QV>(s, batch, q, Hq, scale, hs, cl, n_chunks, cp, hsl, st,
                                         bths, w);
  }
}

template <bool QV>
void launch_mma_q(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                  float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                  cudaStream_t st, int64_t bths, bool w) {
  const int d = s.layout.head_dim;
  const bool grouped = s.layout.basis_group != d;  // then 32 (score_uses_tensor_cores)
  LOCKS_REQUIRE(!grouped || (s.layout.basis_group == 32 && d >= 128),
                "tensor-core scoring: basis_group ", s.layout.basis_group, " at head_dim ", d);
  if (d == 256 && grouped)
    launch_mma_g<256, 8, QV>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages,
                             st, bths, w);
  else if (d == 256)
    launch_mma_g<256, 1, QV>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages,
                             st, bths, w);
  else if (d == 128 && grouped)
    launch_mma_g<128, 4, QV>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages,
                             st, bths, w);
  else if (d == 128)
    launch_mma_g<128, 1, QV>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages,
                             st, bths, w);
  else
    launch_mma_g<64, 1, QV>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages,
                            st, bths, w);
}

template <int D, int CP, int NG, bool QV>
const void* mma_kernel(int group) {
  if constexpr (D == 256) {
    return (const void*)score_mma<D, 1, CP, true, NG, QV>;
  } else {
    const int w = mma_slices(D, group).width;
    return w <= 4   ? (const void*)score_mma<D, 1, CP, true, NG, QV>
           : w <= 8 ? (const void*)score_mma<D, 1, CP, false, NG, QV>
                    : (const void*)score_mma<D, 2, CP, false, NG, QV>;
  }
}

// Instances: one scale a row at every D; 32-dim scale groups at D 128 and 256 (the default
// layouts, summary_layout_for); other groups score on the CUDA-core kernel (score.cu).
template <int D, int NG, bool QV>
void prepare_dg() {
  for (int g : {4, 8, 16})
    for (const void* f : {mma_kernel<D, 128, NG, QV>(g), mma_kernel<D, 96, NG, QV>(g),
                          mma_kernel<D, 64, NG, QV>(g), mma_kernel<D, 32, NG, QV>(g)})
      LOCKS_CUDA_CHECK(
          cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, mma_smem<D, NG>()));
}
template <int D, bool QV>
void prepare_d() {
  prepare_dg<D, 1, QV>();
  if constexpr (D >= 128) prepare_dg<D, D / 32, QV>();
}
template <bool QV>
void prepare_mma_q() {
  prepare_d<64, QV>();
  prepare_d<128, QV>();
  prepare_d<256, QV>();
}

}  // namespace
}  // namespace locks::cuda::detail

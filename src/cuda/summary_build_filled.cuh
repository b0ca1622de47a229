// Latency-oriented summary build for SummaryBuilder::build_filled: one block of 256 threads
// per (sequence, KV head). The bulk kernel's half-warp Jacobi is a ~56K-instruction serial
// chain per warp (~130 us a launch); here the 16 x 16 problem is spread over 256 threads.
//
// Parallel cyclic Jacobi with the bulk kernel's round-robin pairs, one barrier a round: the
// matrices A (Gram) and V (eigenvectors) are double-buffered in shared memory with rows /
// columns in "slot" order, where round t pairs slots (2m, 2m+1). Between rounds the indices
// move between slots by a fixed permutation (next_slot: the circle method behind the
// round-robin schedule), so every thread reads and writes the same addresses in every
// round. Thread (sk, sl) owns slot entry (sk, sl): it recomputes the rotations of its row
// pair and its column pair from their diagonal 2 x 2 blocks (same inputs, same rounding in
// every thread, so the same bits) and writes A'[sk][sl] = (J^T A J)[sk][sl] and
// V'[r][sl] = (V J)[r][sl] (r = its row of V, in key order) at next round's slots of the
// other buffer. The centroid, the sort, the guards and the epilogue are the bulk kernel's.
#pragma once

#include "summary_build_common.cuh"

namespace locks::cuda::sb {

constexpr int kFilledThreads = 256;  // one thread per Gram entry
constexpr int kFilledWarps = kFilledThreads / 32;
constexpr int kCheckRounds = 10;  // rounds between convergence tests (even: buffer 0 after)
constexpr int kMaxChecks = kMaxSweeps * 15 / kCheckRounds;  // the bulk kernel's round cap

// Index held by slot s in round t: slot 0 = t, slot 1 = 15, slots (2m, 2m+1) = (t + m, t - m)
// mod 15, i.e. the pairs of rr_partner(., t).
constexpr __host__ __device__ int slot_index(int s, int t) {
  return s == 0 ? t : (s == 1 ? 15 : ((s & 1) ? (t - (s >> 1) + 15) % 15 : (t + (s >> 1)) % 15));
}
// Slot of round t + 1 that holds the index of slot s of round t (the same for every t).
constexpr __host__ __device__ int next_slot(int s) {
  return s == 0 ? 3 : (s == 1 ? 1 : (s == 15 ? 14 : ((s & 1) ? s + 2 : s - 2)));
}

__device__ __forceinline__ float rsqrt_approx(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// Rotation (c, s) of a pair (p, q) that zeroes A[p][q]: the bulk kernel's t = s / c =
// sign(theta) / (|theta| + sqrt(theta^2 + 1)), theta = a / b, a = A[q][q] - A[p][p],
// b = 2 A[p][q], in a form without divisions (shorter chain): with (a, b) scaled by a power
// of two so that max(|a|, |b|) is in [1, 2) (exact; only a / b matters), h = |(a, b)|,
// g = h + |a|: c = g / sqrt(2 h g), s = sign(theta) |b| / sqrt(2 h g). h^2 and 2 h g are
// >= 1, so the approximate MUFU ops are safe (no overflow or underflow for any |a|, |b| <
// 2^127). Swapping p and q gives the same rotation (a and s negate; for a = 0 both 45-degree
// rotations zero A[p][q]), so the even slot can play p.
__device__ __forceinline__ void pair_rotation(float app, float aqq, float apq, float& c, float& s) {
  const float a = __fsub_rn(aqq, app), b = __fadd_rn(apq, apq);
  // 2^-e for max(|a|, |b|) = 1.x 2^e (normal when rot; otherwise the result is discarded).
  const float inv =
      __int_as_float(0x7f000000 - (__float_as_int(fmaxf(fabsf(a), fabsf(b))) & 0x7f800000));
  const float an = __fmul_rn(a, inv), bn = __fmul_rn(b, inv);
  const float h2 = __fmaf_rn(an, an, __fmul_rn(bn, bn));
  const float h = __fmul_rn(h2, rsqrt_approx(h2));
  const float g = __fadd_rn(h, fabsf(an));
  const float r0 = rsqrt_approx(__fmul_rn(__fadd_rn(h, h), g));
  // One Newton step on c^2 + s^2 = r0^2 (g^2 + b^2) = 1: the MUFU errors would otherwise
  // scale A and V by up to ~1e-7 a rotation, systematically, over ~80 rounds.
  const float q = __fmaf_rn(g, g, __fmul_rn(bn, bn));
  const float r = __fmul_rn(r0, __fmaf_rn(__fmul_rn(-0.5f, q), __fmul_rn(r0, r0), 1.5f));
  const bool neg = a != 0.0f && ((a < 0.0f) != (b < 0.0f));  // theta < 0
  const bool rot = fabsf(apq) > 1e-30f;                      // the bulk kernel's guard
  const float sv = __fmul_rn(fabsf(bn), r);
  c = rot ? __fmul_rn(g, r) : 1.0f;
  s = rot ? (neg ? -sv : sv) : 0.0f;
}

// Off-diagonal and total sums of squares of the warp's entries, to red[warp] (lane 0).
__device__ __forceinline__ void norm_partials(float a, bool offdiag, float (*red)[2], int warp,
                                              int lane) {
  float off = offdiag ? a * a : 0.0f, all = a * a;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    off += __shfl_xor_sync(kFull, off, o);
    all += __shfl_xor_sync(kFull, all, o);
  }
  if (lane == 0) red[warp][0] = off, red[warp][1] = all;
}

// A is stored in 2 x 2 blocks of slots, (2i..2i+1) x (2j..2j+1) as 4 consecutive floats, so
// a round reads a thread's own block and the two diagonal blocks of its pairs with one
// 16-byte load each.
constexpr __host__ __device__ int blocked(int r, int c) {
  return ((r >> 1) * (kP / 2) + (c >> 1)) * 4 + (r & 1) * 2 + (c & 1);
}

// Per-thread offsets (floats, within one 16 x 16 buffer) of the fixed addresses of a round.
struct RoundAddr {
  int own, row_diag, col_diag;  // blocks of (sk, sl), (sk, sk), (sl, sl)
  int v_pair;                   // V[r][sl & ~1] (V is row-major, r = key)
  int w_a, w_v;                 // where A'[sk][sl] and V'[r][sl] go (next round's slots)
};

// One Jacobi round from (A, V) to (An, Vn); returns the thread's new A entry.
__device__ __forceinline__ float jacobi_round(const float* A, const float* V, float* An, float* Vn,
                                              const RoundAddr& o, bool k_low, bool l_low,
                                              bool pair_entry) {
  const float4 q = *reinterpret_cast<const float4*>(A + o.own);
  const float4 rd = *reinterpret_cast<const float4*>(A + o.row_diag);
  const float4 cd = *reinterpret_cast<const float4*>(A + o.col_diag);
  const float2 v = *reinterpret_cast<const float2*>(V + o.v_pair);
  float ck, sk, cl, sl;
  pair_rotation(rd.x, rd.w, rd.y, ck, sk);
  pair_rotation(cd.x, cd.w, cd.y, cl, sl);
  // Column k of J restricted to its pair (p, q) = (even, odd slot): (c, -s) for k = p,
  // (s, c) for k = q.
  const float ap = k_low ? ck : sk, aq = k_low ? -sk : ck;
  const float bp = l_low ? cl : sl, bq = l_low ? -sl : cl;
  // (J^T A J)[sk][sl] = sum over the block of a_i b_j A_ij, as (xx + yy) + (xy + yx) without
  // contraction: thread (sl, sk) forms the same four products (the mixed ones swapped), so
  // A stays exactly symmetric.
  const float pp = __fmul_rn(__fmul_rn(ap, bp), q.x), qq = __fmul_rn(__fmul_rn(aq, bq), q.w);
  const float pq = __fmul_rn(__fmul_rn(ap, bq), q.y), qp = __fmul_rn(__fmul_rn(aq, bp), q.z);
  // The pair's own off-diagonal entry is zero by construction of the rotation (a multiply,
  // not a branch: the two lanes per warp would diverge).
  const float keep = (pair_entry && sk != 0.0f) ? 0.0f : 1.0f;
  const float a = __fmul_rn(__fadd_rn(__fadd_rn(pp, qq), __fadd_rn(pq, qp)), keep);
  An[o.w_a] = a;
  Vn[o.w_v] = __fmaf_rn(bq, v.y, __fmul_rn(bp, v.x));  // (V J)[r][sl]
  return a;
}

// cache_write_slots (cache_write.h): the rows to write, token t's K / V rows of KV head h at
// k_in + t * k_ts + h * k_hs (elements), and the cache's K / V memory they go to.
template <typename T>
struct WriteRows {
  const T* k_in = nullptr;
  const T* v_in = nullptr;
  int64_t k_ts = 0, k_hs = 0, v_ts = 0, v_hs = 0;
  T* k_cache = nullptr;
  T* v_cache = nullptr;
  bool vec = false;    // every row start 16-byte aligned: vector copies and loads
  bool build = false;  // rebuild the blocks whose last slot is written
};

// n elements from src to dst by the threads [0, nthreads) of the block, in 16-byte vectors
// when vec (the caller checked the alignment), else one element a thread.
template <typename T>
__device__ __forceinline__ void copy_row(T* dst, const T* src, int n, bool vec, int t,
                                         int nthreads) {
  if (vec) {
    const int nv = n * int(sizeof(T)) / 16;
    for (int i = t; i < nv; i += nthreads)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
    for (int i = t; i < n; i += nthreads) dst[i] = src[i];
  }
}

// load_row_vec's 16 bytes of a row without the vector load (rows that are not aligned).
template <typename T>
__device__ __forceinline__ void load_row_elems(const T* src, float* dst, int n_vec_lane_idx) {
  constexpr int kPer = 16 / sizeof(T);
#pragma unroll
  for (int x = 0; x < kPer; ++x)
    dst[n_vec_lane_idx * kPer + x] = detail::to_float(src[n_vec_lane_idx * kPer + x]);
}

// The write of (token item, KV head head) in cache_write mode; returns the block to build, or
// -1. Every thread of the block calls it (it has block barriers) and gets the same answer.
// src_tok[j] is then the token of this call whose row fills slot j of that block (the last
// naming it), or -1 where the cache's row stays: rows written by this launch are read from
// the token rows, never from the cache that other blocks are writing.
template <typename T>
__device__ int32_t write_token(const Work& w, const WriteRows<T>& wr, int64_t item, int head, int H,
                               int d, int* src_tok) {
  const int tid = threadIdx.x;
  const int32_t s = w.slots[item];
  if (s < 0 || s / kP >= w.num_blocks) return -1;  // padding or an untrusted slot: skipped
  bool later = false;                              // the last token naming a slot writes it
  for (int64_t u = item + 1 + tid; u < w.n_items; u += kFilledThreads) later |= w.slots[u] == s;
  if (__syncthreads_or(later)) return -1;
  const int32_t blk = s / kP;
  const int64_t dst = int64_t(blk) * w.block_stride + (int64_t(s % kP) * H + head) * d;
  constexpr int kHalf = kFilledThreads / 2;  // K by the first half of the block, V the second
  if (tid < kHalf)
    copy_row(wr.k_cache + dst, wr.k_in + item * wr.k_ts + head * wr.k_hs, d, wr.vec, tid, kHalf);
  else
    copy_row(wr.v_cache + dst, wr.v_in + item * wr.v_ts + head * wr.v_hs, d, wr.vec, tid - kHalf,
             kHalf);
  if (!wr.build || s % kP != kP - 1) return -1;
  if (tid < kP) src_tok[tid] = -1;
  __syncthreads();
  for (int64_t u = tid; u < w.n_items; u += kFilledThreads) {
    const int32_t su = w.slots[u];
    if (su >= 0 && su / kP == blk) atomicMax(src_tok + su % kP, int(u));  // grid: n < 2^31
  }
  __syncthreads();
  return blk;
}

template <typename T, bool kWrite>
__global__ void __launch_bounds__(kFilledThreads)
    filled_kernel(const T* __restrict__ keys, int H, int d, int rank, Work work, Out out,
                  WriteRows<T> wr) {
  __shared__ __align__(16) float Ds[kP * (kMaxD + 4)];  // keys, then centred keys
  __shared__ float mus[kMaxD];
  __shared__ __align__(16) float As[2][kP * kP];  // double-buffered, slot order, blocked()
  __shared__ __align__(16) float Vs[2][kP * kP];  // [key][slot]
  __shared__ float Us[kP * kP];                   // U[k][i] = u_k[i], by rank
  __shared__ float sig[kP];
  __shared__ float red[kFilledWarps][2];
  __shared__ int perm[kP];  // perm[rank] = slot of that eigenpair

  __shared__ int src_tok[kP];  // cache_write mode: write_token's sources of the block's rows

  const int head = int(blockIdx.x % unsigned(H));
  const int64_t item = int64_t(blockIdx.x / unsigned(H));
  int32_t blk;
  if constexpr (kWrite)
    blk = write_token(work, wr, item, head, H, d, src_tok);
  else
    blk = resolve_block(work, item);
  if (blk < 0) return;  // block-uniform, before any (further) barrier
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ld = d + 4;

  // 1. Keys -> shared memory (fp32), one 16-byte vector a thread (bf16/fp16, d 128).
  {
    const int vec_per_row = d * int(sizeof(T)) / 16;
    const T* src = keys + blk * work.block_stride + int64_t(head) * d;
    for (int e = tid; e < kP * vec_per_row; e += kFilledThreads) {
      const int row = e / vec_per_row, vi = e - row * vec_per_row;
      if constexpr (kWrite) {
        if (src_tok[row] >= 0) {  // this launch's row: from the token rows
          const T* r = wr.k_in + int64_t(src_tok[row]) * wr.k_ts + int64_t(head) * wr.k_hs;
          if (wr.vec)
            load_row_vec<T>(r, Ds + row * ld, vi);
          else
            load_row_elems<T>(r, Ds + row * ld, vi);
          continue;
        }
      }
      load_row_vec<T>(src + int64_t(row) * H * d, Ds + row * ld, vi);
    }
    if (tid < kP) perm[tid] = tid;  // a permutation even if the sort below sees NaNs
  }
  __syncthreads();
  // 2. Centroid (the bulk kernel's summation order) and centring, a thread per dim.
  for (int c = tid; c < d; c += kFilledThreads) {
    float m = 0.0f;
#pragma unroll
    for (int r = 0; r < kP; ++r) m += Ds[r * ld + c];
    m *= (1.0f / kP);
    mus[c] = m;
    // Query-weighted summaries (summary.h): the fit is that of the weighted deviations.
    const float wc = out.qweight ? out.qweight[int64_t(head) * d + c] : 1.0f;
#pragma unroll
    for (int r = 0; r < kP; ++r) Ds[r * ld + c] = (Ds[r * ld + c] - m) * wc;
  }
  __syncthreads();

  // 3. Gram entry of slots (sk, sl) in round 0's slot order; four partial sums for ILP.
  // fmaf(x, y) == fmaf(y, x) and the same order, so A is exactly symmetric.
  const int sk = tid >> 4, sl = tid & 15;
  {
    const float* Dk = Ds + slot_index(sk, 0) * ld;
    const float* Dl = Ds + slot_index(sl, 0) * ld;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 4
    for (int c = 0; c < d; c += 4) {
      const float4 x = *reinterpret_cast<const float4*>(Dk + c);
      const float4 y = *reinterpret_cast<const float4*>(Dl + c);
      s0 = fmaf(x.x, y.x, s0);
      s1 = fmaf(x.y, y.y, s1);
      s2 = fmaf(x.z, y.z, s2);
      s3 = fmaf(x.w, y.w, s3);
    }
    const float a = __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
    As[0][blocked(sk, sl)] = a;
    Vs[0][sk * kP + sl] = sk == slot_index(sl, 0) ? 1.0f : 0.0f;  // V row sk = key sk
    norm_partials(a, sk != sl, red, warp, lane);
  }
  __syncthreads();

  // 4. Cyclic Jacobi, the bulk kernel's criterion tested every kCheckRounds rounds. The
  // partial norms are those of the state one round before the test (taken from the first
  // round of the last pair, reduced during the second, off the barrier's critical path); a
  // further round only lowers the off-diagonal mass. Every thread sums them in the same
  // order, so the break is block-uniform; red is rewritten only kCheckRounds - 2 barriers
  // after the test.
  RoundAddr o;
  o.own = blocked(sk, sl) & ~3, o.row_diag = blocked(sk, sk) & ~3;
  o.col_diag = blocked(sl, sl) & ~3, o.v_pair = sk * kP + (sl & ~1);
  o.w_a = blocked(next_slot(sk), next_slot(sl)), o.w_v = sk * kP + next_slot(sl);
  // Opaque to the compiler, so it keeps the offsets in registers instead of recomputing
  // them in every round.
  asm volatile("" : "+r"(o.own), "+r"(o.row_diag), "+r"(o.col_diag), "+r"(o.v_pair));
  asm volatile("" : "+r"(o.w_a), "+r"(o.w_v));
  const bool k_low = !(sk & 1), l_low = !(sl & 1), pair_entry = sl == (sk ^ 1);
  int rounds = 0;
  for (int chk = 0; chk < kMaxChecks; ++chk) {
    float off = 0.0f, all = 0.0f;
#pragma unroll
    for (int w = 0; w < kFilledWarps; ++w) off += red[w][0], all += red[w][1];
    if (off <= 1e-10f * all) break;
#pragma unroll 1
    for (int it = 0; it < kCheckRounds / 2 - 1; ++it) {
      jacobi_round(As[0], Vs[0], As[1], Vs[1], o, k_low, l_low, pair_entry);
      __syncthreads();
      jacobi_round(As[1], Vs[1], As[0], Vs[0], o, k_low, l_low, pair_entry);
      __syncthreads();
    }
    const float a = jacobi_round(As[0], Vs[0], As[1], Vs[1], o, k_low, l_low, pair_entry);
    __syncthreads();
    jacobi_round(As[1], Vs[1], As[0], Vs[0], o, k_low, l_low, pair_entry);
    norm_partials(a, sk != sl, red, warp, lane);  // no dependence: overlaps the round
    __syncthreads();
    rounds += kCheckRounds;
  }

  // 5. Sort eigenpairs (descending, ties to the lower key index) and keep the top `rank`.
  const int t_end = rounds % 15;
  if (tid < kP) {
    const float lam = As[0][blocked(tid, tid)];
    const int ix = slot_index(tid, t_end);
    int rnk = 0;
#pragma unroll
    for (int s = 0; s < kP; ++s) {
      const float lo = As[0][blocked(s, s)];
      rnk += (lo > lam) || (lo == lam && slot_index(s, t_end) < ix);
    }
    perm[rnk] = tid;
  }
  __syncthreads();
  if (sk < rank) {  // thread (k, i): u_k[i] = V[i][slot of k]
    const int col = perm[sk];
    Us[sk * kP + sl] = Vs[0][sl * kP + col];
    if (sl == 0) sig[sk] = sqrtf(fmaxf(As[0][blocked(col, col)], 0.0f));
  }
  __syncthreads();

  // 6. Epilogue, a warp per basis vector (mu on warp 0).
  const int64_t bh = int64_t(blk) * H + head;
  const float s0 = sig[0];
  if (warp == 0) write_mu(out, mus, d, bh, lane);
  for (int kk = warp; kk < rank; kk += kFilledWarps) {
    write_basis(out, Ds, ld, Us + kk * kP, sig[kk], s0, d, rank, kk, bh, lane);
    write_coeff(out, Us + kk * kP, sig[kk], s0, rank, kk, bh, lane);
  }
}

}  // namespace locks::cuda::sb

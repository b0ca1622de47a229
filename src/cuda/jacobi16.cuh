// Cyclic Jacobi on a 16 x 16 symmetric matrix held by a half-warp in registers (lane i owns
// row i of A and of the eigenvector matrix V): the 15 rounds of a sweep are unrolled so that
// every rotation pair of the round-robin schedule (rr_partner) is a compile-time register
// index; the lane's own pair comes through shuffles. Used by the page summary build (the
// 16 x 16 Gram matrix of a page) and the super summary build (the Rayleigh-Ritz matrix of
// its 16-dimensional subspace).
#pragma once

#include "summary_build_common.cuh"

namespace locks::cuda::sb {

__device__ __forceinline__ float pick(const float (&a)[16], int idx) {
  float r = a[0];
#pragma unroll
  for (int k = 1; k < 16; ++k) r = (k == idx) ? a[k] : r;
  return r;
}

// One Jacobi round t (pairs of the round-robin schedule) on the half-warp's matrix.
template <int t>
__device__ __forceinline__ void jacobi_round(float (&a)[16], float (&v)[16], int i) {
  const int j = rr_partner(i, t);
  const float aii = pick(a, i), aij = pick(a, j);
  const float ajj = __shfl_sync(kFull, aii, j, 16);
  float c = 1.0f, s = 0.0f;
  {
    const bool low = i < j;
    const float app = low ? aii : ajj, aqq = low ? ajj : aii;
    if (fabsf(aij) > 1e-30f) {
      const float theta = (aqq - app) / (2.0f * aij);
      const float at = fabsf(theta);
      float tt = at > 1e18f ? 0.5f / at : 1.0f / (at + sqrtf(at * at + 1.0f));
      tt = theta < 0.0f ? -tt : tt;
      c = rsqrtf(tt * tt + 1.0f);
      s = tt * c;
    }
  }
  // Column rotations (A <- A J, V <- V J) for every pair, with the pair's lower lane's angle.
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int x = k == 0 ? t : (t + k) % 15;
    const int y = k == 0 ? 15 : (t - k + 15) % 15;
    const int p = x < y ? x : y, q = x < y ? y : x;
    const float ck = __shfl_sync(kFull, c, p, 16), sk = __shfl_sync(kFull, s, p, 16);
    const float ap = a[p], aq = a[q];
    a[p] = ck * ap - sk * aq;
    a[q] = sk * ap + ck * aq;
    const float vp = v[p], vq = v[q];
    v[p] = ck * vp - sk * vq;
    v[q] = sk * vp + ck * vq;
  }
  // Row rotation (A <- J^T A): rows i and j mix.
  const int p = min(i, j);
  const float cp = __shfl_sync(kFull, c, p, 16), sp = __shfl_sync(kFull, s, p, 16);
  const bool is_p = i == p;
#pragma unroll
  for (int col = 0; col < 16; ++col) {
    const float other = __shfl_sync(kFull, a[col], j, 16);
    a[col] = is_p ? (cp * a[col] - sp * other) : (sp * other + cp * a[col]);
  }
}

template <int t>
__device__ __forceinline__ void jacobi_rounds(float (&a)[16], float (&v)[16], int i) {
  if constexpr (t < 15) {
    jacobi_round<t>(a, v, i);
    jacobi_rounds<t + 1>(a, v, i);
  }
}

__device__ __forceinline__ float half_sum(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(kFull, x, o, 16);
  return x;
}

// Diagonalises the half-warp's matrix: a becomes (nearly) diagonal, lane i's eigenvalue
// a[i], its eigenvector row i of v (v[j] = component i of eigenvector j). Sweeps until the
// off-diagonal mass is negligible (both halves of the warp must call it).
__device__ __forceinline__ void jacobi16_solve(float (&a)[16], float (&v)[16], int i) {
#pragma unroll
  for (int j = 0; j < 16; ++j) v[j] = (j == i) ? 1.0f : 0.0f;
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    float tot = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) tot += a[j] * a[j];
    const float dg = pick(a, i);
    const float off = half_sum(tot - dg * dg), all = half_sum(tot);
    if (__all_sync(kFull, off <= 1e-10f * all)) break;  // off-diagonal RMS ~1e-5 of the norm
    jacobi_rounds<0>(a, v, i);
  }
}

// Rank of lane i's eigenvalue lam among the half-warp's 16 (descending, ties to the lower
// index).
__device__ __forceinline__ int jacobi16_rank(float lam, int i) {
  int rnk = 0;
#pragma unroll
  for (int o = 0; o < 16; ++o) {
    const float lo = __shfl_sync(kFull, lam, o, 16);
    rnk += (lo > lam) || (lo == lam && o < i);
  }
  return rnk;
}

}  // namespace locks::cuda::sb

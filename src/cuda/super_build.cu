// GPU super summary build (cuda::super_build, super_summary.h): one block of 256 threads per
// (group of S pages, KV head), the same summary as cpu::super_build from the same keys.
//
// Why our own solver: the group basis is the top-R eigenvectors of the d x d covariance of
// the group's S * 16 keys (d up to 256). cuSOLVER's batched Jacobi (syevjBatched) stops at
// 32 x 32 and its dense solvers take one matrix a call with host synchronisation (not
// graph-capturable), so a build that runs as groups fill, inside the decode step's graph,
// needs a kernel. The covariance stays in shared memory (packed upper triangle: 131.6 KB at
// d 256), and only R <= 8 of its d eigenvectors are needed, so the kernel runs a subspace
// iteration in 16 dimensions (R + >= 8 oversampling): Y = C X, modified Gram-Schmidt, until
// the captured variance trace(X^T C X) stops growing (relative change <= 1e-4, 4-48
// iterations), then Rayleigh-Ritz: the 16 x 16 matrix X^T C X diagonalised by the page
// build's register Jacobi (jacobi16.cuh), W_k = X u_k for the R largest Ritz values. Each
// W_k is normalised and signed like the CPU build's (its largest |component|, the first of
// equal ones, positive), so both backends write the same codes up to rounding.
//
// Arithmetic is fp32 (the CPU build is double): on keys whose top R + 1 eigenvalues are
// distinct the codes agree with the CPU's within one step (tests/cuda/test_super_build.cpp);
// where eigenvalues coincide the basis is not unique and the backends may pick different
// ones of equal captured variance.
//
// Bad device values: a group whose slot or any block id is out of range is skipped (nothing
// written, as the page build); a group with a non-finite key gets every code 0 and every
// scale NaN, so its estimates are NaN rather than plausible numbers.
#include <cstdint>

#include "common.cuh"
#include "jacobi16.cuh"
#include "locks/cuda/check.h"
#include "locks/error.h"
#include "locks/super_summary.h"
#include "super_group_edge.h"  // src/common

namespace locks::cuda {
namespace {

using detail::to_float;
using detail::warp_sum;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kM = 16;        // subspace dimension (the Rayleigh-Ritz matrix is 16 x 16)
constexpr int kMaxRank = 8;   // kM - R >= 8 oversampling for the iteration's convergence
constexpr int kMaxS = 64;     // pages a group (the level-1 kernel's limit too)
constexpr int kP = 16;        // page size of the CUDA path
constexpr int kMinIters = 4;  // iterations before the trace test may stop the loop
// The stopping rule, set by what reaches level 1: the basis is stored in int4, which alone
// misses 2.6-4.5% of the top-8 variance on Gemma-3-270M's real keys (3 layers x 32K tokens,
// S 32, d 256). A relative trace change of 1e-3 stops after 8.5 iterations on average (13 at
// most) with the fp32 basis missing <= 7e-6 of it (1e-4: 16 / 36 iterations, 1e-7), the same
// codes to three digits of captured variance after int4; i.i.d. keys (no spectral gap) stop
// after 17 (1e-4: 35, many at the cap) missing 0.17% (docs/lab/results/
// super_build_tolerance_2026-12-04/). Fewer iterations shorten the decode-time build, a
// latency spike once per group.
constexpr int kMaxIters = 24;
constexpr float kTraceTol = 1e-3f;
// A Gram-Schmidt column whose squared norm falls below this share of the largest one seen is
// numerically in the span of the others (rank-deficient covariance): it is set to zero.
constexpr float kRankTol = 1e-12f;

struct Work {
  const int32_t* group_blocks;  // list mode: [n, S]
  const int32_t* slots;         // list mode: [n]
  int64_t num_blocks, num_slots;
  int64_t block_stride;  // elements from one cache block to the next
  int H, S, R;
  // Filled mode (group_blocks null): item b = sequence b; the group its last `appended`
  // tokens completed, if any, its blocks from the block table and its slot from the table.
  const int32_t* block_table = nullptr;
  int64_t bt_stride = 0;
  const int32_t* seq_lens = nullptr;
  int max_blocks = 0, appended = 0;
  const int32_t* table = nullptr;
  int64_t table_stride = 0;
  int max_groups = 0;
};

// Filled mode: the group that sequence b's last `appended` tokens completed, or -1.
__device__ __forceinline__ int completed_group(const Work& w, int64_t b) {
  return locks::detail::completed_group(w.seq_lens[b], w.appended, w.S * kP, w.max_blocks, kP,
                                        w.max_groups);
}

struct Out {
  int8_t* mu_q;
  float* mu_scale;
  uint8_t* basis_q;
  float* basis_scale;
  int8_t* coord_q;
  float* coord_scale;
  uint8_t* radius_q;
  float* radius_scale;
  int8_t* lo_q;  // extent only (null otherwise)
  int8_t* hi_q;
  float* extent_scale;
};

constexpr int tri_size(int d) { return d * (d + 1) / 2; }
// Packed upper triangle, row-major: element (i, j), i <= j.
__device__ __forceinline__ int tri(int i, int j, int d) {
  return i * d - i * (i - 1) / 2 + (j - i);
}

// Shared-memory plan (floats), a function of d only. Region A holds the covariance, then (in
// the epilogue, the covariance dead) two pages' centred keys and the per-page results.
struct Smem {
  static constexpr int epi(int d) {
    return 2 * kP * d + kP * kMaxRank + d + 3 * kMaxS * kMaxRank + kMaxS;
  }
  // Rounded up to 4 floats: X and Y are read as float4.
  static constexpr int region_a(int d) {
    return ((tri_size(d) > epi(d) ? tri_size(d) : epi(d)) + 3) / 4 * 4;
  }
  static constexpr int floats(int d) {
    return region_a(d) + 2 * d * kM + d + 2 * kWarpsPerBlock * kM + kWarpsPerBlock + kM * kM +
           kMaxRank * kM + 2 * kMaxRank + kMaxS;
  }
};

// Fixed pseudo-random start of the iteration, in [-1, 1) (a hash of row and column).
__device__ __forceinline__ float start_value(int j, int c) {
  uint32_t h = uint32_t(j) * 0x9E3779B1u ^ uint32_t(c) * 0x85EBCA77u;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  h ^= h >> 12;
  return float(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
}

// Sum of v over the block, the same bits in every thread (warp butterflies, then the 8 warp
// sums in warp order). scratch: kWarpsPerBlock floats, free on entry.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) s += scratch[w];
  __syncthreads();  // scratch free again
  return s;
}

// Modified Gram-Schmidt over the block: thread j holds row j of a d x 16 matrix (rows of
// threads past d are zero). Column c's norm and its dots with columns c+1.. are summed over
// the block in one exchange per column (two buffers alternate, so one barrier a column).
// Columns numerically dependent on earlier ones (kRankTol) become zero.
__device__ __forceinline__ void orthonormalize(float (&y)[kM], float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float inv[kM];
  float nmax = 0.0f;
#pragma unroll
  for (int c = 0; c < kM; ++c) {
    float* rb = red + (c & 1) * (kWarpsPerBlock * kM);
#pragma unroll
    for (int cc = c; cc < kM; ++cc) {
      const float s = warp_sum(y[c] * y[cc]);
      if (lane == 0) rb[warp * kM + cc] = s;
    }
    __syncthreads();
    float t[kM];
#pragma unroll
    for (int cc = c; cc < kM; ++cc) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarpsPerBlock; ++w) s += rb[w * kM + cc];
      t[cc] = s;
    }
    const float n = t[c];
    nmax = fmaxf(nmax, n);
    const bool keep = n > 0.0f && n > kRankTol * nmax;
    inv[c] = keep ? rsqrtf(n) : 0.0f;
    const float yc = keep ? y[c] : 0.0f;
    const float rn = keep ? 1.0f / n : 0.0f;
#pragma unroll
    for (int cc = c + 1; cc < kM; ++cc) y[cc] -= (t[cc] * rn) * yc;
  }
#pragma unroll
  for (int c = 0; c < kM; ++c) y[c] *= inv[c];
}

// y = C x for row j (< d): C packed in A, X (d x 16, row-major) in shared memory.
template <int kD>
__device__ __forceinline__ void cov_times(const float* A, const float* X, int j, float (&y)[kM]) {
#pragma unroll
  for (int c = 0; c < kM; ++c) y[c] = 0.0f;
  for (int l = 0; l < kD; ++l) {
    const float cjl = A[l < j ? tri(l, j, kD) : tri(j, l, kD)];
    const float4* xl = reinterpret_cast<const float4*>(X + l * kM);
#pragma unroll
    for (int q = 0; q < kM / 4; ++q) {
      const float4 v = xl[q];
      y[4 * q] = fmaf(cjl, v.x, y[4 * q]);
      y[4 * q + 1] = fmaf(cjl, v.y, y[4 * q + 1]);
      y[4 * q + 2] = fmaf(cjl, v.z, y[4 * q + 2]);
      y[4 * q + 3] = fmaf(cjl, v.w, y[4 * q + 3]);
    }
  }
}

// Row j of a d x 16 shared-memory matrix from a thread's registers.
__device__ __forceinline__ void store_row(float* M, int j, const float (&r)[kM]) {
#pragma unroll
  for (int q = 0; q < kM / 4; ++q)
    reinterpret_cast<float4*>(M + j * kM)[q] =
        make_float4(r[4 * q], r[4 * q + 1], r[4 * q + 2], r[4 * q + 3]);
}

__device__ __forceinline__ int8_t code8(float x, float s) {
  if (s == 0.0f) return 0;
  return int8_t(max(-127, min(127, __float2int_rn(x / s))));
}

// Every code 0, every scale NaN: the summary of a group with a non-finite key.
__device__ void write_poison(const Out& o, int64_t gh, int d, int S, int R, bool extent) {
  const float nan = __int_as_float(0x7fffffff);
  for (int e = threadIdx.x; e < d; e += kThreads) o.mu_q[gh * d + e] = 0;
  for (int e = threadIdx.x; e < R * d / 2; e += kThreads) o.basis_q[gh * R * (d / 2) + e] = 0;
  for (int e = threadIdx.x; e < S * R; e += kThreads) {
    o.coord_q[gh * S * R + e] = 0;
    if (extent) o.lo_q[gh * S * R + e] = o.hi_q[gh * S * R + e] = 0;
  }
  for (int e = threadIdx.x; e < S; e += kThreads) o.radius_q[gh * S + e] = 0;
  if (threadIdx.x < R) {
    o.basis_scale[gh * R + threadIdx.x] = nan;
    o.coord_scale[gh * R + threadIdx.x] = nan;
    if (extent) o.extent_scale[gh * R + threadIdx.x] = nan;
  }
  if (threadIdx.x == 0) o.mu_scale[gh] = o.radius_scale[gh] = nan;
}

// One page's 16 centred keys, loaded by the block into registers (kPer values a thread),
// so the loads of the next page are in flight while the current one is computed on.
template <int kD>
struct PageRegs {
  static constexpr int kPer = kP * kD / kThreads;
  float v[kPer];
  template <typename F>
  __device__ __forceinline__ void load(F&& key, int n0, const float* mean) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = threadIdx.x + i * kThreads;
      v[i] = key(n0 + e / kD, e % kD) - mean[e % kD];
    }
  }
  __device__ __forceinline__ void store(float* dst) const {
#pragma unroll
    for (int i = 0; i < kPer; ++i) dst[threadIdx.x + i * kThreads] = v[i];
  }
};

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    super_build_kernel(const T* __restrict__ keys, Work w, Out out, bool extent) {
  extern __shared__ float4 smem4[];
  float* A = reinterpret_cast<float*>(smem4);
  float* X = A + Smem::region_a(kD);  // [kD][kM]; with Y: a 16-key tile in the covariance pass
  float* Y = X + kD * kM;             // [kD][kM]; then W [R][kD]
  float* mean = Y + kD * kM;          // [kD]
  float* red = mean + kD;             // [2][warps][kM]
  float* scratch = red + 2 * kWarpsPerBlock * kM;        // [warps]
  float* Tm = scratch + kWarpsPerBlock;                  // [kM][kM] Rayleigh-Ritz matrix
  float* Vk = Tm + kM * kM;                              // [kMaxRank][kM] its top eigenvectors
  float* fk = Vk + kMaxRank * kM;                        // [kMaxRank] normalise-and-sign factors
  float* bscale = fk + kMaxRank;                         // [kMaxRank] basis scales
  int* blk = reinterpret_cast<int*>(bscale + kMaxRank);  // [kMaxS]

  const int tid = threadIdx.x;
  const int H = w.H, S = w.S, R = w.R, N = S * kP;
  const int64_t item = blockIdx.x / H;
  const int h = int(blockIdx.x % H);

  // 0. Ids: the whole group is skipped when one of them is out of range (or, filled mode, when
  // the sequence completed no group).
  int32_t slot;
  bool bad_id;
  if (w.group_blocks) {
    slot = w.slots[item];
    bad_id = !(slot >= 0 && slot < w.num_slots);
    if (tid < S) {
      const int32_t b = w.group_blocks[item * S + tid];
      blk[tid] = b;
      bad_id = bad_id || !(b >= 0 && b < w.num_blocks);
    }
  } else {
    const int g = completed_group(w, item);
    if (g < 0) return;  // uniform over the block
    slot = w.table[item * w.table_stride + g];
    bad_id = !(slot >= 0 && slot < w.num_slots);
    if (tid < S) {
      const int32_t b = w.block_table[item * w.bt_stride + int64_t(g) * S + tid];
      blk[tid] = b;
      bad_id = bad_id || !(b >= 0 && b < w.num_blocks);
    }
  }
  if (__syncthreads_or(bad_id)) return;
  const int64_t gh = int64_t(slot) * H + h;
  auto key = [&](int n, int c) {
    return to_float(keys[blk[n / kP] * w.block_stride + int64_t((n % kP) * H + h) * kD + c]);
  };

  // 1. Mean and finiteness (thread: column tid % kD of every kRows-th key).
  constexpr int kRows = kThreads / kD;
  {
    const int c = tid % kD;
    float s = 0.0f;
    bool bad = false;
    for (int n = tid / kD; n < N; n += kRows) {
      const float v = key(n, c);
      s += v;
      bad = bad || !isfinite(v);
    }
    A[tid] = s;
    if (__syncthreads_or(bad)) {
      write_poison(out, gh, kD, S, R, extent);
      return;
    }
    if (tid < kD) {
      float m = 0.0f;
#pragma unroll
      for (int q = 0; q < kRows; ++q) m += A[q * kD + tid];
      mean[tid] = m / float(N);
    }
    __syncthreads();
  }

  // 2. Covariance C = D^T D / N (D = keys - mean), packed upper triangle, 4 x 4 tiles a
  // thread, accumulated over pages of 16 centred keys staged in X / Y.
  {
    constexpr int nt = kD / 4, nT = nt * (nt + 1) / 2;
    constexpr int kMaxT = (nT + kThreads - 1) / kThreads;
    int ti[kMaxT], tj[kMaxT];
#pragma unroll
    for (int u = 0; u < kMaxT; ++u) {
      int t = tid + u * kThreads, i = 0;
      ti[u] = -1;
      tj[u] = 0;
      if (t < nT) {
        while (t >= nt - i) {
          t -= nt - i;
          ++i;
        }
        ti[u] = i;
        tj[u] = i + t;
      }
    }
    for (int e = tid; e < tri_size(kD); e += kThreads) A[e] = 0.0f;
    // Pages of keys double-buffered in X and Y ([kP][kD] each): page n + 1 loads while page n
    // is accumulated.
    PageRegs<kD> pr;
    pr.load(key, 0, mean);
    pr.store(X);
    const int pages = N / kP;
    for (int pg = 0; pg < pages; ++pg) {
      __syncthreads();  // page pg stored (and A zeroed); page pg - 1's buffer consumed
      const float* Kt = (pg & 1) ? Y : X;
      if (pg + 1 < pages) pr.load(key, (pg + 1) * kP, mean);
#pragma unroll
      for (int u = 0; u < kMaxT; ++u) {
        if (ti[u] < 0) continue;
        float acc[4][4] = {};
        for (int r = 0; r < kP; ++r) {
          const float4 a = reinterpret_cast<const float4*>(Kt + r * kD)[ti[u]];
          const float4 b = reinterpret_cast<const float4*>(Kt + r * kD)[tj[u]];
          const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
          for (int p = 0; p < 4; ++p)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[p][q] = fmaf(av[p], bv[q], acc[p][q]);
        }
#pragma unroll
        for (int p = 0; p < 4; ++p)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int i = 4 * ti[u] + p, j = 4 * tj[u] + q;
            if (i <= j) A[tri(i, j, kD)] += acc[p][q];
          }
      }
      if (pg + 1 < pages) pr.store((pg & 1) ? X : Y);
    }
    __syncthreads();
    const float invn = 1.0f / float(N);
    for (int e = tid; e < tri_size(kD); e += kThreads) A[e] *= invn;
    __syncthreads();
  }

  // 3. Subspace iteration; thread j < kD owns row j of X (registers, published to X).
  const bool own = tid < kD;
  const int j = tid;
  float x[kM];
#pragma unroll
  for (int c = 0; c < kM; ++c) x[c] = own ? start_value(j, c) : 0.0f;
  orthonormalize(x, red);
  float prev = -1.0f;
  for (int it = 0; it < kMaxIters; ++it) {
    if (own) store_row(X, j, x);
    __syncthreads();
    float y[kM];
    if (own) {
      cov_times<kD>(A, X, j, y);
    } else {
#pragma unroll
      for (int c = 0; c < kM; ++c) y[c] = 0.0f;
    }
    float tr = 0.0f;
#pragma unroll
    for (int c = 0; c < kM; ++c) tr = fmaf(x[c], y[c], tr);
    tr = block_sum(tr, scratch);  // also: every thread's reads of X are done
#pragma unroll
    for (int c = 0; c < kM; ++c) x[c] = y[c];
    orthonormalize(x, red);
    if (it + 1 >= kMinIters && tr - prev <= kTraceTol * tr) break;  // uniform: same tr bits
    prev = tr;
  }
  orthonormalize(x, red);  // once more: X orthonormal to fp32 precision for Rayleigh-Ritz

  // 4. Rayleigh-Ritz: T = X^T C X, its eigenvectors u_k, W_k = X u_k.
  if (own) store_row(X, j, x);
  __syncthreads();
  {
    float y[kM];
    if (own) {
      cov_times<kD>(A, X, j, y);
      store_row(Y, j, y);
    }
  }
  __syncthreads();
  {
    const int a = tid / kM, b = tid % kM;  // kM * kM == kThreads
    float t = 0.0f;
    for (int l = 0; l < kD; ++l) t = fmaf(X[l * kM + a], Y[l * kM + b], t);
    Tm[tid] = t;
  }
  __syncthreads();
  if (tid < 32) {
    const int i = tid & 15;
    float a[16], v[16];
#pragma unroll
    for (int c = 0; c < 16; ++c) a[c] = 0.5f * (Tm[i * kM + c] + Tm[c * kM + i]);
    sb::jacobi16_solve(a, v, i);
    const int rnk = sb::jacobi16_rank(sb::pick(a, i), i);
    for (int k = 0; k < R; ++k) {
      const unsigned m = __ballot_sync(sb::kFull, rnk == k) & 0xffffu;
      const int col = __ffs(m) - 1;
      if (tid < 16) Vk[k * kM + i] = sb::pick(v, col);
    }
  }
  __syncthreads();
  float* W = Y;  // [R][kD]
  if (own) {
    for (int k = 0; k < R; ++k) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < kM; ++c) s = fmaf(x[c], Vk[k * kM + c], s);
      W[k * kD + j] = s;
    }
  }
  __syncthreads();
  // Normalise and sign each W_k (largest |component|, first of equal ones, positive); its
  // int4 scale. One thread a row: d <= 256 steps, in index order (the CPU build's rule).
  if (tid < R) {
    const float* wk = W + tid * kD;
    float n2 = 0.0f, mx = -1.0f, at = 0.0f;
    for (int l = 0; l < kD; ++l) {
      n2 = fmaf(wk[l], wk[l], n2);
      if (fabsf(wk[l]) > mx) {
        mx = fabsf(wk[l]);
        at = wk[l];
      }
    }
    const float f = n2 > 0.0f ? (at < 0.0f ? -1.0f : 1.0f) * rsqrtf(n2) : 0.0f;
    fk[tid] = f;
    bscale[tid] = mx * fabsf(f) / 7.0f;
  }
  __syncthreads();
  for (int e = tid; e < R * kD; e += kThreads) W[e] *= fk[e / kD];
  __syncthreads();

  // 5. Codes of the centroid and the basis.
  {
    float m = own ? fabsf(mean[j]) : 0.0f;
    m = detail::warp_max(m);
    if ((tid & 31) == 0) scratch[tid >> 5] = m;
    __syncthreads();
    float mx = 0.0f;
#pragma unroll
    for (int q = 0; q < kWarpsPerBlock; ++q) mx = fmaxf(mx, scratch[q]);
    const float s = mx / 127.0f;
    if (own) out.mu_q[gh * kD + j] = code8(mean[j], s);
    if (tid == 0) out.mu_scale[gh] = s;
    if (tid < R) out.basis_scale[gh * R + tid] = bscale[tid];
    for (int e = tid; e < R * (kD / 2); e += kThreads) {
      const int k = e / (kD / 2), p = e % (kD / 2);
      const float s4 = bscale[k];
      int lo = 0, hi = 0;
      if (s4 != 0.0f) {
        lo = max(-7, min(7, __float2int_rn(W[k * kD + 2 * p] / s4)));
        hi = max(-7, min(7, __float2int_rn(W[k * kD + 2 * p + 1] / s4)));
      }
      out.basis_q[(gh * R + k) * (kD / 2) + p] =
          uint8_t((unsigned(lo) & 0xFu) | ((unsigned(hi) & 0xFu) << 4));
    }
    __syncthreads();  // scratch reused below
  }

  // 6. Per page: its centroid's coordinates a_p = W dev_p (dev_p = page centroid - mean), the
  // residual radius |dev_p - W^T a_p| and the extent of its keys along each W_k.
  float* Kb = A;                      // [2][kP][kD] centred keys of a page (two buffers)
  float* cval = Kb + 2 * kP * kD;     // [kP][kMaxRank] W_k . (key - mean)
  float* dev = cval + kP * kMaxRank;  // [kD]
  float* coord = dev + kD;            // [kMaxS][kMaxRank]
  float* lo = coord + kMaxS * kMaxRank;
  float* hi = lo + kMaxS * kMaxRank;
  float* radius = hi + kMaxS * kMaxRank;  // [kMaxS]
  {
    PageRegs<kD> pr;
    pr.load(key, 0, mean);
    pr.store(Kb);
    for (int p = 0; p < S; ++p) {
      __syncthreads();  // page p stored
      const float* Kp = Kb + (p & 1) * kP * kD;
      if (p + 1 < S) pr.load(key, (p + 1) * kP, mean);
      if (own) {
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < kP; ++t) s += Kp[t * kD + j];
        dev[j] = s * (1.0f / kP);
      }
      {
        // (key t, k) pairs (<= 128) on two threads each, half the dims apiece.
        const int pair = tid >> 1, hf = tid & 1, t = pair / R, k = pair % R;
        float s = 0.0f;
        if (pair < kP * R) {
          const float* kr = Kp + t * kD + hf * (kD / 2);
          const float* wr = W + k * kD + hf * (kD / 2);
#pragma unroll 8
          for (int l = 0; l < kD / 2; ++l) s = fmaf(kr[l], wr[l], s);
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (pair < kP * R && hf == 0) cval[t * kMaxRank + k] = s;
      }
      if (p + 1 < S) pr.store(Kb + ((p + 1) & 1) * kP * kD);
      __syncthreads();
      if (tid < R) {
        float s = 0.0f, mn = cval[tid], mxv = cval[tid];
#pragma unroll
        for (int t = 0; t < kP; ++t) {
          const float v = cval[t * kMaxRank + tid];
          s += v;
          mn = fminf(mn, v);
          mxv = fmaxf(mxv, v);
        }
        coord[p * kMaxRank + tid] = s * (1.0f / kP);  // = W_k . dev_p (the mean of the keys')
        lo[p * kMaxRank + tid] = mn;
        hi[p * kMaxRank + tid] = mxv;
      }
      __syncthreads();
      float r = 0.0f;
      if (own) {
        r = dev[j];
        for (int k = 0; k < R; ++k) r = fmaf(-coord[p * kMaxRank + k], W[k * kD + j], r);
      }
      const float r2 = block_sum(r * r, scratch);
      if (tid == 0) radius[p] = sqrtf(r2);
    }
  }
  __syncthreads();

  // 7. Codes of the coordinates (int8, a scale per k), radii (uint8 rounded up) and extents
  // (int8 rounded outward: lo down, hi up, so the box survives the codes).
  if (tid < R) {
    float mc = 0.0f, me = 0.0f;
    for (int p = 0; p < S; ++p) {
      mc = fmaxf(mc, fabsf(coord[p * kMaxRank + tid]));
      me = fmaxf(me, fmaxf(fabsf(lo[p * kMaxRank + tid]), fabsf(hi[p * kMaxRank + tid])));
    }
    out.coord_scale[gh * R + tid] = mc / 127.0f;
    fk[tid] = mc / 127.0f;
    if (extent) out.extent_scale[gh * R + tid] = me / 127.0f;
    bscale[tid] = me / 127.0f;
  }
  if (tid == 0) {
    float mr = 0.0f;
    for (int p = 0; p < S; ++p) mr = fmaxf(mr, radius[p]);
    out.radius_scale[gh] = mr / 255.0f;
    scratch[0] = mr / 255.0f;
  }
  __syncthreads();
  for (int e = tid; e < S * R; e += kThreads) {
    const int p = e / R, k = e % R;
    out.coord_q[gh * S * R + e] = code8(coord[p * kMaxRank + k], fk[k]);
    if (extent) {
      const float s = bscale[k];
      int cl = 0, ch = 0;
      if (s != 0.0f) {
        // A relative slack of 1e-5 keeps exact multiples of the scale from moving a step.
        cl = max(-127, min(127, int(floorf(lo[p * kMaxRank + k] / s + 1e-5f))));
        ch = max(-127, min(127, int(ceilf(hi[p * kMaxRank + k] / s - 1e-5f))));
      }
      out.lo_q[gh * S * R + e] = int8_t(cl);
      out.hi_q[gh * S * R + e] = int8_t(ch);
    }
  }
  for (int p = tid; p < S; p += kThreads) {
    const float s = scratch[0];
    out.radius_q[gh * S + p] =
        s == 0.0f ? 0 : uint8_t(max(0, min(255, int(ceilf(radius[p] / s - 1e-5f)))));
  }
}

template <typename T, int kD>
void launch_t(const T* k, const Work& w, const Out& o, bool extent, int64_t blocks,
              cudaStream_t st) {
  const size_t sm = size_t(Smem::floats(kD)) * sizeof(float);
  // Above the default 48 KB (d 128, 256) the kernel needs the attribute (host call, no sync).
  if (sm > 48 * 1024)
    LOCKS_CUDA_CHECK(cudaFuncSetAttribute(super_build_kernel<T, kD>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
  super_build_kernel<T, kD><<<unsigned(blocks), kThreads, sm, st>>>(k, w, o, extent);
  LOCKS_CUDA_LAUNCHED();
}

template <typename T>
void launch_d(const T* k, int d, const Work& w, const Out& o, bool extent, int64_t blocks,
              cudaStream_t st) {
  if (d == 64)
    launch_t<T, 64>(k, w, o, extent, blocks, st);
  else if (d == 128)
    launch_t<T, 128>(k, w, o, extent, blocks, st);
  else
    launch_t<T, 256>(k, w, o, extent, blocks, st);
}

}  // namespace

bool super_build_supported(const SuperLayout& l) {
  return l.page_size == kP && l.group_pages <= kMaxS && l.rank <= kMaxRank &&
         (l.head_dim == 64 || l.head_dim == 128 || l.head_dim == 256);
}

namespace {

// The checks both entry points share (host-visible values only).
void check_build(const KvCacheView& cache, const SuperView& out, const char* where) {
  const SuperLayout& l = out.layout;
  validate_super_layout(l);
  validate_cache(cache);
  if (cache.k == nullptr) locks::detail::fail(where, "cache.k is null");
  if (!(cache.layout.page_size == l.page_size && cache.layout.num_kv_heads == l.num_kv_heads &&
        cache.layout.head_dim == l.head_dim))
    locks::detail::fail(where, "super layout (page_size ", l.page_size, ", kv heads ",
                        l.num_kv_heads, ", head_dim ", l.head_dim, ") does not match the cache");
  if (!super_build_supported(l))
    locks::detail::fail_as<Unsupported>(
        where,
        "the CUDA super build needs page_size 16, S <= 64, rank <= 8 and head_dim 64, 128 or "
        "256; got page_size ",
        l.page_size, ", S ", l.group_pages, ", rank ", l.rank, ", head_dim ", l.head_dim,
        " (cpu::super_build serves every layout)");
  if (!(out.mu_q && out.mu_scale && out.basis_q && out.basis_scale && out.coord_q &&
        out.coord_scale && out.radius_q && out.radius_scale))
    locks::detail::fail(where, "super summary arrays are null");
  if (l.extent && !(out.lo_q && out.hi_q && out.extent_scale))
    locks::detail::fail(where, "extent arrays are null");
}

void launch_build(const KvCacheView& cache, const SuperView& out, const Work& w, int64_t items,
                  cudaStream_t stream) {
  const SuperLayout& l = out.layout;
  const int64_t blocks = items * l.num_kv_heads;
  LOCKS_REQUIRE(blocks < (int64_t(1) << 31), "too many groups in one call: ", items);
  const Out o{out.mu_q,    out.mu_scale,    out.basis_q,     out.basis_scale,
              out.coord_q, out.coord_scale, out.radius_q,    out.radius_scale,
              out.lo_q,    out.hi_q,        out.extent_scale};
  switch (cache.layout.dtype) {
    case DType::f32:
      launch_d(static_cast<const float*>(cache.k), l.head_dim, w, o, l.extent, blocks, stream);
      break;
    case DType::f16:
      launch_d(static_cast<const __half*>(cache.k), l.head_dim, w, o, l.extent, blocks, stream);
      break;
    default:
      launch_d(static_cast<const __nv_bfloat16*>(cache.k), l.head_dim, w, o, l.extent, blocks,
               stream);
      break;
  }
}

Work base_work(const KvCacheView& cache, const SuperLayout& l) {
  Work w{};
  w.num_blocks = cache.layout.num_blocks;
  w.num_slots = l.num_slots;
  w.block_stride = cache.block_step();
  w.H = l.num_kv_heads;
  w.S = l.group_pages;
  w.R = l.rank;
  return w;
}

}  // namespace

void super_build(const KvCacheView& cache, const int32_t* group_blocks, const int32_t* slots,
                 int64_t n, const SuperView& out, cudaStream_t stream) {
  check_build(cache, out, __func__);
  LOCKS_REQUIRE(n >= 0, "n must be >= 0, got ", n);
  if (n == 0) return;
  LOCKS_REQUIRE(group_blocks != nullptr && slots != nullptr, "group_blocks / slots are null");
  Work w = base_work(cache, out.layout);
  w.group_blocks = group_blocks;
  w.slots = slots;
  launch_build(cache, out, w, n, stream);
}

void super_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                        const SuperTableView& table, const SuperView& out, cudaStream_t stream) {
  check_build(cache, out, __func__);
  const SuperLayout& l = out.layout;
  const int groups = locks::detail::check_filled_args(l, batch, appended, table, __func__);
  Work w = base_work(cache, l);
  w.block_table = batch.block_table;
  w.bt_stride = batch.block_table_stride;
  w.seq_lens = batch.seq_lens;
  w.max_blocks = batch.max_blocks_per_seq;
  w.appended = appended;
  w.table = table.table;
  w.table_stride = table.stride;
  w.max_groups = groups;
  launch_build(cache, out, w, batch.batch_size, stream);
}

}  // namespace locks::cuda

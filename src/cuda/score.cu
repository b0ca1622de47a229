// Page scoring on the GPU: s_j = log sum_i exp(scale * (q.mu_j + (V_j q).c_i)) for every
// full page j and query head, plus per-chunk log-sum-exp partials for the GQA aggregation.
//
// Two kernels, one block per (chunk of 128 pages, KV head, sequence) so the grid depends on
// the plan only; pages past the sequence get -inf:
//  * score_mma (quant summaries, rank 8, P 16, d 64/128): the three per-page products run
//    on the tensor cores (mma.sync m16n8k16, fp16 in, fp32 accumulate). The int8/int4 codes
//    are exact in fp16; the query (and the projected query) is split into fp16 hi + lo
//    columns, so the products keep about 22 bits: as accurate as fp32 CUDA-core code.
//    Products: [2 pages x 8 basis rows] x [d x 2G] (V q), [16 pages] x [d x 2G] (q.mu),
//    [16 keys x (8 codes, twice)] x [(8 hi; 8 lo) x G] (the per-key logits).
//  * score_generic (fp32 summaries or other shapes): CUDA cores, one warp per page.
#include <cstdint>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"

namespace locks::cuda::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

struct SumView {  // the summary arrays, by value for kernels
  const float* mu;
  const float* basis;
  const float* coeff;
  const int8_t* mu_q;
  const float* mu_scale;
  const uint8_t* basis_q;
  const float* basis_scale;
  const int8_t* coeff_q;
  const float* coeff_scale;
};

SumView sum_view(const SummaryView& s) {
  return {s.mu,      s.basis,       s.coeff,   s.mu_q,       s.mu_scale,
          s.basis_q, s.basis_scale, s.coeff_q, s.coeff_scale};
}

// 2^-e normaliser so that max |x| * f lies in [1, 2) (1 for 0 or non-normal values).
__device__ __forceinline__ float pow2_normaliser(float mx) {
  const int e = int((__float_as_uint(mx) >> 23) & 0xffu) - 127;
  if (mx == 0.0f || e <= -126 || e >= 127) return 1.0f;
  return __uint_as_float(uint32_t(127 - e) << 23);
}

// Writes the chunk's scores (smem sc[g][128]) to head_scores and the chunk LSE partials.
__device__ void write_chunk(const float* sc, int G, int b, int h, int Hq, int M, int chunk,
                            int n_chunks, float* head_scores, float* chunk_lse) {
  const int j0 = chunk * kScoreChunk;
  for (int e = threadIdx.x; e < G * kScoreChunk; e += blockDim.x) {
    const int g = e / kScoreChunk, jj = e % kScoreChunk;
    if (j0 + jj < M) head_scores[(int64_t(b) * Hq + h * G + g) * M + j0 + jj] = sc[e];
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int g = warp; g < G; g += nw) {
    float m = kNegInf;
    for (int jj = lane; jj < kScoreChunk; jj += 32) m = fmaxf(m, sc[g * kScoreChunk + jj]);
    m = warp_max(m);
    float l = 0.0f;
    if (m != kNegInf)
      for (int jj = lane; jj < kScoreChunk; jj += 32) l += __expf(sc[g * kScoreChunk + jj] - m);
    l = warp_sum(l);
    if (lane == 0) {
      float* o = chunk_lse + ((int64_t(b) * Hq + h * G + g) * n_chunks + chunk) * 2;
      o[0] = m;
      o[1] = l;
    }
  }
}

// ---------------------------------------------------------------- generic (CUDA cores)
constexpr int kGenWarps = 4;
constexpr int kGenericSmemMax = 160 * 1024;

__global__ void __launch_bounds__(kGenWarps * 32)
    score_generic(SumView S, bool quant, int H, int d, int r, int P, const int32_t* block_table,
                  int64_t bt_stride, const int32_t* seq_lens, int M, const float* __restrict__ q,
                  int Hq, float scale, float* head_scores, float* chunk_lse, int n_chunks) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int G = Hq / H, ld = d + 1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* qs = sm;                    // [G][ld], pre-multiplied by scale * log2(e)
  float* sc = qs + G * ld;           // [G][128]
  float* wb = sc + G * kScoreChunk;  // per warp: rows[(r + 1)][ld] (basis rows, then mu),
  const int per_warp = (r + 1) * ld + P * r + (r + 1) * G;  // coeff[P][r], Y[(r + 1)][G]
  float* rows = wb + warp * per_warp;
  float* cf = rows + (r + 1) * ld;
  float* Y = cf + P * r;

  for (int e = threadIdx.x; e < G * d; e += blockDim.x) {
    const int g = e / d, c = e % d;
    qs[g * ld + c] = q[(int64_t(b) * Hq + h * G + g) * d + c] * (scale * kLog2e);
  }
  __syncthreads();
  const int n_full = seq_lens[b] / P;
  for (int jj = warp; jj < kScoreChunk; jj += kGenWarps) {
    const int j = chunk * kScoreChunk + jj;
    if (j >= n_full || j >= M) {  // warp-uniform
      for (int g = lane; g < G; g += 32) sc[g * kScoreChunk + jj] = kNegInf;
      continue;
    }
    const int64_t bh = int64_t(block_table[int64_t(b) * bt_stride + j]) * H + h;
    // Stage the (dequantized) summary.
    for (int e = lane; e < r * d; e += 32) {
      const int k = e / d, c = e % d;
      float x;
      if (!quant) {
        x = S.basis[bh * r * d + e];
      } else {
        const uint8_t byte = S.basis_q[(bh * r + k) * (d / 2) + c / 2];
        const int code = (c & 1) ? (int(int8_t(byte)) >> 4) : (int(int8_t(byte << 4)) >> 4);
        x = float(code) * S.basis_scale[bh * r + k];
      }
      rows[k * ld + c] = x;
    }
    for (int c = lane; c < d; c += 32)
      rows[r * ld + c] = quant ? float(S.mu_q[bh * d + c]) * S.mu_scale[bh] : S.mu[bh * d + c];
    for (int e = lane; e < P * r; e += 32)
      cf[e] = quant ? float(S.coeff_q[bh * P * r + e]) * S.coeff_scale[bh * r + e % r]
                    : S.coeff[bh * P * r + e];
    __syncwarp();
    // Y[k][g] = row_k . q_g (row r is mu).
    for (int e = lane; e < (r + 1) * G; e += 32) {
      const int k = e % (r + 1), g = e / (r + 1);
      float acc = 0.0f;
      for (int c = 0; c < d; ++c) acc = fmaf(rows[k * ld + c], qs[g * ld + c], acc);
      Y[k * G + g] = acc;
    }
    __syncwarp();
    // Per key logits and the page's log-sum-exp, two heads per pass (one per half-warp).
    const int half = lane >> 4, i = lane & 15;
    for (int g0 = 0; g0 < G; g0 += 2) {
      const int g = g0 + half;
      float x = kNegInf;
      if (g < G && i < P) {
        x = Y[r * G + g];
        for (int k = 0; k < r; ++k) x = fmaf(Y[k * G + g], cf[i * r + k], x);
      }
      float m = x;
      for (int o = 8; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o, 16));
      float l = (x == kNegInf) ? 0.0f : exp2f(x - m);
      for (int o = 8; o > 0; o >>= 1) l += __shfl_xor_sync(kFull, l, o, 16);
      if (i == 0 && g < G) sc[g * kScoreChunk + jj] = (m + log2f(l)) * kLn2;
    }
    __syncwarp();
  }
  __syncthreads();
  write_chunk(sc, G, b, h, Hq, M, chunk, n_chunks, head_scores, chunk_lse);
}

// ---------------------------------------------------------------- tensor cores (quant)
constexpr int kMmaWarps = 8;  // 8 warps x 16 pages = one 128-page chunk

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float hi_part(float x) { return __half2float(__float2half_rn(x)); }

// Eight int4 codes of a word -> four half2 (dims 8w+m and 8w+m+4 for m = 0..3), exact.
__device__ __forceinline__ void int4x8_to_half2(uint32_t w, uint32_t (&out)[4]) {
  const uint32_t x = w ^ 0x88888888u;  // two's complement nibble v -> v + 8 in [0, 15]
  const __half2 bias = __floats2half2_rn(1032.0f, 1032.0f);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t u = ((x >> (4 * m)) & 0x000F000Fu) | 0x64006400u;  // 1024 + (v + 8)
    __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&u), bias);
    out[m] = *reinterpret_cast<const uint32_t*>(&h);
  }
}
// Eight int8 codes (words a: dims 8v..8v+3, b: 8v+4..8v+7) -> four half2 with the same
// (dim m, dim m + 4) pairing as int4x8_to_half2, exact.
__device__ __forceinline__ void int8x8_to_half2(uint32_t a, uint32_t b, uint32_t (&out)[4]) {
  const __half2 bias = __floats2half2_rn(1152.0f, 1152.0f);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t p = __byte_perm(a, b, uint32_t(m) | (uint32_t(4 + m) << 8));
    const uint32_t u = (p & 0x00FF00FFu) ^ 0x64806480u;  // 1024 + (v + 128)
    __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&u), bias);
    out[m] = *reinterpret_cast<const uint32_t*>(&h);
  }
}
__device__ __forceinline__ uint32_t int8_pair_half2(int8_t v) {
  const __half h = __int2half_rn(int(v));
  const __half2 h2 = __halves2half2(h, h);
  return *reinterpret_cast<const uint32_t*>(&h2);
}

// D = head_dim, NT1 = n-tiles of 8 columns (4 heads x {hi, lo}) in the V q product.
template <int D, int NT1>
__global__ void __launch_bounds__(kMmaWarps * 32)
    score_mma(SumView S, int H, const int32_t* __restrict__ block_table, int64_t bt_stride,
              const int32_t* __restrict__ seq_lens, int M, const float* __restrict__ q, int Hq,
              float scale, float* head_scores, float* chunk_lse, int n_chunks) {
  constexpr int KS = D / 16;          // k-steps over the head dim
  constexpr int R = 8, P = 16;        // rank, page size
  constexpr int NT3 = (NT1 + 1) / 2;  // n-tiles of 8 heads in the per-key product
  constexpr int GMAX = 4 * NT1;
  __shared__ float qs[GMAX][D + 4];
  __shared__ float unscale[GMAX];
  __shared__ float sc[GMAX * kScoreChunk];
  __shared__ float mt[kMmaWarps][P][GMAX + 1];     // q.mu per page of the warp's tile
  __shared__ float wy[kMmaWarps][2][R][GMAX + 1];  // scaled (V q)_k per page of the pair

  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int G = Hq / H;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gid = lane >> 2, tig = lane & 3;

  // Query rows (scaled to log2 units), normalised per head by a power of two.
  for (int g = warp; g < GMAX; g += kMmaWarps) {
    float mx = 0.0f;
    for (int c = lane; c < D; c += 32) {
      const float x = g < G ? q[(int64_t(b) * Hq + h * G + g) * D + c] * (scale * kLog2e) : 0.0f;
      qs[g][c] = x;
      mx = fmaxf(mx, fabsf(x));
    }
    const float f = pow2_normaliser(warp_max(mx));
    for (int c = lane; c < D; c += 32) qs[g][c] *= f;
    if (lane == 0) unscale[g] = 1.0f / f;
  }
  __syncthreads();

  // B fragments of the query: column n = gid of n-tile nt is head nt*4 + gid/2, hi or lo.
  uint32_t bq[NT1][KS][2];
#pragma unroll
  for (int nt = 0; nt < NT1; ++nt) {
    const int g = nt * 4 + (gid >> 1);
    const bool lo = gid & 1;
#pragma unroll
    for (int s = 0; s < KS; ++s) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int ri = 2 * s + x;
        const int dim = (D / 4) * tig + 8 * (ri / 4) + (ri % 4);
        const float v0 = qs[g][dim], v1 = qs[g][dim + 4];
        const float e0 = lo ? v0 - hi_part(v0) : v0, e1 = lo ? v1 - hi_part(v1) : v1;
        bq[nt][s][x] = pack_half2(e0, e1);
      }
    }
  }

  const int n_full = seq_lens[b] / P;
  const int j0 = chunk * kScoreChunk + warp * 16;
  const int32_t* bt = block_table + int64_t(b) * bt_stride;
  auto page_bh = [&](int j) -> int64_t { return int64_t(bt[j]) * H + h; };

  if (j0 < n_full) {  // warp-uniform; pages j >= n_full inside the tile are masked
    // (a) q.mu for the tile's 16 pages: rows gid and gid + 8.
    {
      uint32_t ra[2][KS * 2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = j0 + gid + 8 * x;
        uint32_t w[D / 16];
        if (j < n_full) {
          const uint4* src =
              reinterpret_cast<const uint4*>(S.mu_q + page_bh(j) * D + (D / 4) * tig);
#pragma unroll
          for (int v = 0; v < D / 64; ++v) {
            const uint4 u = src[v];
            w[4 * v] = u.x, w[4 * v + 1] = u.y, w[4 * v + 2] = u.z, w[4 * v + 3] = u.w;
          }
        } else {
#pragma unroll
          for (int v = 0; v < D / 16; ++v) w[v] = 0u;  // codes 0
        }
#pragma unroll
        for (int v = 0; v < D / 32; ++v) {
          uint32_t o[4];
          int8x8_to_half2(w[2 * v], w[2 * v + 1], o);
#pragma unroll
          for (int m = 0; m < 4; ++m) ra[x][4 * v + m] = o[m];
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT1; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < KS; ++s)
          mma16816(acc, ra[0][2 * s], ra[1][2 * s], ra[0][2 * s + 1], ra[1][2 * s + 1],
                   bq[nt][s][0], bq[nt][s][1]);
        const int g = nt * 4 + tig;
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int j = j0 + gid + 8 * x;
          const float ms = j < n_full ? S.mu_scale[page_bh(j)] : 0.0f;
          mt[warp][gid + 8 * x][g] = (acc[2 * x] + acc[2 * x + 1]) * ms * unscale[g];
        }
      }
    }
    __syncwarp();

    // (b, c) pairs of pages: V q on the tensor cores, then the per-key logits.
    for (int p = 0; p < 16; p += 2) {
      uint32_t ra[2][KS * 2];
      float wsc[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int j = j0 + p + x;
        uint32_t w[D / 32];
        if (j < n_full) {
          const int64_t bh = page_bh(j);
          const uint8_t* src = S.basis_q + (bh * R + gid) * (D / 2) + (D / 8) * tig;
          if constexpr (D == 128) {
            const uint4 u = *reinterpret_cast<const uint4*>(src);
            w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
          } else {
            const uint2 u = *reinterpret_cast<const uint2*>(src);
            w[0] = u.x, w[1] = u.y;
          }
          wsc[x] = S.basis_scale[bh * R + gid] * S.coeff_scale[bh * R + gid];
        } else {
#pragma unroll
          for (int v = 0; v < D / 32; ++v) w[v] = 0u;  // codes 0
          wsc[x] = 0.0f;
        }
#pragma unroll
        for (int v = 0; v < D / 32; ++v) {
          uint32_t o[4];
          int4x8_to_half2(w[v], o);
#pragma unroll
          for (int m = 0; m < 4; ++m) ra[x][4 * v + m] = o[m];
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT1; ++nt) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int s = 0; s < KS; ++s)
          mma16816(acc, ra[0][2 * s], ra[1][2 * s], ra[0][2 * s + 1], ra[1][2 * s + 1],
                   bq[nt][s][0], bq[nt][s][1]);
        const int g = nt * 4 + tig;
        wy[warp][0][gid][g] = (acc[0] + acc[1]) * wsc[0] * unscale[g];
        wy[warp][1][gid][g] = (acc[2] + acc[3]) * wsc[1] * unscale[g];
      }
      __syncwarp();
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int jj = p + x, j = j0 + jj;
        if (j >= n_full) {  // warp-uniform
          for (int g = lane; g < GMAX; g += 32) sc[g * kScoreChunk + warp * 16 + jj] = kNegInf;
          continue;
        }
        const int64_t bh = page_bh(j);
        // Normalise the projected query of this page by a power of two (fp16 range).
        float mx = 0.0f;
        for (int e = lane; e < R * GMAX; e += 32)
          mx = fmaxf(mx, fabsf(wy[warp][x][e / GMAX][e % GMAX]));
        const float f = pow2_normaliser(warp_max(mx));
        const int8_t* cq = S.coeff_q + bh * P * R;
        const char2 c0 = *reinterpret_cast<const char2*>(cq + gid * R + 2 * tig);
        const char2 c1 = *reinterpret_cast<const char2*>(cq + (gid + 8) * R + 2 * tig);
        const uint32_t a0 = int8_pair_half2(c0.x), a1 = int8_pair_half2(c1.x);
        const uint32_t a2 = int8_pair_half2(c0.y), a3 = int8_pair_half2(c1.y);
#pragma unroll
        for (int nt = 0; nt < NT3; ++nt) {
          const int gb = nt * 8 + gid;  // B column = head
          uint32_t b0 = 0, b1 = 0;
          if (gb < GMAX) {
            const float w0 = wy[warp][x][2 * tig][gb] * f, w1 = wy[warp][x][2 * tig + 1][gb] * f;
            b0 = pack_half2(hi_part(w0), w0 - hi_part(w0));
            b1 = pack_half2(hi_part(w1), w1 - hi_part(w1));
          }
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
          mma16816(acc, a0, a1, a2, a3, b0, b1);
          const float inv = 1.0f / f;
#pragma unroll
          for (int y = 0; y < 2; ++y) {
            const int g = nt * 8 + 2 * tig + y;
            const float base = g < GMAX ? mt[warp][jj][g] : 0.0f;
            const float x0 = acc[y] * inv + base, x1 = acc[2 + y] * inv + base;
            float m = fmaxf(x0, x1);
            m = fmaxf(m, __shfl_xor_sync(kFull, m, 4));
            m = fmaxf(m, __shfl_xor_sync(kFull, m, 8));
            m = fmaxf(m, __shfl_xor_sync(kFull, m, 16));
            float l = exp2f(x0 - m) + exp2f(x1 - m);
            l += __shfl_xor_sync(kFull, l, 4);
            l += __shfl_xor_sync(kFull, l, 8);
            l += __shfl_xor_sync(kFull, l, 16);
            if (gid == 0 && g < GMAX) sc[g * kScoreChunk + warp * 16 + jj] = (m + log2f(l)) * kLn2;
          }
        }
      }
      __syncwarp();
    }
  } else {
    for (int e = lane; e < GMAX * 16; e += 32)
      sc[(e / 16) * kScoreChunk + warp * 16 + e % 16] = kNegInf;
  }
  __syncthreads();
  write_chunk(sc, G, b, h, Hq, M, chunk, n_chunks, head_scores, chunk_lse);
}

template <int D, int NT1>
void launch_mma(const SummaryView& s, const BatchView& batch, const float* q, int Hq, float scale,
                float* hs, float* cl, int n_chunks, cudaStream_t st) {
  const int H = s.layout.num_kv_heads;
  const dim3 grid(unsigned(ceil_div(batch.max_blocks_per_seq, kScoreChunk)), unsigned(H),
                  unsigned(batch.batch_size));
  score_mma<D, NT1><<<grid, kMmaWarps * 32, 0, st>>>(
      sum_view(s), H, batch.block_table, batch.block_table_stride, batch.seq_lens,
      batch.max_blocks_per_seq, q, Hq, scale, hs, cl, n_chunks);
}

template <int D>
void launch_mma_g(const SummaryView& s, const BatchView& batch, const float* q, int Hq, float scale,
                  float* hs, float* cl, int n_chunks, cudaStream_t st) {
  const int G = Hq / s.layout.num_kv_heads;
  if (G <= 4)
    launch_mma<D, 1>(s, batch, q, Hq, scale, hs, cl, n_chunks, st);
  else if (G <= 8)
    launch_mma<D, 2>(s, batch, q, Hq, scale, hs, cl, n_chunks, st);
  else
    launch_mma<D, 4>(s, batch, q, Hq, scale, hs, cl, n_chunks, st);
}

}  // namespace

void prepare_score_kernels() {
  LOCKS_CUDA_CHECK(cudaFuncSetAttribute(score_generic, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kGenericSmemMax));
}

bool score_uses_tensor_cores(const SummaryLayout& s, int group) {
  return s.precision == Precision::quant && s.rank == 8 && s.page_size == 16 &&
         (s.head_dim == 64 || s.head_dim == 128) && group >= 1 && group <= 16;
}

void launch_score(const SummaryView& s, const BatchView& batch, const float* q, int Hq, float scale,
                  float* head_scores, float* chunk_lse, int n_chunks, bool allow_tc,
                  cudaStream_t st) {
  const SummaryLayout& L = s.layout;
  const int H = L.num_kv_heads, G = Hq / H;
  if (allow_tc && score_uses_tensor_cores(L, G)) {
    if (L.head_dim == 128)
      launch_mma_g<128>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, st);
    else
      launch_mma_g<64>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, st);
  } else {
    const int d = L.head_dim, r = L.rank, P = L.page_size;
    const size_t smem =
        sizeof(float) * (size_t(G) * (d + 1) + size_t(G) * kScoreChunk +
                         size_t(kGenWarps) * ((r + 1) * (d + 1) + P * r + (r + 1) * G));
    LOCKS_REQUIRE(smem <= size_t(kGenericSmemMax), "generic scoring needs ", smem,
                  " bytes of shared memory (max ", kGenericSmemMax, ")");
    const dim3 grid(unsigned(ceil_div(batch.max_blocks_per_seq, kScoreChunk)), unsigned(H),
                    unsigned(batch.batch_size));
    score_generic<<<grid, kGenWarps * 32, smem, st>>>(
        sum_view(s), L.precision == Precision::quant, H, d, r, P, batch.block_table,
        batch.block_table_stride, batch.seq_lens, batch.max_blocks_per_seq, q, Hq, scale,
        head_scores, chunk_lse, n_chunks);
  }
  LOCKS_CUDA_LAUNCHED();
}

}  // namespace locks::cuda::detail

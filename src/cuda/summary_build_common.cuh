// Pieces shared by the two summary-build kernels (summary_build.cu): the work description
// (a list of blocks, or the pages the last appended tokens completed), the output arrays,
// the round-robin Jacobi schedule and the key loader.
#pragma once

#include "common.cuh"

namespace locks::cuda::sb {

constexpr int kP = 16;          // page size (rows of the Gram matrix)
constexpr int kMaxD = 256;      // largest head_dim (shared-memory key tiles, epilogue lanes)
constexpr int kMaxSweeps = 10;  // Jacobi sweeps cap (fp32 converges in about 5-7)
constexpr unsigned kFull = 0xffffffffu;

struct Work {
  // list mode: block ids; filled mode: the batch (block_table / seq_lens) and `appended`.
  const int32_t* block_ids;
  int64_t n_items;  // blocks (list) or sequences (filled)
  const int32_t* block_table;
  int64_t bt_stride;
  const int32_t* seq_lens;
  int appended;
  bool filled;
  // slots mode (summary_build_slots): item i is slot slots[i] (block * P + offset, negative
  // = padding); it builds block slot / P when offset == P - 1 and the block is < num_blocks.
  const int32_t* slots = nullptr;
  // Every mode: block ids outside [0, num_blocks) are skipped (never read or written);
  // filled mode: lengths outside [1, max_blocks * kP] (the block-table row) are skipped.
  int64_t num_blocks = 0;
  int64_t max_blocks = 0;
  // Elements from one cache block to the next (KvCacheView::block_step; set by the launchers).
  int64_t block_stride = 0;
};

struct Out {
  float* mu;
  float* basis;
  float* coeff;
  int8_t* mu_q;
  float* mu_scale;
  uint8_t* basis_q;
  float* basis_scale;
  int8_t* coeff_q;
  float* coeff_scale;
  bool quant;
  const float* qweight;  // [H, d] query weights of query-weighted summaries, or nullptr
  int basis_group;       // dims per int4 basis scale (layout.basis_group; d = one a row)
};

// Physical block of problem item (or -1 when there is nothing to build).
__device__ __forceinline__ int32_t resolve_block(const Work& w, int64_t item) {
  if (item >= w.n_items) return -1;
  if (w.slots) {
    const int32_t s = w.slots[item];
    return (s >= 0 && s % kP == kP - 1 && s / kP < w.num_blocks) ? s / kP : -1;
  }
  int32_t blk;
  if (!w.filled) {
    blk = w.block_ids[item];
  } else {
    const int32_t len = w.seq_lens[item];
    if (len < 1 || len > w.max_blocks * kP) return -1;  // untrusted length: skip the sequence
    const int32_t before = max(len - w.appended, 0);
    if (len / kP == before / kP) return -1;  // no page completed by the last tokens
    blk = w.block_table[item * w.bt_stride + (len / kP - 1)];
  }
  return blk >= 0 && blk < w.num_blocks ? blk : -1;  // untrusted block id: skip it
}

// Partner of index i in round t of the round-robin schedule (15 rounds of 8 disjoint pairs).
constexpr __host__ __device__ int rr_partner(int i, int t) {
  return i == 15 ? t : (i == t ? 15 : (2 * t - i + 15) % 15);
}

// One 16-byte vector of a key row, converted to fp32 in shared memory.
template <typename T>
__device__ __forceinline__ void load_row_vec(const T* src, float* dst, int n_vec_lane_idx) {
  constexpr int kPer = 16 / sizeof(T);
  const uint4 u = reinterpret_cast<const uint4*>(src)[n_vec_lane_idx];
  const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int x = 0; x < kPer; ++x) dst[n_vec_lane_idx * kPer + x] = detail::to_float(e[x]);
}

}  // namespace locks::cuda::sb

namespace locks::cuda::sb {

// Epilogue of one (page, KV head) problem, one warp per call (lanes stride over the dims),
// the same code in both kernels. D: centred keys (rows of ld floats), U_k: u_k[0..16),
// sk: sigma_k, s0: sigma_0 (the largest), bh = block * H + head.

__device__ __forceinline__ void write_mu(const Out& out, const float* mu, int d, int64_t bh,
                                         int lane) {
  if (!out.quant) {
    for (int c = lane; c < d; c += 32) out.mu[bh * d + c] = mu[c];
    return;
  }
  float mx = 0.0f;
  for (int c = lane; c < d; c += 32) mx = fmaxf(mx, fabsf(mu[c]));
  const float scale = detail::warp_max(mx) / 127.0f;
  if (lane == 0) out.mu_scale[bh] = scale;
  for (int c = lane; c < d; c += 32) {
    int q = scale == 0.0f ? 0 : __float2int_rn(mu[c] / scale);
    out.mu_q[bh * d + c] = int8_t(max(-127, min(127, q)));
  }
}

// basis_k = D^T u_k / sigma_k (0 when sigma_k <= 1e-6 sigma_0); lane owns dim pairs
// (2p, 2p+1), p = lane + 32 m (m < 4: d up to 256).
__device__ __forceinline__ void write_basis(const Out& out, const float* D, int ld,
                                            const float* U_k, float sk, float s0, int d, int rank,
                                            int k, int64_t bh, int lane) {
  const float inv = (sk > 0.0f && sk > 1e-6f * s0) ? 1.0f / sk : 0.0f;
  constexpr int kM = kMaxD / 64;
  float2 val[kM];
  const int npairs = d / 2;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int p = lane + 32 * m;
    float x = 0.0f, y = 0.0f;
    if (p < npairs) {
#pragma unroll
      for (int r = 0; r < kP; ++r) {
        const float2 dd = *reinterpret_cast<const float2*>(D + r * ld + 2 * p);
        x = fmaf(dd.x, U_k[r], x);
        y = fmaf(dd.y, U_k[r], y);
      }
    }
    val[m] = make_float2(x * inv, y * inv);
  }
  if (!out.quant) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int p = lane + 32 * m;
      if (p < npairs) *reinterpret_cast<float2*>(out.basis + (bh * rank + k) * d + 2 * p) = val[m];
    }
    return;
  }
  // One scale per basis_group dims (summary.h): group j holds the pairs p with 2p / g == j
  // (g even, so a pair never straddles two groups); sc[m] is the scale of pair p's group.
  const int g = out.basis_group, ng = d / g;
  float sc[kM] = {};
  for (int j = 0; j < ng; ++j) {
    float mj = 0.0f;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const int p = lane + 32 * m;
      if (p < npairs && 2 * p / g == j) mj = fmaxf(mj, fmaxf(fabsf(val[m].x), fabsf(val[m].y)));
    }
    const float scale = detail::warp_max(mj) / 7.0f;
    if (lane == 0) out.basis_scale[(bh * rank + k) * ng + j] = scale;
#pragma unroll
    for (int m = 0; m < kM; ++m)
      if (2 * (lane + 32 * m) / g == j) sc[m] = scale;
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int p = lane + 32 * m;
    if (p < npairs) {
      const float scale = sc[m];
      int lo = scale == 0.0f ? 0 : __float2int_rn(val[m].x / scale);
      int hi = scale == 0.0f ? 0 : __float2int_rn(val[m].y / scale);
      lo = max(-7, min(7, lo));
      hi = max(-7, min(7, hi));
      out.basis_q[(bh * rank + k) * (d / 2) + p] =
          uint8_t((unsigned(lo) & 0xFu) | ((unsigned(hi) & 0xFu) << 4));
    }
  }
}

// coeff[i][k] = sigma_k u_k[i]; lanes i and i + 16 both hold key i, lanes 0..15 write.
__device__ __forceinline__ void write_coeff(const Out& out, const float* U_k, float sk, float s0,
                                            int rank, int k, int64_t bh, int lane) {
  const int i = lane & 15, half = lane >> 4;
  const float keep = (sk > 0.0f && sk > 1e-6f * s0) ? sk : 0.0f;
  const float cv = keep * U_k[i];
  if (!out.quant) {
    if (half == 0) out.coeff[(bh * kP + i) * rank + k] = cv;
    return;
  }
  const float scale = detail::warp_max(fabsf(cv)) / 127.0f;
  if (lane == 0) out.coeff_scale[bh * rank + k] = scale;
  int q = scale == 0.0f ? 0 : __float2int_rn(cv / scale);
  if (half == 0) out.coeff_q[(bh * kP + i) * rank + k] = int8_t(max(-127, min(127, q)));
}

}  // namespace locks::cuda::sb

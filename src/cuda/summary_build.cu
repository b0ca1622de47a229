// GPU summary build: per (page, KV head) the centroid, the top-r eigenvectors of the centred
// 16 x 16 Gram matrix G = D D^T (D = keys - mu, P = 16 rows), basis_k = D^T u_k / sigma_k and
// coeff_ik = basis_k . D_i = sigma_k u_k[i], quantized in the same kernel (quant mode).
//
// Work layout: a block of 2 warps, each warp owns 2 (page, head) problems. Keys are staged
// in shared memory as fp32; each half-warp computes one Gram matrix (lane i owns row i) and
// diagonalises it with cyclic Jacobi in registers: the 15 rounds of a sweep are unrolled so
// that every rotation pair (round-robin schedule) is a compile-time register index; the lane's
// own pair comes through shuffles. The cuSOLVER path reuses the same load / epilogue code
// around cusolverDnSsyevjBatched. build_filled uses the latency kernel of
// summary_build_filled.cuh instead (a block of 256 threads per problem).
#include "common.cuh"
#include "jacobi16.cuh"
#include "locks/contract.h"
#include "locks/cuda/limits.h"
#include "locks/error.h"
#include "summary_build_common.cuh"
#include "summary_build_filled.cuh"
#include "summary_stages.h"

namespace locks::cuda {
namespace {
using detail::kNegInf;

using sb::jacobi16_rank;
using sb::jacobi16_solve;
using sb::kFull;
using sb::kMaxSweeps;
using sb::kP;
using sb::load_row_vec;
using sb::Out;
using sb::pick;
using sb::resolve_block;
using sb::Work;

constexpr int kWarps = 2;    // warps per block
constexpr int kPerWarp = 2;  // problems per warp (one per half-warp in the solver)

enum class Stage : int { jacobi = 0, gram_only = 1, from_eig = 2 };

template <typename T, Stage S>
__global__ void __launch_bounds__(kWarps * 32)
    summary_kernel(const T* __restrict__ keys, int H, int d, int rank, Work work, Out out,
                   float* __restrict__ gram_ws, const float* __restrict__ eig_vec,
                   const float* __restrict__ eig_val) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int ld = d + 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int per_warp_floats = kPerWarp * (kP * ld + kP * kP + d + kP);
  float* wbase = smem + warp * per_warp_floats;
  float* Dm = wbase;                     // [2][16][ld]
  float* Um = Dm + kPerWarp * kP * ld;   // [2][16][16]   U[k][i] = u_k[i]
  float* mum = Um + kPerWarp * kP * kP;  // [2][d]
  float* sig = mum + kPerWarp * d;       // [2][16]

  const int64_t prob0 = (int64_t(blockIdx.x) * kWarps + warp) * kPerWarp;
  int32_t blk[kPerWarp];
  int head[kPerWarp];
#pragma unroll
  for (int w = 0; w < kPerWarp; ++w) {
    const int64_t pi = prob0 + w;
    head[w] = int(pi % H);
    blk[w] = resolve_block(work, pi / H);
  }
  if (blk[0] < 0 && blk[1] < 0) return;  // warp-uniform; the kernel has no block barrier

  // 1. keys -> shared (fp32), centroid, centring.
  const int vec_per_row = d * int(sizeof(T)) / 16;
#pragma unroll
  for (int w = 0; w < kPerWarp; ++w) {
    float* D = Dm + w * kP * ld;
    for (int e = lane; e < kP * vec_per_row; e += 32) {
      const int row = e / vec_per_row, vi = e % vec_per_row;
      if (blk[w] >= 0) {
        const T* src = keys + blk[w] * work.block_stride + (int64_t(row) * H + head[w]) * d;
        load_row_vec<T>(src, D + row * ld, vi);
      } else {
        constexpr int kPer = 16 / sizeof(T);
        for (int x = 0; x < kPer; ++x) D[row * ld + vi * kPer + x] = 0.0f;
      }
    }
  }
  __syncwarp();
#pragma unroll
  for (int w = 0; w < kPerWarp; ++w) {
    float* D = Dm + w * kP * ld;
    for (int c = lane; c < d; c += 32) {
      float m = 0.0f;
#pragma unroll
      for (int r = 0; r < kP; ++r) m += D[r * ld + c];
      m *= (1.0f / kP);
      mum[w * d + c] = m;
      // Query-weighted summaries (summary.h): the fit is that of the weighted deviations.
      const float wc = out.qweight ? out.qweight[int64_t(head[w]) * d + c] : 1.0f;
#pragma unroll
      for (int r = 0; r < kP; ++r) D[r * ld + c] = (D[r * ld + c] - m) * wc;
    }
  }
  __syncwarp();

  const int half = lane >> 4, i = lane & 15;
  if constexpr (S != Stage::from_eig) {
    // 2. Gram row i of the half-warp's matrix.
    float a[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) a[j] = 0.0f;
    {
      const float* Dh = Dm + half * kP * ld;
      const float* Di = Dh + i * ld;
      for (int c = 0; c < d; c += 4) {
        const float4 x = *reinterpret_cast<const float4*>(Di + c);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const float4 y = *reinterpret_cast<const float4*>(Dh + j * ld + c);
          a[j] = fmaf(x.x, y.x, fmaf(x.y, y.y, fmaf(x.z, y.z, fmaf(x.w, y.w, a[j]))));
        }
      }
    }
    if constexpr (S == Stage::gram_only) {
      if (blk[half] >= 0) {
        float* g = gram_ws + (prob0 + half) * 256 + i * 16;
#pragma unroll
        for (int j = 0; j < 16; ++j) g[j] = a[j];
      }
      return;
    } else {
      // 3. Eigenpairs (cyclic Jacobi, both halves), ranked descending.
      float v[16];
      jacobi16_solve(a, v, i);
      const float lam = pick(a, i);
      const int rnk = jacobi16_rank(lam, i);
      float* U = Um + half * kP * kP;
      for (int k = 0; k < rank; ++k) {
        const unsigned m = (__ballot_sync(kFull, rnk == k) >> (16 * half)) & 0xffffu;
        const int col = __ffs(m) - 1;
        U[k * kP + i] = pick(v, col);
        const float lk = __shfl_sync(kFull, lam, col, 16);
        if (i == 0) sig[half * kP + k] = sqrtf(fmaxf(lk, 0.0f));
      }
    }
  } else {
    // Eigenpairs from cusolverDnSsyevjBatched: ascending eigenvalues, column-major vectors.
    if (blk[half] >= 0) {
      const int64_t pi = prob0 + half;
      float* U = Um + half * kP * kP;
      for (int k = 0; k < rank; ++k) {
        const int col = kP - 1 - k;
        U[k * kP + i] = eig_vec[pi * 256 + col * 16 + i];
        if (i == 0) sig[half * kP + k] = sqrtf(fmaxf(eig_val[pi * 16 + col], 0.0f));
      }
    }
  }
  __syncwarp();

  // 5. Epilogue, one problem at a time over the whole warp: basis, coefficients, quantization.
#pragma unroll
  for (int w = 0; w < kPerWarp; ++w) {
    if (blk[w] < 0) continue;  // warp-uniform
    const float* D = Dm + w * kP * ld;
    const float* U = Um + w * kP * kP;
    const float* sg = sig + w * kP;
    const float* mu = mum + w * d;
    const int64_t bh = int64_t(blk[w]) * H + head[w];
    const float s0 = sg[0];
    sb::write_mu(out, mu, d, bh, lane);
    for (int k = 0; k < rank; ++k)
      sb::write_basis(out, D, ld, U + k * kP, sg[k], s0, d, rank, k, bh, lane);
    for (int k = 0; k < rank; ++k) sb::write_coeff(out, U + k * kP, sg[k], s0, rank, k, bh, lane);
  }
}

size_t smem_bytes(int d) {
  return size_t(kWarps) * kPerWarp * (kP * (d + 4) + kP * kP + d + kP) * sizeof(float);
}

Out make_out(const SummaryView& v) {
  return {v.mu,          v.basis,
          v.coeff,       v.mu_q,
          v.mu_scale,    v.basis_q,
          v.basis_scale, v.coeff_q,
          v.coeff_scale, v.layout.precision == Precision::quant,
          v.qweight,     v.layout.basis_group};
}

// Calls f with the cache's K pointer cast to its element type (float, __half, bf16).
template <typename F>
void with_typed_keys(const KvCacheView& cache, F&& f) {
  switch (cache.layout.dtype) {
    case DType::f32:
      f(static_cast<const float*>(cache.k));
      break;
    case DType::f16:
      f(static_cast<const __half*>(cache.k));
      break;
    default:
      f(static_cast<const __nv_bfloat16*>(cache.k));
      break;
  }
}

template <Stage S>
void launch(const KvCacheView& cache, const SummaryLayout& sl, const Work& work, int64_t problems,
            const Out& out, float* gram, const float* evec, const float* eval, cudaStream_t st) {
  const int per_block = kWarps * kPerWarp;
  const int64_t blocks = (problems + per_block - 1) / per_block;
  if (blocks == 0) return;
  LOCKS_REQUIRE(blocks < (int64_t(1) << 31), "too many pages in one call: ", problems);
  const int H = cache.layout.num_kv_heads, d = cache.layout.head_dim, r = sl.rank;
  const size_t sm = smem_bytes(d);
  Work w = work;
  w.block_stride = cache.block_step();
  auto go = [&](auto* k) {
    using TT = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
    // Above the default 48 KB (large head_dim) the kernel needs the attribute (host call,
    // no sync, idempotent).
    if (sm > 48 * 1024)
      LOCKS_CUDA_CHECK(cudaFuncSetAttribute(summary_kernel<TT, S>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, int(sm)));
    summary_kernel<TT, S>
        <<<unsigned(blocks), kWarps * 32, sm, st>>>(k, H, d, r, w, out, gram, evec, eval);
  };
  with_typed_keys(cache, go);
  LOCKS_CUDA_LAUNCHED();
}

// The views of a summary build: layouts valid and matching, arrays present, and a shape the
// kernels implement (Unsupported otherwise).
void check_layouts(const CacheLayout& cl, const SummaryLayout& sl, const char* where) {
  validate_layout(cl);
  validate_summary_layout(sl);
  if (sl.num_blocks != cl.num_blocks || sl.page_size != cl.page_size ||
      sl.num_kv_heads != cl.num_kv_heads || sl.head_dim != cl.head_dim)
    locks::detail::fail(where, "summary layout does not match the cache layout");
  if (cl.page_size != kP)
    locks::detail::fail_as<Unsupported>(where, "the CUDA summary build needs page_size ", kP,
                                        ", got ", cl.page_size);
  if (!(cl.head_dim % 8 == 0 && cl.head_dim <= sb::kMaxD))
    locks::detail::fail_as<Unsupported>(where,
                                        "the CUDA summary build needs head_dim a multiple of 8 "
                                        "and <= ",
                                        sb::kMaxD, ", got ", cl.head_dim);
}

void check_views(const KvCacheView& cache, const SummaryView& out, const char* where) {
  check_layouts(cache.layout, out.layout, where);
  const SummaryLayout& sl = out.layout;
  if (cache.k == nullptr) locks::detail::fail(where, "cache.k is null");
  validate_cache(cache);
  if (reinterpret_cast<uintptr_t>(cache.k) % 16 != 0 ||
      cache.block_step() * dtype_size(cache.layout.dtype) % 16 != 0)
    locks::detail::fail(where,
                        "cache.k and every block of it must be 16-byte aligned (the "
                        "CUDA kernels' loads): block_stride ",
                        cache.block_step(), " elements");
  if (sl.precision == Precision::fp32) {
    if (!(out.mu && out.basis && out.coeff))
      locks::detail::fail(where, "fp32 summary arrays are null");
  } else if (!(out.mu_q && out.mu_scale && out.basis_q && out.basis_scale && out.coeff_q &&
               out.coeff_scale)) {
    locks::detail::fail(where, "quant summary arrays are null");
  }
}

// The latency kernel over one item per sequence (filled) or slot (slots): a block per
// (item, KV head), grid from the item count only.
void launch_filled(const KvCacheView& cache, const SummaryView& out, Work w, cudaStream_t stream) {
  w.block_stride = cache.block_step();
  const int H = cache.layout.num_kv_heads, d = cache.layout.head_dim, r = out.layout.rank;
  const int64_t blocks = w.n_items * H;
  if (blocks == 0) return;
  LOCKS_REQUIRE(blocks < (int64_t(1) << 31), "too many items: ", w.n_items);
  const Out o = make_out(out);
  auto go = [&](auto* k) {
    using TT = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
    sb::filled_kernel<TT, false>
        <<<unsigned(blocks), sb::kFilledThreads, 0, stream>>>(k, H, d, r, w, o, {});
  };
  with_typed_keys(cache, go);
  LOCKS_CUDA_LAUNCHED();
}

Work list_work(const CacheLayout& cl, const int32_t* block_ids, int64_t n_blocks) {
  Work w{block_ids, n_blocks, nullptr, 0, nullptr, 0, false};
  w.num_blocks = cl.num_blocks;
  return w;
}

}  // namespace

namespace detail {

void check_summary_layouts(const CacheLayout& cache, const SummaryLayout& summary,
                           const char* where) {
  check_layouts(cache, summary, where);
}

void check_summary_views(const KvCacheView& cache, const SummaryView& out, const char* where) {
  check_views(cache, out, where);
}

void launch_summary_gram(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                         const SummaryView& out, float* gram, cudaStream_t st) {
  launch<Stage::gram_only>(cache, out.layout, list_work(cache.layout, block_ids, n_blocks),
                           n_blocks * cache.layout.num_kv_heads, make_out(out), gram, nullptr,
                           nullptr, st);
}

void launch_summary_from_eig(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                             const SummaryView& out, const float* evec, const float* eval,
                             cudaStream_t st) {
  launch<Stage::from_eig>(cache, out.layout, list_work(cache.layout, block_ids, n_blocks),
                          n_blocks * cache.layout.num_kv_heads, make_out(out), nullptr, evec, eval,
                          st);
}

}  // namespace detail

void summary_build(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                   const SummaryView& out, cudaStream_t stream) {
  check_views(cache, out, __func__);
  LOCKS_REQUIRE(n_blocks >= 0, "n_blocks must be >= 0, got ", n_blocks);
  if (n_blocks == 0) return;
  LOCKS_REQUIRE(block_ids != nullptr, "block_ids is null");
  launch<Stage::jacobi>(cache, out.layout, list_work(cache.layout, block_ids, n_blocks),
                        n_blocks * cache.layout.num_kv_heads, make_out(out), nullptr, nullptr,
                        nullptr, stream);
}

void summary_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                          const SummaryView& out, cudaStream_t stream) {
  check_views(cache, out, __func__);
  LOCKS_REQUIRE(appended >= 1 && appended <= kP, "appended must be in [1, ", kP, "], got ",
                appended);
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.block_table && batch.seq_lens,
                "batch is empty or has null arrays");
  Work w{nullptr,
         batch.batch_size,
         batch.block_table,
         batch.block_table_stride,
         batch.seq_lens,
         appended,
         true};
  w.num_blocks = cache.layout.num_blocks;
  w.max_blocks = batch.max_blocks_per_seq;
  launch_filled(cache, out, w, stream);
}

void summary_build_slots(const KvCacheView& cache, const int32_t* slot_mapping, int64_t n_slots,
                         const SummaryView& out, cudaStream_t stream) {
  check_views(cache, out, __func__);
  LOCKS_REQUIRE(n_slots >= 0, "n_slots must be >= 0, got ", n_slots);
  if (n_slots == 0) return;
  LOCKS_REQUIRE(slot_mapping != nullptr, "slot_mapping is null");
  Work w{nullptr, n_slots, nullptr, 0, nullptr, 1, true};
  w.slots = slot_mapping;
  w.num_blocks = cache.layout.num_blocks;
  launch_filled(cache, out, w, stream);
}

void cache_write_slots(const KvCacheWriteView& cache, const TokenRows& rows,
                       const int32_t* slot_mapping, const SummaryView* out, cudaStream_t stream) {
  constexpr const char* where = "cache_write_slots";
  const KvCacheView view = cache.view();
  const CacheLayout& L = cache.layout;
  validate_cache(view);
  if (cache.k == nullptr || cache.v == nullptr)
    locks::detail::fail(where, "cache.k / cache.v are null");
  validate_token_rows(L, rows);
  const int64_t es = dtype_size(L.dtype);
  if (out) {
    check_views(view, *out, where);
  } else {
    // The write's own needs (check_views says them for the build).
    if (L.page_size != kP)
      locks::detail::fail_as<Unsupported>(where, "the CUDA cache write needs page_size ", kP,
                                          ", got ", L.page_size);
    if (L.head_dim % 8 != 0)
      locks::detail::fail_as<Unsupported>(where,
                                          "the CUDA cache write needs head_dim a "
                                          "multiple of 8, got ",
                                          L.head_dim);
  }
  if (reinterpret_cast<uintptr_t>(cache.k) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(cache.v) % 16 != 0 || view.block_step() * es % 16 != 0)
    locks::detail::fail(where,
                        "cache.k, cache.v and every block must be 16-byte aligned, block "
                        "stride ",
                        view.block_step(), " elements");
  const int64_t n = rows.n_tokens, H = L.num_kv_heads;
  if (n == 0) return;
  if (slot_mapping == nullptr) locks::detail::fail(where, "slot_mapping is null");
  if (n > limits::kCacheWriteMaxTokens)
    locks::detail::fail_as<Unsupported>(
        where, n, " tokens: the CUDA cache write takes at most ", limits::kCacheWriteMaxTokens,
        " a call (its slot scans are O(n^2): made for decode steps); write prefill K/V, then "
        "call summary_build_slots");
  Work w{nullptr, n, nullptr, 0, nullptr, 1, true};
  w.slots = slot_mapping;
  w.num_blocks = L.num_blocks;
  w.block_stride = view.block_step();
  // Vector copies where every row start is 16-byte aligned (d * es is a multiple of 16 here).
  auto aligned = [&](const void* p, int64_t ts, int64_t hs) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ts * es % 16 == 0 && hs * es % 16 == 0;
  };
  const bool vec = aligned(rows.k, rows.k_token_stride, rows.k_head_stride) &&
                   aligned(rows.v, rows.v_token_stride, rows.v_head_stride);
  const Out o = out ? make_out(*out) : Out{};
  const int r = out ? out->layout.rank : 0;
  auto go = [&](auto* k) {
    using TT = std::remove_cv_t<std::remove_pointer_t<decltype(k)>>;
    sb::WriteRows<TT> wr;
    wr.k_in = static_cast<const TT*>(rows.k);
    wr.v_in = static_cast<const TT*>(rows.v);
    wr.k_ts = rows.k_token_stride, wr.k_hs = rows.k_head_stride;
    wr.v_ts = rows.v_token_stride, wr.v_hs = rows.v_head_stride;
    wr.k_cache = static_cast<TT*>(cache.k);
    wr.v_cache = static_cast<TT*>(cache.v);
    wr.vec = vec;
    wr.build = out != nullptr;
    sb::filled_kernel<TT, true>
        <<<unsigned(n * H), sb::kFilledThreads, 0, stream>>>(k, int(H), L.head_dim, r, w, o, wr);
  };
  with_typed_keys(view, go);
  LOCKS_CUDA_LAUNCHED();
}

}  // namespace locks::cuda

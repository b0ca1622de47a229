// Page scoring on the CUDA cores (fp32 summaries, or quant summaries of a rank other than 8 or
// with a basis scale group the tensor-core kernel has no instance for: score.cu):
// one block of 4 warps per (128-page chunk, KV head, sequence), one warp per page; the
// summary is staged (dequantized) in shared memory, then V q, q.mu and each key's logit
// in fp32 and the page's log-sum-exp by half-warp shuffles. Any head_dim and GQA group that
// fit the shared memory (checked at launch).
#include <cstdint>

#include "locks/error.h"
#include "score.cuh"
#include "score_common.cuh"

namespace locks::cuda::detail {
namespace {

constexpr int kGenWarps = 4;
constexpr int kGenericSmemMax = 160 * 1024;

__global__ void __launch_bounds__(kGenWarps * 32)
    score_generic(SumView S, bool quant, int H, int d, int r, int P, const int32_t* block_table,
                  int64_t bt_stride, int64_t bt_head_stride, const int32_t* seq_lens, int M, QIn q,
                  int Hq, float scale, float* head_scores, float* chunk_lse, int n_chunks) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int h = blockIdx.x, chunk = blockIdx.y, b = blockIdx.z;  // heads fastest: see launch
  const int G = Hq / H, ld = d + 1;
  const int bg = S.basis_group;  // dims per int4 basis scale
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
    qs[g * ld + c] = load_q(q, int64_t(b) * q.stride + (h * G + g) * d + c) * (scale * kLog2e);
  }
  __syncthreads();
  // Untrusted device values (docs/bad_input.md): an invalid length scores no page.
  const int len = seq_lens[b];
  const int n_full = rules::trusted_full_pages(len, M, P);
  for (int jj = warp; jj < kScoreChunk; jj += kGenWarps) {
    const int j = chunk * kScoreChunk + jj;
    if (j >= n_full || j >= M) {  // warp-uniform
      for (int g = lane; g < G; g += 32) sc[g * kScoreChunk + jj] = kNegInf;
      continue;
    }
    const int32_t blk = block_table[int64_t(b) * bt_stride + h * bt_head_stride + j];
    if (blk < 0 || blk >= S.num_blocks) {  // warp-uniform: an invalid block id scores -inf
      for (int g = lane; g < G; g += 32) sc[g * kScoreChunk + jj] = kNegInf;
      continue;
    }
    const int64_t bh = int64_t(blk) * H + h;
    // Stage the (dequantized) summary.
    // (not unrolled: unrolling made ptxas spill with the group index below)
#pragma unroll 1
    for (int e = lane; e < r * d; e += 32) {
      const int k = e / d, c = e % d;
      float x;
      if (!quant) {
        x = S.basis[bh * r * d + e];
      } else {
        const uint8_t byte = S.basis_q[(bh * r + k) * (d / 2) + c / 2];
        const int code = (c & 1) ? (int(int8_t(byte)) >> 4) : (int(int8_t(byte << 4)) >> 4);
        // scales [r][d / bg]: e / bg = k (d / bg) + c / bg, dim c's group (bg divides d)
        x = float(code) * S.basis_scale[bh * (r * d / bg) + e / bg];
      }
      // Query-weighted summaries: basis_k . (q / w) = (basis_k / w) . q.
      rows[k * ld + c] = S.qweight ? x / S.qweight[int64_t(h) * d + c] : x;
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
  write_chunk(sc, kScoreChunk, kScoreChunk, G, b, h * G, Hq, M, chunk, n_chunks, head_scores,
              chunk_lse);
}

}  // namespace

void prepare_score_generic() {
  LOCKS_CUDA_CHECK(cudaFuncSetAttribute(score_generic, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kGenericSmemMax));
}

void launch_score_generic(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                          float* head_scores, float* chunk_lse, int n_chunks, cudaStream_t st,
                          int64_t bt_head_stride) {
  const SummaryLayout& L = s.layout;
  const int H = L.num_kv_heads, G = Hq / H;
  const int d = L.head_dim, r = L.rank, P = L.page_size;
  const size_t smem =
      sizeof(float) * (size_t(G) * (d + 1) + size_t(G) * kScoreChunk +
                       size_t(kGenWarps) * ((r + 1) * (d + 1) + P * r + (r + 1) * G));
  LOCKS_REQUIRE(smem <= size_t(kGenericSmemMax), "generic scoring needs ", smem,
                " bytes of shared memory (max ", kGenericSmemMax, ")");
  // KV heads vary fastest across the grid, so the blocks in flight read the summaries of
  // all heads of the same pages (adjacent in memory) rather than one head across far pages.
  const dim3 grid(unsigned(H), unsigned(ceil_div(batch.max_blocks_per_seq, kScoreChunk)),
                  unsigned(batch.batch_size));
  score_generic<<<grid, kGenWarps * 32, smem, st>>>(
      sum_view(s), L.precision == Precision::quant, H, d, r, P, batch.block_table,
      batch.block_table_stride, bt_head_stride, batch.seq_lens, batch.max_blocks_per_seq, q, Hq,
      scale, head_scores, chunk_lse, n_chunks);
}

}  // namespace locks::cuda::detail

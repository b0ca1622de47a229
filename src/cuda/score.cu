// Page scoring on the GPU: s_j = log sum_i exp(scale * (q.mu_j + (V_j q).c_i)) for every
// full page j and query head, plus per-chunk log-sum-exp partials for the GQA aggregation.
// Two kernels: score_mma.cu (tensor cores: int4 summaries of rank 8, d 64 / 128 / 256, any
// GQA group up to 32, 32-128 pages a block chosen at plan time) and score_generic.cu (CUDA
// cores: fp32 summaries, other ranks and other basis scale groups, 128 pages a block). This
// file picks one.
#include "common.cuh"
#include "kernels.cuh"
#include "locks/error.h"
#include "score.cuh"

namespace locks::cuda::detail {

void prepare_score_kernels() {
  prepare_score_generic();
  prepare_score_mma();
}

// The tensor-core kernel has instances for one basis scale a row and, at d 128 / 256, one
// per 32 dims (summary_layout_for's choices); other scale groups take the CUDA-core kernel.
bool score_uses_tensor_cores(const SummaryLayout& s, int group) {
  const bool scales_ok = s.basis_group == s.head_dim || (s.basis_group == 32 && s.head_dim >= 128);
  return s.precision == Precision::quant && s.rank == limits::kTensorCoreRank &&
         s.page_size == limits::kPageSize && limits::head_dim_supported(s.head_dim) &&
         limits::group_supported(group) && scales_ok;
}

void launch_score(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                  float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                  cudaStream_t st, int64_t bt_head_stride, bool whole_rows) {
  const SummaryLayout& L = s.layout;
  LOCKS_REQUIRE(score_chunk_supported(chunk_pages), "score chunk of ", chunk_pages, " pages");
  if (score_uses_tensor_cores(L, Hq / L.num_kv_heads)) {
    // The kernel stages the basis and coefficient scales with 16-byte copies.
    const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    LOCKS_REQUIRE(a16(s.basis_scale) && a16(s.coeff_scale),
                  "tensor-core scoring needs 16-byte aligned basis_scale and coeff_scale");
    launch_score_mma(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages, st,
                     bt_head_stride, whole_rows);
  } else {
    LOCKS_REQUIRE(chunk_pages == kScoreChunk, "the CUDA-core scoring path uses 128-page chunks");
    // (It writes every row whole: it is not on the int4 rank-8 path of the served models.)
    launch_score_generic(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, st,
                         bt_head_stride);
  }
  LOCKS_CUDA_LAUNCHED();
}

}  // namespace locks::cuda::detail

// The tensor-core page scoring (score_mma_kernel.cuh) for a query in any dtype and row stride,
// and the entry points: a contiguous fp32 query takes score_mma_fp32.cu's instances (the
// kernel's pre-dtype instructions; see score_mma's QV).
#include "score_mma_kernel.cuh"

namespace locks::cuda::detail {

void prepare_score_mma() {
  prepare_mma_q<true>();
  prepare_score_mma_fp32();
}

void launch_score_mma(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                      float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                      cudaStream_t st, int64_t bths, bool whole) {
  if (contiguous_f32(q, Hq, s.layout.head_dim))
    launch_score_mma_fp32(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages, st,
                          bths, whole);
  else
    launch_mma_q<true>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages, st,
                       bths, whole);
}

}  // namespace locks::cuda::detail

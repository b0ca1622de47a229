// The contiguous fp32 query's scoring instances (score_mma_fp32.cu), called by score_mma.cu's
// entry points (score.cuh).
#pragma once

#include "score.cuh"

namespace locks::cuda::detail {

void prepare_score_mma_fp32();
void launch_score_mma_fp32(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                           float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                           cudaStream_t st, int64_t bt_head_stride);

}  // namespace locks::cuda::detail

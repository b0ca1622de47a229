// The two page-scoring kernels' launchers, internal to the scoring files: score.cu chooses
// one (launch_score, kernels.cuh), score_mma.cu and score_generic.cu hold the kernels.
#pragma once

#include <cuda_runtime.h>

#include "dtype_io.h"
#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::cuda::detail {

// Tensor-core kernel (int4 summaries, rank 8, d 64 / 128 / 256): chunk_pages 32, 64, 96 or 128.
void prepare_score_mma();
void launch_score_mma(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                      float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                      cudaStream_t st, int64_t bt_head_stride, bool whole_rows);
// Its contiguous fp32 query's instances (score_mma_fp32.cu: the kernel's pre-dtype
// instructions), which launch_score_mma dispatches to.
void prepare_score_mma_fp32();
void launch_score_mma_fp32(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                           float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                           cudaStream_t st, int64_t bt_head_stride, bool whole_rows);
// CUDA-core kernel (fp32 summaries, other ranks): 128-page chunks (kScoreChunk).
void prepare_score_generic();
void launch_score_generic(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                          float* head_scores, float* chunk_lse, int n_chunks, cudaStream_t st,
                          int64_t bt_head_stride);

}  // namespace locks::cuda::detail

// The bulk summary kernel's split stages, for the cuSOLVER comparison builder
// (summary_builder_cusolver.cu, library locks_cuda_compare): the Gram matrices of the given
// blocks' pages (gram [n_blocks * H, 16, 16]), and the epilogue from eigenpairs (ascending
// eigenvalues eval [n * H, 16], column-major eigenvectors in evec), fused quantization.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::cuda::detail {

// Throws InvalidArgument / Unsupported like cuda::summary_build.
void check_summary_layouts(const CacheLayout& cache, const SummaryLayout& summary,
                           const char* where);
void check_summary_views(const KvCacheView& cache, const SummaryView& out, const char* where);
void launch_summary_gram(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                         const SummaryView& out, float* gram, cudaStream_t st);
void launch_summary_from_eig(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                             const SummaryView& out, const float* evec, const float* eval,
                             cudaStream_t st);

}  // namespace locks::cuda::detail

// The tensor-core page scoring (score_mma_kernel.cuh) for a contiguous fp32 query (QV false),
// and the chunk size rule's occupancy query, which reads these instances (the bench's path).
#include "locks/error.h"
#include "score_chunk_rule.h"
#include "score_mma_kernel.cuh"

namespace locks::cuda::detail {
namespace {

const void* mma_kernel_for(int head_dim, int group) {
  return head_dim == 256   ? mma_kernel<256, 128, 1, false>(group)
         : head_dim == 128 ? mma_kernel<128, 128, 1, false>(group)
                           : mma_kernel<64, 128, 1, false>(group);
}
int mma_smem_for(int head_dim) {
  return head_dim == 256 ? mma_smem<256>() : head_dim == 128 ? mma_smem<128>() : mma_smem<64>();
}

}  // namespace

void prepare_score_mma_fp32() { prepare_mma_q<false>(); }

void launch_score_mma_fp32(const SummaryView& s, const BatchView& batch, QIn q, int Hq, float scale,
                           float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                           cudaStream_t st, int64_t bths, bool whole) {
  launch_mma_q<false>(s, batch, q, Hq, scale, head_scores, chunk_lse, n_chunks, chunk_pages, st,
                      bths, whole);
}

int score_chunk_pages(int head_dim, int group, int64_t rows, int64_t max_pages, int sms) {
  int per_sm = 0;
  LOCKS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, mma_kernel_for(head_dim, group), kMmaWarps * 32, size_t(mma_smem_for(head_dim))));
  const int64_t slots = int64_t(std::max(per_sm, 1)) * sms;
  const HeadSlices hs = mma_slices(head_dim, group);
  rows *= hs.n;  // blocks per (chunk, sequence, KV head)
  return score_chunk_rule(rows, max_pages, slots, long_grid_chunk(head_dim, hs.width));
}

}  // namespace locks::cuda::detail

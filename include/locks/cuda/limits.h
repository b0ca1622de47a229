// What the CUDA decode path supports, in one table: the plan-time checks of cuda::Decoder
// and cuda::SummaryBuilder read it, and so does the capability query (supports(cuda, ...)).
// Plain constexpr data: no CUDA headers, usable from host code that never touches a GPU.
#pragma once

namespace locks::cuda::limits {

inline constexpr int kPageSize = 16;           // the only page size of every kernel
inline constexpr int kHeadDims[] = {64, 128};  // scoring, attention and summary build
inline constexpr int kMaxGroup = 16;           // GQA group num_q_heads / num_kv_heads
// Tensor-core scoring needs int4 summaries of this rank; other ranks and fp32 summaries
// score on the CUDA-core kernel (any rank 1 <= r < page size).
inline constexpr int kTensorCoreRank = 8;
// Attention reads bf16 or f16 caches; scoring and the summary build also read f32 caches.

constexpr bool head_dim_supported(int d) {
  for (int x : kHeadDims)
    if (x == d) return true;
  return false;
}
constexpr bool group_supported(int g) { return g >= 1 && g <= kMaxGroup; }

}  // namespace locks::cuda::limits

// What the CUDA decode path supports, in one table: the plan-time checks of cuda::Decoder
// and cuda::SummaryBuilder read it, and so does the capability query (supports(cuda, ...)).
// Plain constexpr data: no CUDA headers, usable from host code that never touches a GPU.
#pragma once

#include "locks/dtype.h"

namespace locks::cuda::limits {

inline constexpr int kPageSize = 16;                // the only page size of every kernel
inline constexpr int kHeadDims[] = {64, 128, 256};  // scoring, attention and summary build
inline constexpr int kMaxGroup = 32;                // GQA group num_q_heads / num_kv_heads
// Tensor-core scoring needs int4 summaries of this rank; other ranks and fp32 summaries
// score on the CUDA-core kernel (any rank 1 <= r < page size).
inline constexpr int kTensorCoreRank = 8;
// Tokens of one cache_write_slots call: each of its (token, KV head) blocks reads the call's
// slots (duplicates, the writers of a built block's rows), O(n^2) reads a call, so the op is
// for decode steps (one token a sequence); more is refused (Unsupported) rather than run for
// seconds. Prefill: the K/V write, then summary_build_slots.
inline constexpr int kCacheWriteMaxTokens = 16384;

constexpr bool head_dim_supported(int d) {
  for (int x : kHeadDims)
    if (x == d) return true;
  return false;
}
constexpr bool group_supported(int g) { return g >= 1 && g <= kMaxGroup; }
// Attention reads bf16 or f16 caches; scoring and the summary build also read f32 caches.
constexpr bool attention_dtype_supported(DType t) { return t == DType::bf16 || t == DType::f16; }
constexpr bool summary_dtype_supported(DType t) {
  return t == DType::bf16 || t == DType::f16 || t == DType::f32;
}

}  // namespace locks::cuda::limits

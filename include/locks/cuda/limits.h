// What the CUDA kernels implement, in one table: supports(Backend::cuda, ...) (support.h),
// cuda::plan_decode and the summary builds all read it. The kernel owner updates it when a
// kernel learns a new shape (e.g. head_dim 256, GQA group 32). Plain C++ (no CUDA headers):
// the common layer answers capability queries also in builds without CUDA.
#pragma once

namespace locks::cuda::limits {

inline constexpr int kPageSize = 16;  // the kernels' page size (Gram matrices are 16 x 16)
inline constexpr int kMaxGroup = 16;  // GQA group num_q_heads / num_kv_heads, 1..kMaxGroup
// head_dims of the decode step (scoring, selection, attention).
inline constexpr bool decode_head_dim(int d) { return d == 64 || d == 128; }
inline constexpr const char* kDecodeHeadDims = "64 or 128";
// head_dims of the summary build (bulk, filled, slots): a multiple of 8 up to kMaxBuildDim.
inline constexpr int kMaxBuildDim = 128;
inline constexpr bool build_head_dim(int d) { return d >= 8 && d % 8 == 0 && d <= kMaxBuildDim; }
// Attention reads bf16 or f16 caches; scoring and the summary builds also f32.
inline constexpr bool attention_dtype(int dtype_code) { return dtype_code == 1 || dtype_code == 2; }
// Summary rank: 1 <= rank < page size (any rank; quant rank 8 takes the tensor-core scorer).
inline constexpr bool rank_ok(int r) { return r >= 1 && r < kPageSize; }

}  // namespace locks::cuda::limits

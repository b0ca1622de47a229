// Shared device helpers of locks_cuda: element loads, ordered float keys (the error check
// macro is locks/cuda/check.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "dtype_io.h"
#include "locks/cuda/check.h"
#include "locks/dtype.h"

namespace locks::cuda::detail {

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// SMs of the current device (the grid rules of the plan and of the ops that plan themselves).
inline int current_device_sms() {
  int dev = 0, sms = 0;
  LOCKS_CUDA_CHECK(cudaGetDevice(&dev));
  LOCKS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

// Head slices of a GQA group too wide for one block's fragments: the fewest slices of at most
// `max_heads` heads, balanced (scoring and attention each set their own maximum).
struct HeadSlices {
  int n, width;
};
inline HeadSlices head_slices(int group, int max_heads) {
  const int n = ceil_div(group, max_heads);
  return {n, ceil_div(group, n)};
}

constexpr float kNegInf = -__builtin_huge_valf();

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Element i of the query / a store into the output, whatever their dtype (dtype_io.h).
__device__ __forceinline__ float load_q(QIn q, int64_t i) {
  if (q.t == DType::f32) return static_cast<const float*>(q.p)[i];
  if (q.t == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(q.p)[i]);
  return __half2float(static_cast<const __half*>(q.p)[i]);
}
// Elements p[0], p[1] as float (p even-aligned: one 8- or 4-byte load).
__device__ __forceinline__ float2 pair_to_float2(const float* p) {
  return *reinterpret_cast<const float2*>(p);
}
__device__ __forceinline__ float2 pair_to_float2(const __nv_bfloat16* p) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
}
__device__ __forceinline__ float2 pair_to_float2(const __half* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}
// Round to nearest even, as the host conversions of locks/dtype.h (NaN stays NaN).
__device__ __forceinline__ void store_out(OutBuf o, int64_t i, float v) {
  if (o.t == DType::f32)
    static_cast<float*>(o.p)[i] = v;
  else if (o.t == DType::bf16)
    static_cast<__nv_bfloat16*>(o.p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<__half*>(o.p)[i] = __float2half_rn(v);
}

// Order-preserving map float -> uint32 (larger float, larger key; -inf lowest finite order).
__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Merge two (max, sum) log-sum-exp partials.
__device__ __forceinline__ void lse_merge(float& m, float& l, float m2, float l2) {
  const float mn = fmaxf(m, m2);
  if (mn == kNegInf) return;
  l = l * __expf(m - mn) + l2 * __expf(m2 - mn);
  m = mn;
}

}  // namespace locks::cuda::detail

namespace locks::cuda::detail {

// kernel<<<grid, block, smem, st>>>(args...), then the launch error check. (Programmatic
// dependent launch was tried here, v11 in docs/cuda_notes.md: no faster at 128K batch 8 and
// 4 us slower at 1M batch 1 than plain launches, so the step uses plain stream order.)
template <typename... KArgs, typename... Args>
void launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                   Args&&... args) {
  kernel<<<grid, block, smem, st>>>(std::forward<Args>(args)...);
  LOCKS_CUDA_LAUNCHED();
}

}  // namespace locks::cuda::detail

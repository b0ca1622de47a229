// Small inner-loop helpers of the CPU kernels: reading cache rows as float and a
// fixed-order dot product that GCC vectorizes at -O3 without -ffast-math.
#pragma once

#include <cstdint>

#include "locks/dtype.h"

namespace locks::detail {

// 65,536-entry fp16 -> fp32 table, built once on first use (thread-safe static init).
// A software half_to_float per element costs ~10x a table load.
const float* fp16_table();

// Converts n elements at base[offset..offset+n) of dtype t into dst.
inline void convert_row(const void* base, DType t, int64_t offset, int n, float* dst) {
  if (t == DType::f32) {
    const float* src = static_cast<const float*>(base) + offset;
    for (int i = 0; i < n; ++i) dst[i] = src[i];
  } else if (t == DType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
    for (int i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);  // a 16-bit shift
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
    const float* lut = fp16_table();
    for (int i = 0; i < n; ++i) dst[i] = lut[src[i]];
  }
}

// Row as float: the cache memory itself for fp32 (no copy), else converted into buf.
inline const float* load_row(const void* base, DType t, int64_t offset, int n, float* buf) {
  if (t == DType::f32) return static_cast<const float*>(base) + offset;
  convert_row(base, t, offset, n, buf);
  return buf;
}

// Dot product with 16 independent partial sums combined in a fixed order: the lane loop
// vectorizes (no reassociation of one serial sum is needed), and the result depends only
// on the inputs, never on threading.
inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  constexpr int L = 16;
  float acc[L] = {};
  int i = 0;
  for (; i + L <= n; i += L) {
    for (int l = 0; l < L; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int w = L / 2; w > 0; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0] + tail;
}

}  // namespace locks::detail

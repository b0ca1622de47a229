// Small inner-loop helpers of the CPU kernels: reading cache rows as float and a
// fixed-order dot product that GCC vectorizes at -O3 without -ffast-math.
#pragma once

#include <cstdint>
#include <cstring>

#include "locks/dtype.h"

namespace locks::detail {

// fp16 -> fp32, branch-free so that GCC vectorizes a loop of it (a per-element
// half_to_float with its renormalisation loop does not). Bit-identical to half_to_float for
// all 65,536 inputs (a unit test checks every one), subnormals included, independent of the
// FTZ/DAZ modes (subnormal halves go through an exact int -> float conversion).
inline float half_to_float_fast(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = h & 0x7C00u;
  const uint32_t mant = h & 0x3FFu;
  const uint32_t normal = ((uint32_t(h) & 0x7FFFu) << 13) + 0x38000000u;  // rebias 15 -> 127
  const uint32_t infnan = 0x7F800000u | (mant << 13);
  float sub = float(mant) * 0x1p-24f;  // exact: mant < 2^10
  uint32_t sub_bits;
  std::memcpy(&sub_bits, &sub, 4);
  // Masks rather than ?: so that the loop has no control flow for the vectorizer.
  const uint32_t is_sub = 0u - uint32_t(exp == 0);
  const uint32_t is_special = 0u - uint32_t(exp == 0x7C00u);
  const uint32_t bits =
      sign | (sub_bits & is_sub) | (infnan & is_special) | (normal & ~(is_sub | is_special));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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
    for (int i = 0; i < n; ++i) dst[i] = half_to_float_fast(src[i]);
  }
}

// Row as float: the cache memory itself for fp32 (no copy), else converted into buf.
inline const float* load_row(const void* base, DType t, int64_t offset, int n, float* buf) {
  if (t == DType::f32) return static_cast<const float*>(base) + offset;
  convert_row(base, t, offset, n, buf);
  return buf;
}

// Stores n floats of src at base[offset..offset+n) of dtype t (fp16 / bf16: round to nearest
// even, the conversions of locks/dtype.h).
inline void store_row(const float* src, int n, void* base, DType t, int64_t offset) {
  if (t == DType::f32) {
    float* dst = static_cast<float*>(base) + offset;
    for (int i = 0; i < n; ++i) dst[i] = src[i];
  } else {
    uint16_t* dst = static_cast<uint16_t*>(base) + offset;
    if (t == DType::bf16)
      for (int i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
    else
      for (int i = 0; i < n; ++i) dst[i] = float_to_half(src[i]);
  }
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

// PTX primitives shared by the scoring and attention kernels: asynchronous global -> shared
// copies (cp.async), ldmatrix, the m16n8k16 tensor-core product (fp32 accumulation) with its
// packing and rounding, exact integer-code -> fp16 conversions, the SFU exp2, constants.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace locks::cuda::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

// ---------------------------------------------------------------- copies and shared memory
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte (4-byte) copy that fills zeros instead when !valid (src-size 0): the scoring
// stages, whose pages past the sequence must read as zero codes.
__device__ __forceinline__ void cp_async16_zfill(uint32_t d, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4_zfill(uint32_t d, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0));
}
// 16-byte copy of a cache row: rows of >= 256 bytes aligned to 256 and read whole by every
// instruction, so the L2 may fetch each row from DRAM as one 256-byte access (a hint;
// 128-byte rows get the 128-byte hint).
template <int RowBytes>
__device__ __forceinline__ void cp_async16_row(unsigned d, const void* src) {
  if constexpr (RowBytes >= 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(d), "l"(src)
                 : "memory");
  else
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(d), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
template <bool Trans>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], unsigned a) {
  if constexpr (Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// ---------------------------------------------------------------- tensor cores
template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ float round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  static __device__ __forceinline__ float round(float x) {
    return __half2float(__float2half_rn(x));
  }
};

// ---------------------------------------------------------------- conversions
// 2^x through the SFU (ex2.approx: 2 ulp), enough for page scores.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// (a & b) | c and (a & b) ^ c in one LOP3 each (the compiler splits them in two when both
// b and c are immediates).
template <uint32_t B, uint32_t C>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "n"(B), "n"(C));
  return d;
}
template <uint32_t B, uint32_t C>
__device__ __forceinline__ uint32_t and_xor(uint32_t a) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0x6A;\n" : "=r"(d) : "r"(a), "n"(B), "n"(C));
  return d;
}
__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// Eight int4 codes of a word -> four half2 (dims 8w+m and 8w+m+4 for m = 0..3), exact:
// nibbles biased to v + 8 are or-ed into the mantissa of 1024 (m even) or, four bits up, of
// 1024 = 64 * 16 (m odd; scaled back by the exact 1/16 of an HFMA2). 10 instructions a word.
__device__ __forceinline__ void int4x8_to_half2(uint32_t w, uint32_t (&out)[4]) {
  const uint32_t x = w ^ 0x88888888u, y = x >> 8;
  const __half2 bias = __floats2half2_rn(1032.0f, 1032.0f);
  const __half2 sixteenth = __floats2half2_rn(0.0625f, 0.0625f);
  const __half2 bias16 = __floats2half2_rn(-72.0f, -72.0f);
  out[0] = h2_bits(__hsub2(bits_h2(and_or<0x000F000Fu, 0x64006400u>(x)), bias));
  out[1] = h2_bits(__hfma2(bits_h2(and_or<0x00F000F0u, 0x64006400u>(x)), sixteenth, bias16));
  out[2] = h2_bits(__hsub2(bits_h2(and_or<0x000F000Fu, 0x64006400u>(y)), bias));
  out[3] = h2_bits(__hfma2(bits_h2(and_or<0x00F000F0u, 0x64006400u>(y)), sixteenth, bias16));
}
// Eight int8 codes (words a: dims 8v..8v+3, b: 8v+4..8v+7) -> four half2 with the same
// (dim m, dim m + 4) pairing as int4x8_to_half2, exact.
__device__ __forceinline__ void int8x8_to_half2(uint32_t a, uint32_t b, uint32_t (&out)[4]) {
  const __half2 bias = __floats2half2_rn(1152.0f, 1152.0f);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const uint32_t p = __byte_perm(a, b, uint32_t(m) | (uint32_t(4 + m) << 8));
    const uint32_t u = and_xor<0x00FF00FFu, 0x64806480u>(p);  // 1024 + (v + 128)
    out[m] = h2_bits(__hsub2(bits_h2(u), bias));
  }
}
// Two int8 codes (the low 16 bits of v) -> one half2, exact.
__device__ __forceinline__ uint32_t int8x2_to_half2(uint32_t v) {
  // bytes [c0, 0x64, c1, 0x64], sign bits flipped: halves 1024 + (c + 128)
  const uint32_t u = __byte_perm(v, 0x64646464u, 0x4140) ^ 0x00800080u;
  return h2_bits(__hsub2(bits_h2(u), __floats2half2_rn(1152.0f, 1152.0f)));
}
// x0, x1 -> fp16 hi parts and the fp16 residuals lo = x - hi (about 22 bits together).
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(x0, x1);
  const float2 f = __half22float2(h);
  hi = h2_bits(h);
  lo = h2_bits(__floats2half2_rn(x0 - f.x, x1 - f.y));
}

}  // namespace locks::cuda::detail

// Rounding of the CUDA kernels beyond float32 (test_compare.h's ArithModel), from their design
// (src/cuda/score_mma.cu and attention.cu headers), shared by the op suite's CUDA backend and
// the kernel tests:
//   scoring: the query (normalised by a power of two) and the projected query V q enter the
//     fp16 tensor cores rounded once at G 5-16 (d 64 / 128): 2^-11 relative each, on the
//     q.mu and on the (V q).c terms; the int4/int8 codes are exact. A third 2^-11 covers fp16
//     subnormals (query entries below 2^-14 of the head's largest). So |error| <= 2^-9 A.
//     (G <= 4 and d 256 keep hi + lo halves, about 22 bits: the same bound holds.)
//     Int4 bases with 32-dim scale groups (basis_group < head_dim): each code enters as
//     fl16(code * fl16(s_kj / m_k)), m_k = max_j s_kj (score_mma.cu, (b)): two fp16 roundings
//     of a value <= 7 in units of m_k, 2^-11 relative each when normal, 2^-25 absolute each
//     when subnormal (the ratio's, times |code| <= 7, plus the product's: 8 * 2^-25 = 2^-22);
//     the ratio's two fp32 operations add 2^-23 relative. So every entry B_kc is within
//     2^-10 (1 + 2^-10) |B_kc| + 2^-21 m_k (u_basis, basis_abs: test_compare.h).
//   aggregation: __expf / __logf, within ~100 ulp for the log-domain shares: 1e-5 absolute;
//   attention: the query as two 16-bit halves (hi + lo): 2^-15 (same subnormal margin);
//     softmax weights rounded to the cache's 16-bit type for P V: 2^-8 (bf16), 2^-11 (f16).
#pragma once

#include "locks/dtype.h"
#include "test_compare.h"

namespace locks::test {

inline ArithModel cuda_arith(DType kv) {
  ArithModel m;
  m.u_score = 1.0 / 512;
  m.u_basis = (1.0 / 1024) * (1.0 + 1.0 / 1024);
  m.basis_abs = 1.0 / (1 << 21);
  m.agg_abs = 1e-5;
  m.u_query = 1.0 / 32768;
  m.u_weight = kv == DType::f16 ? 1.0 / 2048 : 1.0 / 256;
  return m;
}

}  // namespace locks::test

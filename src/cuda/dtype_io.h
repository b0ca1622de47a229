// The query a kernel reads and the output it writes, in fp32 or the model's fp16 / bf16
// (QueryView::dtype, AttentionOutput::dtype). The element type is a runtime value, uniform
// over a launch: the query is read once in each block's prologue and the output written once
// in the merge, so a branch there costs little, where a template per dtype would triple the
// kernel instances (score_mma and attn_kernel keep one more instance, for a contiguous fp32
// query: their pre-dtype instructions). Host-side header (decoder_wrapper.cpp includes the
// launchers); the device loads and stores are in common.cuh.
#pragma once

#include <cstdint>

#include "locks/dtype.h"
#include "locks/score.h"

namespace locks::cuda::detail {

struct QIn {
  const void* p = nullptr;  // [B, Hq, d]: each sequence's [Hq, d] contiguous
  DType t = DType::f32;
  int64_t stride = 0;  // elements from one sequence's query to the next (QueryView::row_stride)
};

struct OutBuf {
  void* p = nullptr;  // [B, Hq, d] contiguous
  DType t = DType::f32;
};

inline QIn q_in(const QueryView& q, int head_dim) { return {q.q, q.dtype, q.row_stride(head_dim)}; }

// The query the fp32 instances of score_mma and attn_kernel read: fp32, rows back to back.
inline bool contiguous_f32(const QIn& q, int num_q_heads, int head_dim) {
  return q.t == DType::f32 && q.stride == int64_t(num_q_heads) * head_dim;
}

}  // namespace locks::cuda::detail

// Exact decode attention on the paged cache: dense (every token, FullKV) and sparse
// (the selected pages only). One query token per sequence; fp32 accumulation with an
// online (streaming) softmax, numerically stable for any logit range.
// Dense attention is the sparse kernel run over every page in order, so sparse with all
// pages selected equals dense bit for bit. CPU: the page list is cut into fixed 16-page
// chunks merged in order (flash-decoding), so results do not depend on the thread count.
// Sparse requires, per (sequence, KV head), 1 <= count <= capacity and strictly ascending
// page indices within the sequence.
#pragma once

#include <cstdint>

#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"

namespace locks {

// The output in fp32 or in the model's dtype (fp16 / bf16: each value rounded once from the
// fp32 result, round to nearest even); the log-sum-exp stays fp32.
struct AttentionOutput {
  void* out = nullptr;   // [batch, num_q_heads, head_dim], contiguous, of dtype
  float* lse = nullptr;  // optional [batch, num_q_heads]: log-sum-exp of the scaled logits
  DType dtype = DType::f32;
};

namespace cpu {
void decode_attention_dense(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                            float scale, const AttentionOutput& out);
void decode_attention_sparse(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                             float scale, const Selection& sel, const AttentionOutput& out);
}  // namespace cpu

}  // namespace locks

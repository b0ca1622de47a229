// Page scoring from summaries only (never reads K or V):
//   s_j(q) = log sum_{i in page j} exp( (q.mu_j + (V_j q).c_i) * scale )
// the estimated log of page j's unnormalised attention mass for one query head.
//
// Grouped-query attention ("share-averaging"): each KV head makes one selection,
// shared by its G = num_q_heads / num_kv_heads query heads. Page j's group score is
//   a_j = log( (1/G) sum_h exp(s_hj - LSE_h) ),   LSE_h = log sum_j exp(s_hj)
// i.e. the log of the mean over the group of each head's normalised estimated mass
// share. Normalising first keeps one head with large logits from drowning the
// others (a plain sum of masses would), and averaging shares keeps a page that one
// head needs strongly (a max would too, but a max ignores pages useful to all heads
// at moderate weight). Query head h reads KV head h / G (the HF/vLLM convention).
#pragma once

#include <cstdint>

#include "locks/dtype.h"
#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks {

// The query in fp32 or in the model's own dtype (fp16 / bf16: read as float by every op, so
// an engine passes its activations without a conversion kernel; the ops' arithmetic is fp32
// either way). Each sequence's [num_q_heads, head_dim] is contiguous; sequences may lie
// `stride` elements apart (an engine's query is often a view into a fused QKV projection).
struct QueryView {
  const void* q = nullptr;  // [batch_size, num_q_heads, head_dim] of dtype
  int num_q_heads = 1;
  DType dtype = DType::f32;
  int64_t stride = 0;  // elements from one sequence's query to the next; 0: num_q_heads * head_dim
  int64_t row_stride(int head_dim) const {
    return stride != 0 ? stride : int64_t(num_q_heads) * head_dim;
  }
  // Element offset of (sequence b, query head h): that head's head_dim values follow.
  int64_t offset(int64_t b, int64_t h, int head_dim) const {
    return b * row_stride(head_dim) + h * head_dim;
  }
};

namespace cpu {
// head_scores: [batch, num_q_heads, max_blocks_per_seq] fp32. Entry (b, h, j) is s_j for
// every full page j of sequence b, and -inf for the tail page and j beyond the sequence.
void score_pages(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                 float scale, float* head_scores);

// group_scores: [batch, num_kv_heads, max_blocks_per_seq]; the share-averaging rule above,
// -inf where head_scores are -inf for every head of the group.
void aggregate_gqa(const float* head_scores, const BatchView& batch, int num_q_heads,
                   int num_kv_heads, float* group_scores);
}  // namespace cpu

}  // namespace locks

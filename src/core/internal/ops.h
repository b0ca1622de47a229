// The CPU ops with their scratch given (contract.cpp passes slices of the caller's
// workspace; the public entry points of score.h / select.h / attention.h pass an
// OwnedScratch). Each validates its arguments exactly as the public entry point does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "internal/scratch.h"
#include "locks/attention.h"
#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks::cpu::impl {

// Per-thread scratch bytes of each op.
size_t score_scratch_bytes(int group, int rank, int head_dim, int page_size);
size_t aggregate_scratch_bytes(int group, int max_blocks);
size_t select_scratch_bytes(int max_blocks);
size_t attention_scratch_bytes(int page_size, int head_dim, int group);
// Shared (not per-thread) bytes of attention for a batch shape: chunk bookkeeping and the
// chunk states of every (sequence, query head), bounded by max_blocks pages a list.
size_t attention_shared_bytes(int batch, int num_kv_heads, int num_q_heads, int max_blocks,
                              int head_dim);

// page_mask [batch, num_kv_heads, max_blocks] (optional): pages with 0 score -inf unread
// (the level-2 step of the two-level selection, super_summary.h). bt_head_stride: KV head
// g reads its block ids at block_table[b * stride + g * bt_head_stride + j] (0: one row a
// sequence; the two-level step's per-head page lists use list_cap).
void score_pages(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                 float scale, float* head_scores, const detail::ThreadScratch& sc,
                 const uint8_t* page_mask = nullptr, int64_t bt_head_stride = 0);
void aggregate_gqa(const float* head_scores, const BatchView& batch, int num_q_heads,
                   int num_kv_heads, float* group_scores, const detail::ThreadScratch& sc);
void select_pages(const float* group_scores, const BatchView& batch, int num_kv_heads,
                  int page_size, const SelectConfig& cfg, const Selection& out,
                  const detail::ThreadScratch& sc);
// sel == nullptr: dense. shared: attention_shared_bytes of this batch, or nullptr to
// allocate exactly what the selection needs (the public entry points).
void decode_attention(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                      float scale, const Selection* sel, const AttentionOutput& out,
                      const detail::ThreadScratch& sc, std::byte* shared, size_t shared_bytes);

}  // namespace locks::cpu::impl

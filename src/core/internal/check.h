// Argument checks shared by the CPU entry points (all throw locks::Error). They run
// before any parallel region: an exception must never escape an OpenMP region.
#pragma once

#include <cstdint>

#include "locks/attention.h"
#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks::detail {

// Batch shape and lengths only (no block table): batch_size >= 1, max_blocks_per_seq >= 1,
// seq_lens in [1, max_blocks_per_seq * page_size].
void check_batch_shape(const BatchView& batch, int page_size, const char* where);
// Shape, lengths and every used block id in [0, num_blocks).
void check_batch_blocks(const BatchView& batch, int64_t num_blocks, int page_size,
                        const char* where);
// q non-null, num_q_heads a positive multiple of num_kv_heads, every element finite.
void check_query(const QueryView& q, int batch_size, int num_kv_heads, int head_dim,
                 const char* where);
void check_scale(float scale, const char* where);
// The arrays of out's precision non-null (the summary builds' output).
void check_summary_arrays(const SummaryView& out, const char* where);
// counts in [1, capacity]; pages strictly ascending within [0, pages of the sequence).
void check_selection(const Selection& sel, const BatchView& batch, int num_kv_heads, int page_size,
                     const char* where);

inline int num_pages(int32_t seq_len, int page_size) {
  return (seq_len + page_size - 1) / page_size;
}

}  // namespace locks::detail

// Page selection under a token budget.
//
// Budget b tokens -> k = floor(b / P) page slots per (sequence, KV head), filled as:
//   1. the partial tail page, if the sequence has one (it has no summary: always attended);
//   2. the first `sink_pages` pages and the last `recent_pages` full pages;
//   3. the remaining slots: the highest-scoring other full pages; ties go to the lower index.
// All counted inside the budget. If b >= seq_len, every page is selected (exact full
// attention). Selected logical page indices are written in ascending order.
// A budget with k < sink_pages + recent_pages + 1 is an error (one slot is reserved for
// the tail, so that capacity does not depend on the data).
#pragma once

#include <cstdint>

#include "locks/kv_cache.h"

namespace locks {

struct SelectConfig {
  int budget_tokens = 2048;
  int sink_pages = 0;
  int recent_pages = 0;
};

// Throws on a budget too small for sink + recent + tail, or negative counts.
void validate_select(const SelectConfig& cfg, int page_size);

// Slots to allocate per (sequence, KV head): min(ceil(b/P), max_blocks_per_seq). That holds
// floor(b/P) pages when b < seq_len, and every page when b >= seq_len: ceil(seq_len/P) can
// exceed floor(b/P) when b is not a multiple of P (b = 20, P = 16, seq_len = 20: 2 pages).
// (Changed from "floor(b/P)" by the core owner: floor under-allocated that case.)
int select_capacity(const SelectConfig& cfg, int page_size, int max_blocks_per_seq);

struct Selection {
  int32_t* pages = nullptr;   // [batch, num_kv_heads, capacity], ascending, -1 padded
  int32_t* counts = nullptr;  // [batch, num_kv_heads]
  int capacity = 0;
};

namespace cpu {
// group_scores: [batch, num_kv_heads, max_blocks_per_seq] (from aggregate_gqa).
void select_pages(const float* group_scores, const BatchView& batch, int num_kv_heads,
                  int page_size, const SelectConfig& cfg, const Selection& out);
}  // namespace cpu

}  // namespace locks

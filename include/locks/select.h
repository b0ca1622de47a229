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
//
// Adaptive budget (tau > 0; docs/method.md): step 3 takes only the fewest best-scored pages
// (at least floor_pages, at most the budget's slots) whose estimated mass, added to that of
// the sink and recent pages, covers tau of the estimated total. A page's estimated mass is
// exp(group score); the estimated total is the sum over every full page of the sequence
// (the tail page has no score and counts in neither). The budget stays the ceiling and the
// capacity does not change (fixed capacity, variable count: graph-safe); b >= seq_len still
// selects every page. tau = 0 is the fixed budget.
#pragma once

#include <cstdint>

#include "locks/kv_cache.h"

namespace locks {

struct SelectConfig {
  int budget_tokens = 2048;
  int sink_pages = 0;
  int recent_pages = 0;
  float tau = 0.0f;     // adaptive budget: 0 = fixed, else the mass share to cover, in (0, 1]
  int floor_pages = 1;  // adaptive budget: scored pages kept at least (fewer only when the
                        // sequence has fewer candidates), in [0, scored slots]
  // A minimum context: a sequence shorter than dense_below tokens attends every page (exact
  // decode below it), per sequence and inside one launch, so a captured graph serves short
  // and long sequences alike. 0 (or anything <= budget_tokens + 1) changes nothing; above the
  // budget the capacity grows to hold those pages (select_capacity).
  int dense_below = 0;
};

// Throws on a budget too small for sink + recent + tail, negative counts (dense_below too), tau
// outside {0} u (0, 1] (NaN included), floor_pages < 0, or with tau > 0 floor_pages above the
// budget's scored slots floor(b/P) - sink - recent - 1.
void validate_select(const SelectConfig& cfg, int page_size);

// Slots to allocate per (sequence, KV head): min(max(ceil(b/P), ceil((dense_below-1)/P)),
// max_blocks_per_seq). That holds floor(b/P) pages when b < seq_len, and every page when
// b >= seq_len or seq_len < dense_below: ceil(seq_len/P) can exceed floor(b/P) when b is not
// a multiple of P (b = 20, P = 16, seq_len = 20: 2 pages).
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

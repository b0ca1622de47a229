// Argument checks of the reference, written independently of the core's validators so
// that the reference does not inherit their bugs.
#pragma once

#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::ref::detail {

void check_cache_layout(const CacheLayout& l);
void check_cache(const KvCacheView& cache);
void check_summary_layout(const SummaryLayout& s);
void check_summary_view(const SummaryView& s);
// Every seq_len in [1, max_blocks_per_seq * page_size], every used block id in [0, num_blocks).
void check_batch(int page_size, int64_t num_blocks, const BatchView& batch);
void check_finite(const float* x, int64_t n, const char* what);

inline int64_t num_pages(int32_t seq_len, int page_size) {
  return (int64_t(seq_len) + page_size - 1) / page_size;
}

}  // namespace locks::ref::detail

// Argument checks of the reference, written independently of the core's validators so
// that the reference does not inherit their bugs.
#pragma once

#include <vector>

#include "locks/dtype.h"
#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::ref::detail {

void check_cache_layout(const CacheLayout& l);
// Also: block_stride 0 (dense) or at least one block's elements.
void check_cache(const KvCacheView& cache);
// Element offset of (block, slot, head) in K or V: blocks block_stride apart (0: dense).
inline int64_t element_offset(const KvCacheView& c, int64_t block, int slot, int head) {
  const CacheLayout& l = c.layout;
  const int64_t dense = int64_t(l.page_size) * l.num_kv_heads * l.head_dim;
  return block * (c.block_stride == 0 ? dense : c.block_stride) +
         (int64_t(slot) * l.num_kv_heads + head) * l.head_dim;
}
void check_summary_layout(const SummaryLayout& s);
void check_summary_view(const SummaryView& s);
// Every seq_len in [1, max_blocks_per_seq * page_size], every used block id in [0, num_blocks).
void check_batch(int page_size, int64_t num_blocks, const BatchView& batch);
void check_finite(const float* x, int64_t n, const char* what);
// The same over n elements of a buffer of dtype t (a query in the model's dtype).
void check_finite(const void* x, DType t, int64_t offset, int64_t n, const char* what);
// n elements of x (dtype t) from offset, as float (the query rows the reference reads).
std::vector<float> to_float(const void* x, DType t, int64_t offset, int n);

inline int64_t num_pages(int32_t seq_len, int page_size) {
  return (int64_t(seq_len) + page_size - 1) / page_size;
}

}  // namespace locks::ref::detail

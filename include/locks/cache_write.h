// Writing a step's K/V rows into the paged cache (kv_cache.h) and rebuilding the summaries of
// the blocks the step completes, as one op: what a serving engine does before each decode
// step, in one CUDA launch instead of a cache write and a summary update
// (contract.h: cpu::cache_write_slots / cuda::cache_write_slots).
#pragma once

#include <cstdint>

#include "locks/kv_cache.h"

namespace locks {

// The rows of n tokens to write, key and value [n_tokens, num_kv_heads, head_dim] in the
// cache's dtype: element (t, h, c) of K at k + t * k_token_stride + h * k_head_stride + c (the
// dims contiguous), V likewise; any non-negative strides (e.g. views into a fused QKV
// projection's output).
struct TokenRows {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t n_tokens = 0;
  int64_t k_token_stride = 0, k_head_stride = 0;
  int64_t v_token_stride = 0, v_head_stride = 0;
};

// A cache to write into: KvCacheView's geometry over mutable memory.
struct KvCacheWriteView {
  void* k = nullptr;
  void* v = nullptr;
  CacheLayout layout;
  int64_t block_stride = 0;  // as KvCacheView::block_stride (0 = dense)
  KvCacheView view() const { return {k, v, layout, block_stride}; }
};

// Throws locks::Error unless rows can be read for this layout: n_tokens >= 0; with n_tokens > 0
// non-null k and v and strides >= 0 whose last element's offset fits int64.
void validate_token_rows(const CacheLayout& layout, const TokenRows& rows);

}  // namespace locks

// validate_layout (include/locks/kv_cache.h): the cache layouts any backend accepts.
#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks {

void validate_layout(const CacheLayout& layout) {
  LOCKS_REQUIRE(layout.num_blocks >= 1, "num_blocks must be >= 1, got ", layout.num_blocks);
  LOCKS_REQUIRE(layout.page_size >= 2 && layout.page_size <= 256,
                "page_size must be in [2, 256], got ", layout.page_size);
  LOCKS_REQUIRE(layout.num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", layout.num_kv_heads);
  const int d = layout.head_dim;
  LOCKS_REQUIRE(d == 32 || d == 64 || d == 96 || d == 128 || d == 256,
                "head_dim must be one of 32, 64, 96, 128, 256, got ", d);
  const int t = static_cast<int>(layout.dtype);
  LOCKS_REQUIRE(t >= 0 && t <= 2, "unknown dtype code ", t);
}

}  // namespace locks

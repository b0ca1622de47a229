// validate_batch (include/locks/kv_cache.h); validate_layout is in src/common.
#include "internal/check.h"
#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks {

void validate_batch(const CacheLayout& layout, const BatchView& batch) {
  validate_layout(layout);
  detail::check_batch_blocks(batch, layout.num_blocks, layout.page_size, __func__);
}

}  // namespace locks

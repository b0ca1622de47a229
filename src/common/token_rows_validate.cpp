// validate_token_rows (include/locks/cache_write.h): the rows a cache write reads, any backend.
#include <cstdint>
#include <limits>

#include "locks/cache_write.h"
#include "locks/error.h"

namespace locks {

namespace {
// The offset of element (n - 1, H - 1, d - 1) fits int64, so every row offset does.
void check_strides(const char* what, int64_t n, int64_t token_stride, int64_t head_stride,
                   const CacheLayout& L) {
  LOCKS_REQUIRE(token_stride >= 0 && head_stride >= 0, what, " strides must be >= 0, got ",
                token_stride, " (token) and ", head_stride, " (head)");
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() / 16;  // bytes of any dtype
  const int64_t H = L.num_kv_heads, d = L.head_dim;
  LOCKS_REQUIRE((token_stride == 0 || n - 1 <= kMax / token_stride) &&
                    (head_stride == 0 || H - 1 <= kMax / head_stride),
                what, " strides (", token_stride, ", ", head_stride, ") overflow int64 over ", n,
                " tokens");
  const int64_t last = (n - 1) * token_stride + (H - 1) * head_stride + d;
  LOCKS_REQUIRE(last <= kMax, what, " rows overflow int64 over ", n, " tokens");
}
}  // namespace

void validate_token_rows(const CacheLayout& layout, const TokenRows& rows) {
  LOCKS_REQUIRE(rows.n_tokens >= 0, "n_tokens must be >= 0, got ", rows.n_tokens);
  if (rows.n_tokens == 0) return;
  LOCKS_REQUIRE(rows.k != nullptr && rows.v != nullptr, "key / value rows are null");
  check_strides("key", rows.n_tokens, rows.k_token_stride, rows.k_head_stride, layout);
  check_strides("value", rows.n_tokens, rows.v_token_stride, rows.v_head_stride, layout);
}

}  // namespace locks

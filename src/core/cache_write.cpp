// cpu::cache_write_slots (contract.h, cache_write.h): every argument checked first, then the
// rows copied into their slots in token order (so the last of several tokens naming one slot
// is what stays), then summary_build_slots over the same slots.
#include <cmath>
#include <cstring>
#include <vector>

#include "internal/check.h"
#include "internal/row_convert.h"
#include "locks/contract.h"
#include "locks/error.h"

namespace locks::cpu {

namespace {

const char* row_at(const void* base, int64_t offset, int64_t es) {
  return static_cast<const char*>(base) + offset * es;
}

// Every element of the n tokens' rows finite (the cache's policy, kv_cache.h: non-finite
// keys or values are refused when data enters the cache).
void check_finite(const TokenRows& rows, const int32_t* slots, const CacheLayout& L) {
  const int d = L.head_dim;
  std::vector<float> buf(size_t(d), 0.0f);
  for (int64_t t = 0; t < rows.n_tokens; ++t) {
    if (slots[t] < 0) continue;  // padding: not written, not read
    for (int h = 0; h < L.num_kv_heads; ++h) {
      for (int which = 0; which < 2; ++which) {
        const int64_t off = which == 0 ? t * rows.k_token_stride + h * rows.k_head_stride
                                       : t * rows.v_token_stride + h * rows.v_head_stride;
        detail::convert_row(which == 0 ? rows.k : rows.v, L.dtype, off, d, buf.data());
        for (int c = 0; c < d; ++c)
          LOCKS_REQUIRE(std::isfinite(buf[size_t(c)]), which == 0 ? "key" : "value",
                        " row of token ", t, ", KV head ", h, " has a non-finite element (dim ", c,
                        ")");
      }
    }
  }
}

}  // namespace

void cache_write_slots(const KvCacheWriteView& cache, const TokenRows& rows,
                       const int32_t* slot_mapping, const SummaryView* out) {
  const KvCacheView view = cache.view();
  const CacheLayout& L = cache.layout;
  validate_cache(view);
  LOCKS_REQUIRE(cache.k != nullptr && cache.v != nullptr, "cache.k / cache.v are null");
  validate_token_rows(L, rows);
  if (out) {
    // The layout, query-weight and array checks of the build, before anything is written.
    summary_build(view, nullptr, 0, *out);
    detail::check_summary_arrays(*out, __func__);
  }
  const int64_t n = rows.n_tokens;
  if (n == 0) return;
  LOCKS_REQUIRE(slot_mapping != nullptr, "slot_mapping is null");
  const int64_t P = L.page_size;
  for (int64_t i = 0; i < n; ++i)
    LOCKS_REQUIRE(slot_mapping[i] >= -1 && slot_mapping[i] / P < L.num_blocks, "slot_mapping[", i,
                  "] = ", slot_mapping[i],
                  " outside [-1 (padding), num_blocks * page_size = ", L.num_blocks * P, ")");
  check_finite(rows, slot_mapping, L);

  const int64_t es = dtype_size(L.dtype), row_bytes = L.head_dim * es;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t s = slot_mapping[t];
    if (s < 0) continue;
    for (int h = 0; h < L.num_kv_heads; ++h) {
      const int64_t dst = view.offset(s / P, int(s % P), h);
      // memmove: the rows may be views into the cache itself
      std::memmove(static_cast<char*>(cache.k) + dst * es,
                   row_at(rows.k, t * rows.k_token_stride + h * rows.k_head_stride, es),
                   size_t(row_bytes));
      std::memmove(static_cast<char*>(cache.v) + dst * es,
                   row_at(rows.v, t * rows.v_token_stride + h * rows.v_head_stride, es),
                   size_t(row_bytes));
    }
  }
  if (out) summary_build_slots(view, slot_mapping, n, *out);
}

}  // namespace locks::cpu

// validate_layout, validate_cache (include/locks/kv_cache.h): the cache layouts and views any
// backend accepts.
#include <cstdint>
#include <limits>

#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks {

void validate_layout(const CacheLayout& layout) {
  LOCKS_REQUIRE(layout.num_blocks >= 1, "num_blocks must be >= 1, got ", layout.num_blocks);
  LOCKS_REQUIRE(layout.page_size >= 2 && layout.page_size <= 256,
                "page_size must be in [2, 256], got ", layout.page_size);
  LOCKS_REQUIRE(layout.num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", layout.num_kv_heads);
  const int d = layout.head_dim;
  LOCKS_REQUIRE(head_dim_valid(d), "head_dim must be even and in [", kMinHeadDim, ", ", kMaxHeadDim,
                "], got ", d);
  LOCKS_REQUIRE(dtype_known(layout.dtype), "unknown dtype code ", static_cast<int>(layout.dtype));
}

void validate_cache(const KvCacheView& cache) {
  const CacheLayout& L = cache.layout;
  validate_layout(L);
  const int64_t es = dtype_size(L.dtype);
  const int64_t E = L.block_elems();  // < 2^31 * 2^16: no overflow
  const int64_t S = cache.block_stride;
  LOCKS_REQUIRE(S == 0 || S >= E, "block_stride ", S,
                " is below one block's elements (page_size * num_kv_heads * head_dim = ", E,
                "): consecutive blocks would overlap; 0 means dense");
  const int64_t step = cache.block_step();
  LOCKS_REQUIRE(step <= std::numeric_limits<int64_t>::max() / es / L.num_blocks, "block_stride ",
                step, " x num_blocks ", L.num_blocks, " overflows int64 bytes");
  if (cache.k == nullptr || cache.v == nullptr) return;
  // In bytes from K's base: K block i spans [i S, i S + E), V block j [delta + j S,
  // delta + j S + E). They overlap iff |delta + m S| < E for some m = j - i in
  // [-(N-1), N-1]; S >= E, so only the two m nearest -delta / S can.
  const int64_t stepb = step * es, eb = E * es, n = L.num_blocks;
  const auto kb = reinterpret_cast<uintptr_t>(cache.k), vb = reinterpret_cast<uintptr_t>(cache.v);
  const uintptr_t dist = kb > vb ? kb - vb : vb - kb;
  if (dist >= uintptr_t((n - 1) * stepb + eb)) return;  // the arrays' extents are disjoint
  const int64_t delta = kb > vb ? -int64_t(dist) : int64_t(dist);
  const int64_t q = -delta / stepb, m0 = q * stepb > -delta ? q - 1 : q;  // floor(-delta / S)
  for (int64_t m = m0; m <= m0 + 1; ++m) {
    const int64_t gap = delta + m * stepb;
    if (m < -(n - 1) || m > n - 1 || gap <= -eb || gap >= eb) continue;
    locks::detail::fail("validate_cache", "cache.k and cache.v overlap: K block ", m >= 0 ? 0 : -m,
                        " and V block ", m >= 0 ? m : 0, " share memory (v - k = ", delta,
                        " bytes, block stride ", stepb, " bytes, a block ", eb,
                        " bytes); K and V must be disjoint");
  }
}

}  // namespace locks

#include "checks.h"

#include <cmath>

#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks::ref::detail {

void check_cache_layout(const CacheLayout& l) {
  LOCKS_REQUIRE(l.num_blocks >= 1, "num_blocks must be >= 1, got ", l.num_blocks);
  LOCKS_REQUIRE(l.page_size >= 2 && l.page_size <= 256, "page_size must be in [2, 256], got ",
                l.page_size);
  LOCKS_REQUIRE(l.num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", l.num_kv_heads);
  const int d = l.head_dim;
  LOCKS_REQUIRE(head_dim_valid(d), "head_dim must be even and in [", kMinHeadDim, ", ", kMaxHeadDim,
                "], got ", d);
}

void check_cache(const KvCacheView& cache) {
  check_cache_layout(cache.layout);
  LOCKS_REQUIRE(cache.k != nullptr && cache.v != nullptr, "cache K/V pointers must not be null");
  const CacheLayout& l = cache.layout;
  LOCKS_REQUIRE(cache.block_stride == 0 ||
                    cache.block_stride >= int64_t(l.page_size) * l.num_kv_heads * l.head_dim,
                "block_stride must be 0 or >= page_size * num_kv_heads * head_dim, got ",
                cache.block_stride);
}

void check_summary_layout(const SummaryLayout& s) {
  LOCKS_REQUIRE(s.num_blocks >= 1, "summary num_blocks must be >= 1, got ", s.num_blocks);
  LOCKS_REQUIRE(s.page_size >= 2 && s.page_size <= 256, "summary page_size must be in [2, 256]");
  LOCKS_REQUIRE(s.num_kv_heads >= 1, "summary num_kv_heads must be >= 1");
  LOCKS_REQUIRE(s.head_dim >= 2 && s.head_dim % 2 == 0, "summary head_dim must be even, got ",
                s.head_dim);
  LOCKS_REQUIRE(s.rank >= 1 && s.rank < s.page_size && s.rank <= s.head_dim,
                "rank must be in [1, min(page_size - 1, head_dim)], got ", s.rank);
  LOCKS_REQUIRE(s.basis_group >= 2 && s.basis_group % 2 == 0 && s.head_dim % s.basis_group == 0,
                "summary basis_group must be an even divisor of head_dim ", s.head_dim, ", got ",
                s.basis_group);
}

void check_summary_view(const SummaryView& s) {
  check_summary_layout(s.layout);
  if (s.layout.precision == Precision::fp32) {
    LOCKS_REQUIRE(s.mu && s.basis && s.coeff, "fp32 summary pointers must not be null");
  } else {
    LOCKS_REQUIRE(s.mu_q && s.mu_scale && s.basis_q && s.basis_scale && s.coeff_q && s.coeff_scale,
                  "quant summary pointers must not be null");
  }
  validate_qweight(s.qweight, s.layout.num_kv_heads, s.layout.head_dim);
}

void check_batch(int page_size, int64_t num_blocks, const BatchView& b) {
  LOCKS_REQUIRE(b.block_table != nullptr && b.seq_lens != nullptr,
                "block_table and seq_lens must not be null");
  LOCKS_REQUIRE(b.batch_size >= 1, "batch_size must be >= 1, got ", b.batch_size);
  LOCKS_REQUIRE(b.max_blocks_per_seq >= 1, "max_blocks_per_seq must be >= 1");
  LOCKS_REQUIRE(b.block_table_stride >= b.max_blocks_per_seq,
                "block_table_stride must be >= max_blocks_per_seq");
  for (int s = 0; s < b.batch_size; ++s) {
    const int32_t len = b.seq_lens[s];
    LOCKS_REQUIRE(len >= 1 && int64_t(len) <= int64_t(b.max_blocks_per_seq) * page_size,
                  "seq_lens[", s, "] = ", len, " out of [1, max_blocks_per_seq * page_size]");
    for (int64_t j = 0; j < num_pages(len, page_size); ++j) {
      const int32_t blk = b.block_table[s * b.block_table_stride + j];
      LOCKS_REQUIRE(blk >= 0 && blk < num_blocks, "block id ", blk, " of sequence ", s,
                    " out of range");
    }
  }
}

void check_finite(const float* x, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) LOCKS_REQUIRE(std::isfinite(x[i]), what, " has NaN or Inf");
}

void check_finite(const void* x, DType t, int64_t offset, int64_t n, const char* what) {
  LOCKS_REQUIRE(t == DType::f32 || t == DType::f16 || t == DType::bf16, what, ": unknown dtype");
  for (int64_t i = 0; i < n; ++i)
    LOCKS_REQUIRE(std::isfinite(load_as_float(x, t, offset + i)), what, " has NaN or Inf");
}

std::vector<float> to_float(const void* x, DType t, int64_t offset, int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = load_as_float(x, t, offset + i);
  return v;
}

}  // namespace locks::ref::detail

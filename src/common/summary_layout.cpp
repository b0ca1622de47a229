// Summary layout checks and sizes (include/locks/summary.h).
#include "locks/error.h"
#include "locks/summary.h"

namespace locks {

void validate_summary_layout(const SummaryLayout& s) {
  LOCKS_REQUIRE(s.num_blocks >= 1, "num_blocks must be >= 1, got ", s.num_blocks);
  LOCKS_REQUIRE(s.page_size >= 2 && s.page_size <= 256, "page_size must be in [2, 256], got ",
                s.page_size);
  LOCKS_REQUIRE(s.num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", s.num_kv_heads);
  LOCKS_REQUIRE(s.head_dim >= 2 && s.head_dim % 2 == 0, "head_dim must be even and >= 2, got ",
                s.head_dim);
  LOCKS_REQUIRE(s.rank >= 1 && s.rank < s.page_size, "rank must be in [1, page_size) = [1, ",
                s.page_size, "), got ", s.rank);
  LOCKS_REQUIRE(s.rank <= s.head_dim, "rank ", s.rank, " exceeds head_dim ", s.head_dim);
  const int p = static_cast<int>(s.precision);
  LOCKS_REQUIRE(p == 0 || p == 1, "unknown precision code ", p);
  // Even: a byte holds two int4 codes, and a scale group never splits a byte.
  LOCKS_REQUIRE(
      s.basis_group >= 2 && s.basis_group % 2 == 0 && s.head_dim % s.basis_group == 0,
      "basis_group (dims per int4 basis scale) must be an even divisor of head_dim ", s.head_dim,
      ", got ", s.basis_group,
      s.basis_group == 0 ? " (unset: use summary_layout_for or default_basis_group)" : "");
}

int default_basis_group(int head_dim) {
  return head_dim >= 256 && head_dim % 32 == 0 ? 32 : head_dim;
}

SummaryLayout summary_layout_for(const CacheLayout& cache, int rank, Precision precision,
                                 int basis_group) {
  validate_layout(cache);
  SummaryLayout s;
  s.num_blocks = cache.num_blocks;
  s.page_size = cache.page_size;
  s.num_kv_heads = cache.num_kv_heads;
  s.head_dim = cache.head_dim;
  s.rank = rank;
  s.precision = precision;
  s.basis_group = basis_group == 0 ? default_basis_group(cache.head_dim) : basis_group;
  validate_summary_layout(s);
  return s;
}

size_t summary_bytes_per_page(const SummaryLayout& s) {
  validate_summary_layout(s);
  const size_t d = size_t(s.head_dim), r = size_t(s.rank), P = size_t(s.page_size);
  if (s.precision == Precision::fp32) return 4 * (d + r * d + P * r);
  // int8 mu + its scale, int4 basis + r * d / g scales, int8 coefficients + r scales.
  const size_t groups = d / size_t(s.basis_group);
  return d + 4 + r * d / 2 + 4 * r * groups + P * r + 4 * r;
}

double summary_share_of_bf16_kv(const SummaryLayout& s) {
  const double kv = 2.0 * s.page_size * s.head_dim * 2.0;
  return double(summary_bytes_per_page(s)) / kv;
}

}  // namespace locks

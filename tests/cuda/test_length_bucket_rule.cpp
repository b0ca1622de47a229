// The length buckets' rules (src/cuda/length_bucket_rule.h) as pure functions: no GPU needed,
// so they run in the CPU CI too.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "../../src/cuda/length_bucket_rule.h"

namespace locks::cuda_test {
namespace {

using locks::cuda::detail::bucket_pages;
using locks::cuda::detail::length_bucket;

TEST(LengthBucketRule, PagesHalveUpToTheLast) {
  EXPECT_EQ(bucket_pages(65536, 4, 3), 65536);
  EXPECT_EQ(bucket_pages(65536, 4, 2), 32768);
  EXPECT_EQ(bucket_pages(65536, 4, 0), 8192);
  EXPECT_EQ(bucket_pages(1000, 3, 0), 250);
  EXPECT_EQ(bucket_pages(1001, 3, 0), 251);  // rounded up: the bucket holds M / 4 pages
  EXPECT_EQ(bucket_pages(1, 5, 0), 1);
  EXPECT_EQ(bucket_pages(2147483647, 2, 0), 1073741824);  // no overflow at the int limit
  for (int M : {1, 7, 64, 1000, 65537})
    for (int n = 1; n <= 8; ++n)
      for (int i = 0; i < n; ++i) {
        const int m = bucket_pages(M, n, i);
        EXPECT_GE(int64_t(m) << (n - 1 - i), M) << M << " " << n << " " << i;      // holds M / 2^k
        EXPECT_LT(int64_t(m - 1) << (n - 1 - i), M) << M << " " << n << " " << i;  // the least
      }
}

TEST(LengthBucketRule, TheFirstBucketHoldingTheLongestRow) {
  const std::vector<int64_t> t = {2048, 4096, 8192, 16384};
  EXPECT_EQ(length_bucket(0, t.data(), 4), 0);  // empty batch (every length untrusted)
  EXPECT_EQ(length_bucket(1, t.data(), 4), 0);
  EXPECT_EQ(length_bucket(2048, t.data(), 4), 0);  // a row exactly the bucket's
  EXPECT_EQ(length_bucket(2049, t.data(), 4), 1);
  EXPECT_EQ(length_bucket(8192, t.data(), 4), 2);
  EXPECT_EQ(length_bucket(8193, t.data(), 4), 3);
  EXPECT_EQ(length_bucket(16384, t.data(), 4), 3);
  EXPECT_EQ(length_bucket(1 << 30, t.data(), 4), 3);  // never past the last (the full plan)
  EXPECT_EQ(length_bucket(5, t.data(), 1), 0);        // one bucket
  // Equal limits (a batch narrower than the smaller plans): the first of them.
  const std::vector<int64_t> eq = {1600, 1600, 1600};
  EXPECT_EQ(length_bucket(1600, eq.data(), 3), 0);
}

}  // namespace
}  // namespace locks::cuda_test

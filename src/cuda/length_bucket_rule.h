// The length buckets' rules (locks/cuda/length_buckets.h) as pure functions, host and device,
// so that they are unit-tested without a GPU (tests/cuda/test_length_bucket_rule.cpp).
#pragma once

#include <cstdint>

#include "locks/rules.h"

namespace locks::cuda::detail {

// Pages a row of bucket i of n over rows of M pages: ceil(M / 2^(n - 1 - i)); the last is M.
LOCKS_HD constexpr int bucket_pages(int M, int n, int i) {
  const int shift = n - 1 - i;
  return static_cast<int>((int64_t(M) + (int64_t(1) << shift) - 1) >> shift);
}

// The bucket of a batch whose longest trusted row (rules::trusted_len) holds max_len tokens:
// the first i with max_len <= tokens[i] (ascending), else the last. An empty batch (0) takes
// the first.
LOCKS_HD constexpr int length_bucket(int max_len, const int64_t* tokens, int n) {
  for (int i = 0; i + 1 < n; ++i)
    if (max_len <= tokens[i]) return i;
  return n - 1;
}

}  // namespace locks::cuda::detail

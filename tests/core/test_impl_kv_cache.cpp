// PagedKvCache: block allocation, blocks-filled reporting, rejection of bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/kv_cache.h"

namespace {

locks::CacheLayout small_layout(locks::DType t = locks::DType::f32, int64_t blocks = 4) {
  locks::CacheLayout L;
  L.num_blocks = blocks;
  L.page_size = 4;
  L.num_kv_heads = 2;
  L.head_dim = 32;
  L.dtype = t;
  return L;
}

std::vector<float> ramp(int64_t n, float start) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = start + 0.25f * float(i % 97);
  return x;
}

TEST(ImplKvCache, AppendReportsFilledBlocksAndStoresRows) {
  const auto L = small_layout();
  locks::PagedKvCache cache(L);
  const int a = cache.add_sequence();
  const int b = cache.add_sequence();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  const int64_t row = L.num_kv_heads * L.head_dim;
  auto k = ramp(6 * row, 1.0f), v = ramp(6 * row, -3.0f);
  auto filled = cache.append(a, k.data(), v.data(), 6);  // one full page, two tokens over
  ASSERT_EQ(filled.size(), 1u);
  EXPECT_EQ(filled[0], cache.blocks(a)[0]);
  EXPECT_EQ(cache.seq_len(a), 6);
  EXPECT_EQ(cache.blocks(a).size(), 2u);
  EXPECT_EQ(cache.free_blocks(), 2);
  // Token 5, head 1, dim 7 lands in block_table[1], slot 1.
  const float* K = static_cast<const float*>(cache.view().k);
  EXPECT_EQ(K[L.offset(cache.blocks(a)[1], 1, 1) + 7], k[size_t(5 * row + 32 + 7)]);
  // Decode two tokens: the second fills page 1.
  EXPECT_TRUE(cache.append(a, k.data(), v.data(), 1).empty());
  filled = cache.append(a, k.data(), v.data(), 1);
  ASSERT_EQ(filled.size(), 1u);
  EXPECT_EQ(filled[0], cache.blocks(a)[1]);
  // Sequence b gets different blocks.
  cache.append(b, k.data(), v.data(), 2);
  EXPECT_NE(cache.blocks(b)[0], cache.blocks(a)[0]);
  EXPECT_NE(cache.blocks(b)[0], cache.blocks(a)[1]);

  const auto batch = cache.batch();
  EXPECT_EQ(batch.view.batch_size, 2);
  EXPECT_EQ(batch.view.max_blocks_per_seq, 2);
  EXPECT_EQ(batch.seq_lens[0], 8);
  EXPECT_EQ(batch.seq_lens[1], 2);
  EXPECT_NO_THROW(locks::validate_batch(L, batch.view));
}

TEST(ImplKvCache, OutOfBlocksAndNonFiniteLeaveCacheUnchanged) {
  const auto L = small_layout(locks::DType::bf16, 2);
  locks::PagedKvCache cache(L);
  const int s = cache.add_sequence();
  const int64_t row = L.num_kv_heads * L.head_dim;
  auto k = ramp(9 * row, 0.5f), v = ramp(9 * row, 0.5f);
  EXPECT_THROW(cache.append(s, k.data(), v.data(), 9), locks::Error);  // needs 3 blocks of 2
  EXPECT_EQ(cache.seq_len(s), 0);
  EXPECT_EQ(cache.free_blocks(), 2);
  k[size_t(row + 3)] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(cache.append(s, k.data(), v.data(), 2), locks::Error);
  v[size_t(3)] = std::numeric_limits<float>::infinity();
  k[size_t(row + 3)] = 1.0f;
  EXPECT_THROW(cache.append(s, k.data(), v.data(), 2), locks::Error);
  EXPECT_EQ(cache.seq_len(s), 0);
  EXPECT_THROW(cache.append(7, k.data(), v.data(), 1), locks::Error);
}

TEST(ImplKvCache, ValidateRejectsBadLayoutsAndBatches) {
  auto L = small_layout();
  L.head_dim = 48;
  EXPECT_THROW(locks::validate_layout(L), locks::Error);
  L = small_layout();
  L.page_size = 1;
  EXPECT_THROW(locks::validate_layout(L), locks::Error);
  L = small_layout();
  std::vector<int32_t> table = {0, 1, 2, 9};
  std::vector<int32_t> lens = {8, 0};
  locks::BatchView bv{table.data(), 2, lens.data(), 2, 2};
  EXPECT_THROW(locks::validate_batch(L, bv), locks::Error);  // empty sequence
  lens = {8, 5};
  EXPECT_THROW(locks::validate_batch(L, bv), locks::Error);  // block 9 of 4
  lens = {8, 4};
  EXPECT_NO_THROW(locks::validate_batch(L, bv));  // block 9 is not used
  lens = {9, 4};
  EXPECT_THROW(locks::validate_batch(L, bv), locks::Error);  // longer than 2 pages
}

}  // namespace

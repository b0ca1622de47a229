// The paged cache as the other tests rely on it: every token appended (in interleaved
// chunks across sequences) is found through the block table at (block, slot, head), rounded
// to the cache dtype exactly as dtype.h's converters round; blocks that fill are reported;
// summary storage sizes follow the layout documented in summary.h.
//
// Merged from the former test_impl_kv_cache.cpp:
// PagedKvCache: block allocation, blocks-filled reporting, rejection of bad input.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "locks/error.h"
#include "locks/kv_cache.h"
#include "locks/summary.h"
#include "test_util.h"

namespace locks::test {
namespace {

float round_to(DType t, float x) {
  switch (t) {
    case DType::f32:
      return x;
    case DType::f16:
      return half_to_float(float_to_half(x));
    default:
      return bf16_to_float(float_to_bf16(x));
  }
}

TEST(CacheLayout, TokensAreWhereTheBlockTableSays) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    CacheSpec sp;
    sp.dtype = dt;
    sp.page_size = 8;
    sp.seq_lens = {8 * 5 + 3, 8, 1, 8 * 3};
    TestCache t = make_cache(sp);
    const auto& L = t.layout();
    const int H = sp.num_kv_heads, d = sp.head_dim, P = sp.page_size;
    std::set<int32_t> used;
    for (int b = 0; b < t.bv().batch_size; ++b) {
      const int32_t len = t.bv().seq_lens[b];
      ASSERT_EQ(len, sp.seq_lens[size_t(b)]);
      for (int j = 0; j < pages_of(len, P); ++j)
        EXPECT_TRUE(used.insert(t.block_of(b, j)).second) << "block shared by two pages";
      for (int32_t tok = 0; tok < len; ++tok)
        for (int h = 0; h < H; ++h)
          for (int c = 0; c < d; c += 7) {
            const int64_t off = L.offset(t.block_of(b, tok / P), tok % P, h);
            const size_t src = (size_t(tok) * H + h) * d + c;
            ASSERT_EQ(load_as_float(t.view().k, dt, off + c), round_to(dt, t.keys[size_t(b)][src]));
            ASSERT_EQ(load_as_float(t.view().v, dt, off + c),
                      round_to(dt, t.values[size_t(b)][src]));
          }
    }
    EXPECT_EQ(t.cache->free_blocks(), sp.spare_blocks);
  }
}

TEST(CacheLayout, AppendReportsEveryBlockThatFills) {
  CacheLayout l{8, 4, 1, 32, DType::f32};
  PagedKvCache cache(l);
  cache.add_sequence();
  Rng rng(3);
  const std::vector<float> x = rng.normals(32 * 32);
  std::vector<int32_t> filled;
  int64_t done = 0;
  for (int n : {3, 1, 6, 2, 9, 1}) {  // 22 tokens: pages 0..4 fill
    const auto f = cache.append(0, x.data() + done * 32, x.data() + done * 32, n);
    done += n;
    filled.insert(filled.end(), f.begin(), f.end());
    EXPECT_EQ(int64_t(filled.size()), done / 4) << "after " << done << " tokens";
  }
  const auto& blocks = cache.blocks(0);
  ASSERT_EQ(blocks.size(), 6u);
  EXPECT_EQ(filled, std::vector<int32_t>(blocks.begin(), blocks.begin() + 5));
}

TEST(CacheLayout, SummaryBytesFollowTheStorageLayout) {
  for (int d : {64, 128})
    for (int P : {8, 16, 32}) {
      const int r = P / 2;
      SummaryLayout s{4, P, 2, d, r, Precision::fp32, d};
      // fp32: mu[d] + basis[r d] + coeff[P r] floats.
      EXPECT_EQ(summary_bytes_per_page(s), size_t(4) * (d + r * d + P * r));
      s.precision = Precision::quant;
      for (int g : {d, 32, 16}) {
        s.basis_group = g;
        // quant: int8 mu[d] + scale, int4 basis[r d / 2 bytes] + r d / g scales, int8
        // coeff[P r] + r scales.
        const size_t q =
            size_t(d) + 4 + size_t(r) * d / 2 + 4 * size_t(r) * (d / g) + size_t(P) * r + 4 * r;
        EXPECT_EQ(summary_bytes_per_page(s), q);
        EXPECT_DOUBLE_EQ(summary_share_of_bf16_kv(s), double(q) / (2.0 * P * d * 2));
      }
    }
  // LOCKS.md's example: d = 128, r = 8, P = 16 is 768 bytes of codes plus 68 of scales with
  // one basis scale a row; the library's default at d 128 (32-dim groups) adds 96.
  EXPECT_EQ(summary_bytes_per_page({1, 16, 1, 128, 8, Precision::quant, 128}), 836u);
  EXPECT_EQ(summary_bytes_per_page({1, 16, 1, 128, 8, Precision::quant, 32}), 932u);
}

}  // namespace
}  // namespace locks::test

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
  L.head_dim = 47;
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

// The paged cache as the other tests rely on it: every token appended (in interleaved
// chunks across sequences) is found through the block table at (block, slot, head), rounded
// to the cache dtype exactly as dtype.h's converters round; blocks that fill are reported;
// summary storage sizes follow the layout documented in summary.h.
#include <gtest/gtest.h>

#include <set>

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
      SummaryLayout s{4, P, 2, d, r, Precision::fp32};
      // fp32: mu[d] + basis[r d] + coeff[P r] floats.
      EXPECT_EQ(summary_bytes_per_page(s), size_t(4) * (d + r * d + P * r));
      s.precision = Precision::quant;
      // quant: int8 mu[d] + scale, int4 basis[r d / 2 bytes] + r scales, int8 coeff[P r] + r
      // scales.
      const size_t q = size_t(d) + 4 + size_t(r) * d / 2 + 4 * r + size_t(P) * r + 4 * r;
      EXPECT_EQ(summary_bytes_per_page(s), q);
      EXPECT_DOUBLE_EQ(summary_share_of_bf16_kv(s), double(q) / (2.0 * P * d * 2));
    }
  // LOCKS.md's example: d = 128, r = 8, P = 16 is 768 bytes of codes plus 68 of scales.
  EXPECT_EQ(summary_bytes_per_page({1, 16, 1, 128, 8, Precision::quant}), 836u);
}

}  // namespace
}  // namespace locks::test

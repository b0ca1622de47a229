// ref::filled_blocks / slot_blocks (src/ref/filled_ref.cpp) on hand-made batches whose
// answers are written out, and the filled builds equal summary_build_page on those blocks.
#include <gtest/gtest.h>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(RefFilled, BlocksOfTheLengthRule) {
  const CacheLayout L{20, 4, 1, 32, DType::f32};
  // Rows: physical blocks of each sequence (stride 5).
  const int32_t table[] = {3, 7, 9, 11, 13, 2, 4, 6, 8, 10, 15, 16, 17, 18, 19};
  const int32_t lens[] = {8, 9, 4};  // page 1 just filled; page 2 partial; page 0 just filled
  const BatchView b{table, 5, lens, 3, 5};
  EXPECT_EQ(ref::filled_blocks(L, b, 1), (std::vector<int32_t>{7, 15}));
  // appended 2: seq 1 (9 tokens) had 7 before: page 1 ([4, 8)) completed too.
  EXPECT_EQ(ref::filled_blocks(L, b, 2), (std::vector<int32_t>{7, 4, 15}));
  EXPECT_EQ(ref::filled_blocks(L, b, 4), (std::vector<int32_t>{7, 4, 15}));
  EXPECT_THROW(ref::filled_blocks(L, b, 0), Error);
  EXPECT_THROW(ref::filled_blocks(L, b, 5), Error);
}

TEST(RefFilled, BlocksOfTheSlotRule) {
  const CacheLayout L{6, 4, 1, 32, DType::f32};
  const int32_t slots[] = {-1, 3, 4, 7, 23, -1, 22, 11};
  EXPECT_EQ(ref::slot_blocks(L, slots, 8), (std::vector<int32_t>{0, 1, 5, 2}));
  const int32_t bad[] = {24};  // block 6 of 6
  EXPECT_THROW(ref::slot_blocks(L, bad, 1), Error);
  const int32_t neg[] = {-2};
  EXPECT_THROW(ref::slot_blocks(L, neg, 1), Error);
}

TEST(RefFilled, BuildsAreThePageBuildsOfThoseBlocks) {
  CacheSpec sp;
  sp.seq_lens = {32, 17};
  sp.page_size = 16;
  sp.head_dim = 32;
  const TestCache t = make_cache(sp);
  const auto built = ref::summary_build_filled(t.view(), t.bv(), 1, 4);
  // Sequence 0 (32 tokens) just filled its page 1; sequence 1 (17 tokens) filled nothing.
  ASSERT_EQ(built.size(), size_t(sp.num_kv_heads));
  for (int h = 0; h < sp.num_kv_heads; ++h) {
    EXPECT_EQ(built[size_t(h)].block, t.block_of(0, 1));
    EXPECT_EQ(built[size_t(h)].head, h);
    const ref::PageSummary64 want = ref::summary_build_page(t.view(), t.block_of(0, 1), h, 4);
    EXPECT_EQ(built[size_t(h)].summary.mu, want.mu);
    EXPECT_EQ(built[size_t(h)].summary.sigma, want.sigma);
  }
}

}  // namespace
}  // namespace locks::test

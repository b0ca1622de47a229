// cpu::select_pages on hand-made scores: tail, sink, recent, top-k, ties, full budget.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/score.h"
#include "locks/select.h"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Run {
  std::vector<int32_t> pages, counts;
  std::vector<int> got(int row) const {
    return {pages.begin() + row * cap, pages.begin() + row * cap + counts[size_t(row)]};
  }
  int cap = 0;
};

Run select(const std::vector<float>& scores, std::vector<int32_t> lens, int heads, int M, int P,
           locks::SelectConfig cfg) {
  Run r;
  r.cap = locks::select_capacity(cfg, P, M);
  r.pages.assign(lens.size() * heads * r.cap, 7);
  r.counts.assign(lens.size() * heads, 0);
  locks::BatchView bv;
  bv.seq_lens = lens.data();
  bv.batch_size = static_cast<int>(lens.size());
  bv.max_blocks_per_seq = M;
  locks::cpu::select_pages(scores.data(), bv, heads, P, cfg,
                           {r.pages.data(), r.counts.data(), r.cap});
  return r;
}

TEST(ImplSelect, TailSinkRecentThenTopScoresWithTies) {
  const int P = 4, M = 10;
  // 9 full pages + a tail of 2 tokens = 38 tokens; budget 5 pages.
  std::vector<float> s = {9, 1, 5, 3, 5, 2, 8, 0, 4, kNegInf};
  locks::SelectConfig cfg{20, 1, 1};
  auto r = select(s, {38}, 1, M, P, cfg);
  // tail 9, sink 0, recent 8, then the two best of {1..7}: 6 (8), then 2 and 4 tie at 5 -> 2.
  EXPECT_EQ(r.got(0), (std::vector<int>{0, 2, 6, 8, 9}));
  EXPECT_EQ(r.cap, 5);
  // No sink/recent: top 4 of the full pages + tail.
  r = select(s, {38}, 1, M, P, {20, 0, 0});
  EXPECT_EQ(r.got(0), (std::vector<int>{0, 2, 4, 6, 9}));
}

TEST(ImplSelect, FullBudgetSelectsEveryPageAndPads) {
  const int P = 4, M = 4;
  std::vector<float> s = {1, 2, 3, kNegInf, /*seq 1*/ 0, kNegInf, kNegInf, kNegInf};
  auto r = select(s, {14, 5}, 1, M, P, {14, 0, 0});  // b = 14 covers seq 0 (14 tokens)
  EXPECT_EQ(r.cap, 4);                               // ceil(14 / 4)
  EXPECT_EQ(r.got(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.got(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(r.pages[size_t(r.cap + 2)], -1);
  EXPECT_EQ(r.pages[size_t(r.cap + 3)], -1);
}

TEST(ImplSelect, PerKvHeadAndNoTailWhenPagesAreFull) {
  const int P = 2, M = 4;
  std::vector<float> s = {0, 5, 1, 2, /*head 1*/ 3, 0, 0, 9};
  auto r = select(s, {8}, 2, M, P, {4, 0, 0});  // 2 pages, no tail: the two best
  EXPECT_EQ(r.got(0), (std::vector<int>{1, 3}));
  EXPECT_EQ(r.got(1), (std::vector<int>{0, 3}));
}

TEST(ImplSelect, RejectsTooSmallBudgetAndNaN) {
  EXPECT_THROW(locks::validate_select({15, 0, 0}, 16), locks::Error);
  EXPECT_THROW(locks::validate_select({32, 1, 1}, 16), locks::Error);
  EXPECT_NO_THROW(locks::validate_select({48, 1, 1}, 16));
  EXPECT_THROW(locks::validate_select({48, -1, 0}, 16), locks::Error);
  std::vector<float> s = {1, std::nanf(""), 0};
  EXPECT_THROW(select(s, {12}, 1, 3, 4, {4, 0, 0}), locks::Error);
}

TEST(ImplAggregate, ShareAveragingByHand) {
  // One KV head, two query heads, three pages (last is the tail: -inf).
  const float l2 = std::log(2.0f);
  std::vector<float> hs = {0.0f, l2, kNegInf, /*head 1*/ 5.0f, 5.0f, kNegInf};
  std::vector<float> out(3);
  std::vector<int32_t> lens = {10};
  locks::BatchView bv;
  bv.seq_lens = lens.data();
  bv.batch_size = 1;
  bv.max_blocks_per_seq = 3;
  locks::cpu::aggregate_gqa(hs.data(), bv, 2, 1, out.data());
  // Shares: head 0 (1/3, 2/3), head 1 (1/2, 1/2) -> means 5/12, 7/12.
  EXPECT_NEAR(out[0], std::log(5.0f / 12.0f), 1e-6);
  EXPECT_NEAR(out[1], std::log(7.0f / 12.0f), 1e-6);
  EXPECT_EQ(out[2], kNegInf);
  hs[1] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(locks::cpu::aggregate_gqa(hs.data(), bv, 2, 1, out.data()), locks::Error);
}

}  // namespace

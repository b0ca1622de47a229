// Checks of the float64 reference itself on cases small enough to know the answer (the
// yardstick the backends are compared with must not itself be wrong).
// The reference selection (src/ref/select_ref.cpp) against hand-made scores.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(RefSelfCheck, SelectFollowsTheRulesOnHandMadeScores) {
  // P = 4, length 23: pages 0..4 full, page 5 is the partial tail. Budget 12 -> k = 3.
  const int32_t len = 23;
  std::vector<int32_t> table(6);
  std::iota(table.begin(), table.end(), 0);
  BatchView bv{table.data(), 6, &len, 1, 6};
  const std::vector<double> s{0.0, 5.0, 2.0, 5.0, 1.0, kNegInf};
  SelectionBuf out(1, 1, 6);
  ref::select_pages(s.data(), bv, 1, 4, {12, 1, 0}, out.sel);
  // tail 5, sink 0, then the best other page: 1 and 3 tie at 5.0, the lower index wins.
  EXPECT_EQ(out.of(0, 0, 1), (std::vector<int32_t>{0, 1, 5}));
  EXPECT_EQ(out.pages[3], -1);
  ref::select_pages(s.data(), bv, 1, 4, {12, 0, 1}, out.sel);  // recent = page 4
  EXPECT_EQ(out.of(0, 0, 1), (std::vector<int32_t>{1, 4, 5}));
  ref::select_pages(s.data(), bv, 1, 4, {23, 0, 0}, out.sel);  // b >= length: everything
  EXPECT_EQ(out.of(0, 0, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_THROW(ref::select_pages(s.data(), bv, 1, 4, {8, 1, 1}, out.sel), Error);
}

TEST(RefSelfCheck, AdaptiveBudgetKeepsTheFewestPagesCoveringTau) {
  // P = 4, length 27: pages 0..5 full, page 6 the tail. Masses (exp of the scores) 0.05,
  // 0.4, 0.1, 0.3, 0.1, 0.05 of a total 1. Budget 24 -> k = 6 slots: tail + 5 by score.
  const int32_t len = 27;
  std::vector<int32_t> table(7);
  std::iota(table.begin(), table.end(), 0);
  BatchView bv{table.data(), 7, &len, 1, 7};
  const std::vector<double> m{0.05, 0.4, 0.1, 0.3, 0.1, 0.05};
  std::vector<double> s;
  for (double x : m) s.push_back(std::log(x));
  s.push_back(kNegInf);  // the tail has no score
  SelectionBuf out(1, 1, 7);
  auto pages = [&](int sink, int recent, float tau, int floor_pages) {
    SelectConfig sc{24, sink, recent, tau, floor_pages};
    ref::select_pages(s.data(), bv, 1, 4, sc, out.sel);
    return out.of(0, 0, 1);
  };
  using V = std::vector<int32_t>;
  EXPECT_EQ(pages(0, 0, 0.0f, 1), (V{0, 1, 2, 3, 4, 6}));  // fixed: 5 best, 2 and 4 tie
  EXPECT_EQ(pages(0, 0, 0.39f, 1), (V{1, 6}));             // 0.4 covers 0.39
  EXPECT_EQ(pages(0, 0, 0.41f, 1), (V{1, 3, 6}));          // 0.7
  EXPECT_EQ(pages(0, 0, 0.75f, 1), (V{1, 2, 3, 6}));       // 0.8: of the tie, the lower index
  EXPECT_EQ(pages(0, 0, 0.85f, 1), (V{1, 2, 3, 4, 6}));    // 0.9
  EXPECT_EQ(pages(0, 0, 1.0f, 1), (V{0, 1, 2, 3, 4, 6}));  // 0.95 < 1: the ceiling
  EXPECT_EQ(pages(0, 0, 0.1f, 3), (V{1, 2, 3, 6}));        // the floor: 3 scored pages
  // Sink page 0 and recent page 5 count toward the mass (0.1): 0.4 needs 0.3 more.
  EXPECT_EQ(pages(1, 1, 0.4f, 0), (V{0, 1, 5, 6}));
  EXPECT_EQ(pages(1, 1, 0.09f, 0), (V{0, 5, 6}));  // floor 0: the fixed pages suffice
  EXPECT_EQ(pages(1, 1, 0.09f, 1), (V{0, 1, 5, 6}));
  // Every score -inf: no finite total, the fixed budget.
  std::fill(s.begin(), s.end(), kNegInf);
  EXPECT_EQ(pages(0, 0, 0.5f, 1), (V{0, 1, 2, 3, 4, 6}));
  // Out-of-range tau / floor.
  EXPECT_THROW(pages(0, 0, -0.1f, 1), Error);
  EXPECT_THROW(pages(0, 0, 1.5f, 1), Error);
  EXPECT_THROW(pages(0, 0, std::nanf(""), 1), Error);
  EXPECT_THROW(pages(0, 0, 0.5f, -1), Error);
}

}  // namespace
}  // namespace locks::test

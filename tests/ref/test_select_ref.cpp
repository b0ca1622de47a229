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

}  // namespace
}  // namespace locks::test

// The vectorizable exp of the softmax loops against std::exp (float64) on x <= 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../../src/core/internal/fast_exp.h"

TEST(ImplFastExp, RelativeErrorBelow3e7OnTheNonPositiveRange) {
  double worst = 0.0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f * float(i) / 2000000.0f;
    const double ref = std::exp(double(x));
    const double got = locks::detail::exp_nonpos(x);
    worst = std::max(worst, std::fabs(got - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(locks::detail::exp_nonpos(0.0f), 1.0f);
  EXPECT_EQ(locks::detail::exp_nonpos(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(locks::detail::exp_nonpos(-100.0f), 0.0f);
  EXPECT_GT(locks::detail::exp_nonpos(-87.0f), 0.0f);
}

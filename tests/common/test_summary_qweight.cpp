// src/common/summary_qweight.cpp: the query-weight check every backend's host entry shares,
// and the calibration of weights from observed queries.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/summary.h"

namespace locks {
namespace {

TEST(QWeight, ValidateAcceptsPositiveAndNull) {
  const std::vector<float> w{0.5f, 1.0f, 2.0f, 1e-3f};
  EXPECT_NO_THROW(validate_qweight(w.data(), 2, 2));
  EXPECT_NO_THROW(validate_qweight(nullptr, 2, 2));
}

TEST(QWeight, ValidateRejectsZeroNegativeAndNonFinite) {
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    std::vector<float> w{1.0f, 1.0f, 1.0f, 1.0f};
    w[3] = bad;
    try {
      validate_qweight(w.data(), 2, 2);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("KV head 1, channel 1"), std::string::npos) << e.what();
    }
  }
}

TEST(QWeight, FromQueriesIsTheRmsOverTheGroupWithAFloor) {
  // 2 observed steps, 4 query heads on 2 KV heads (G 2), d 3.
  const int n = 2, Hq = 4, Hkv = 2, d = 3;
  std::vector<float> q(size_t(n) * Hq * d, 0.0f);
  auto at = [&](int s, int hq, int c) -> float& { return q[(size_t(s) * Hq + hq) * d + c]; };
  at(0, 0, 0) = 2.0f, at(1, 1, 0) = 2.0f;  // KV head 0: channel 0 only, mean power 2
  at(0, 2, 1) = 1.0f;                      // KV head 1: channel 1, mean power 0.25
  std::vector<float> w(size_t(Hkv) * d);
  qweight_from_queries(q.data(), n, Hq, Hkv, d, w.data(), 1e-2);
  EXPECT_NEAR(w[0], std::sqrt(2.0), 1e-6);
  // unused channels: the floor, 1% of the mean power over channels (2 / 3)
  EXPECT_NEAR(w[1], std::sqrt(1e-2 * 2.0 / 3), 1e-6);
  EXPECT_NEAR(w[2], std::sqrt(1e-2 * 2.0 / 3), 1e-6);
  EXPECT_NEAR(w[d + 1], 0.5, 1e-6);
  EXPECT_NEAR(w[d + 0], std::sqrt(1e-2 * 0.25 / 3), 1e-6);
  EXPECT_NO_THROW(validate_qweight(w.data(), Hkv, d));
}

TEST(QWeight, FromQueriesRejectsBadInput) {
  std::vector<float> q(12, 1.0f), w(6);
  EXPECT_THROW(qweight_from_queries(q.data(), 0, 4, 2, 3, w.data()), InvalidArgument);
  EXPECT_THROW(qweight_from_queries(q.data(), 1, 3, 2, 3, w.data()), InvalidArgument);
  EXPECT_THROW(qweight_from_queries(q.data(), 1, 4, 2, 3, w.data(), 0.0), InvalidArgument);
  q[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(qweight_from_queries(q.data(), 1, 4, 2, 3, w.data()), InvalidArgument);
  // all-zero queries: no channel preferred
  std::vector<float> z(12, 0.0f);
  qweight_from_queries(z.data(), 1, 4, 2, 3, w.data());
  for (float x : w) EXPECT_EQ(x, 1.0f);
}

}  // namespace
}  // namespace locks

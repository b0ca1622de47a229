// The float64 reference of the level-1 estimate against hand-made codes: checks the decode of
// every stored field and the formula of super_summary.h, independently of any build.
#include <gtest/gtest.h>

#include <cmath>

#include "locks/error.h"
#include "locks/super_summary.h"

namespace locks::test {
namespace {

TEST(SuperRef, EstimateFromHandMadeCodes) {
  SuperLayout l;
  l.num_slots = 1;
  l.group_pages = 2;
  l.page_size = 16;
  l.num_kv_heads = 1;
  l.head_dim = 4;
  l.rank = 1;
  l.extent = true;
  SuperStore st(l);
  SuperView v = st.view();
  v.mu_q[0] = 1;  // M = (0.5, 0, 0, 0)
  v.mu_scale[0] = 0.5f;
  v.basis_q[0] = 0x70;  // dim 0 code 0 (low nibble), dim 1 code 7 (high nibble)
  v.basis_q[1] = 0x00;
  v.basis_scale[0] = 1.0f / 7.0f;  // W = (0, 1, 0, 0)
  v.coord_q[0] = 10;               // a_0 = 1.0
  v.coord_q[1] = -20;              // a_1 = -2.0
  v.coord_scale[0] = 0.1f;
  v.radius_q[0] = 2;  // r_0 = 1.0
  v.radius_q[1] = 0;
  v.radius_scale[0] = 0.5f;
  v.lo_q[0] = -5;  // page 0: coefficients in [-0.5, 3.0]
  v.hi_q[0] = 30;
  v.lo_q[1] = -30;
  v.hi_q[1] = -10;
  v.extent_scale[0] = 0.1f;
  const float q[4] = {2, 3, 0, 4};  // q.M = 1, w = 3, |q_perp| = sqrt(29 - 9) = sqrt(20)
  const float scale = 0.5f;
  TwoLevelConfig c;
  c.use_extent = false;
  const double logP = std::log(16.0);
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 0, q, scale, c), logP + 0.5 * (1 + 3), 1e-6);
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 1, q, scale, c), logP + 0.5 * (1 - 6), 1e-6);
  c.gamma = 1.0;
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 0, q, scale, c),
              logP + 0.5 * (1 + 3 + std::sqrt(20.0)), 1e-6);
  c.gamma = 0;
  c.use_extent = true;  // w > 0: the upper end of the range counts
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 0, q, scale, c), logP + 0.5 * (1 + 3 * 3.0), 1e-6);
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 1, q, scale, c), logP + 0.5 * (1 - 3 * 1.0), 1e-6);
  const float qn[4] = {2, -3, 0, 4};  // w < 0: the lower end counts
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 1, qn, scale, c), logP + 0.5 * (1 + 3 * 3.0), 1e-6);
  c.mix = true;  // centroid term 16 e^{0.5 (1 + 3)} plus extent term e^{0.5 (1 + 9)}
  EXPECT_NEAR(ref::super_page_estimate(v, 0, 0, 0, q, scale, c),
              std::log(16 * std::exp(2.0) + std::exp(5.0)), 1e-6);
  c.mix = false;
  EXPECT_THROW(ref::super_page_estimate(v, 1, 0, 0, q, scale, c), InvalidArgument);
  EXPECT_THROW(ref::super_page_estimate(v, 0, 0, 2, q, scale, c), InvalidArgument);
}

TEST(SuperRef, GroupScoreIsLseOrMaxOfPageEstimates) {
  SuperLayout l;
  l.num_slots = 1;
  l.group_pages = 2;
  l.page_size = 16;
  l.head_dim = 2;
  l.rank = 1;
  l.extent = false;
  SuperStore st(l);
  SuperView v = st.view();
  v.basis_q[0] = 0x07;  // W = (1, 0)
  v.basis_scale[0] = 1.0f / 7.0f;
  v.coord_q[0] = 10;
  v.coord_q[1] = 20;
  v.coord_scale[0] = 0.1f;  // a = (1, 2)
  const float q[2] = {1, 0};
  const int32_t table[1] = {0}, lens[1] = {3 * 16}, blocks[4] = {0, 1, 2, 3};
  BatchView batch{blocks, 4, lens, 1, 4};
  const SuperTableView tv{table, 2, 2};
  double out[2];
  TwoLevelConfig c;
  c.use_extent = false;
  ref::super_score(v, tv, batch, {q, 1}, 1.0f, c, out);
  const double logP = std::log(16.0);
  EXPECT_NEAR(out[0], logP + std::log(std::exp(1.0) + std::exp(2.0)), 1e-6);
  EXPECT_EQ(out[1], -std::numeric_limits<double>::infinity());  // open group: no summary
  c.agg = GroupAgg::max;
  ref::super_score(v, tv, batch, {q, 1}, 1.0f, c, out);
  EXPECT_NEAR(out[0], logP + 2.0, 1e-6);
}

}  // namespace
}  // namespace locks::test

// Checks of the float64 reference itself on cases small enough to know the answer (the
// yardstick the backends are compared with must not itself be wrong).
// The reference scoring and GQA aggregation (src/ref/score_ref.cpp) against closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(RefSelfCheck, AggregateIsTheMeanOfNormalisedShares) {
  const int32_t len = 8;  // P = 4 would give 2 pages; use 3 slots with the last -inf
  std::vector<int32_t> table{0, 1, 2};
  BatchView bv{table.data(), 3, &len, 1, 3};
  // Head 0 masses (1, 3) -> shares (1/4, 3/4); head 1 masses (1, 1) -> (1/2, 1/2).
  const std::vector<double> hs{0.0, std::log(3.0), kNegInf, 7.0, 7.0, kNegInf};
  std::vector<double> gs(3);
  ref::aggregate_gqa(hs.data(), bv, 2, 1, gs.data());
  EXPECT_NEAR(gs[0], std::log((0.25 + 0.5) / 2), 1e-14);
  EXPECT_NEAR(gs[1], std::log((0.75 + 0.5) / 2), 1e-14);
  EXPECT_EQ(gs[2], kNegInf);
}

TEST(RefSelfCheck, ScoreFromAFullRankSummaryIsTheExactLogMass) {
  CacheSpec sp;
  sp.seq_lens = {48};
  sp.num_kv_heads = 1;
  sp.num_q_heads = 1;
  TestCache t = make_cache(sp);
  const int P = 16, d = 64, r = P - 1;
  SummaryLayout sl{t.layout().num_blocks, P, 1, d, r, Precision::fp32};
  std::vector<float> mu(size_t(sl.num_blocks) * d), basis(size_t(sl.num_blocks) * r * d),
      coeff(size_t(sl.num_blocks) * P * r);
  SummaryView sv{sl, mu.data(), basis.data(), coeff.data()};
  for (int j = 0; j < 3; ++j) {
    const int32_t blk = t.block_of(0, j);
    const ref::PageSummary64 s = ref::summary_build_page(t.view(), blk, 0, r);
    std::copy(s.mu.begin(), s.mu.end(), mu.begin() + blk * d);
    std::copy(s.basis.begin(), s.basis.end(), basis.begin() + blk * r * d);
    std::copy(s.coeff.begin(), s.coeff.end(), coeff.begin() + blk * P * r);
    // Summaries are stored in float: the logits carry ~1e-7 relative rounding.
    EXPECT_NEAR(ref::score_page(sv, blk, 0, t.q.data(), t.scale()),
                ref::exact_log_mass(t.view(), blk, 0, P, t.q.data(), t.scale()), 1e-5);
  }
}

}  // namespace
}  // namespace locks::test

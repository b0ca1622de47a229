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

// A full-rank (r = P - 1) fp32 summary reproduces every logit, so its score is the exact log
// page mass: plain, and query-weighted (summary.h: an exact reformulation at full rank).
void expect_full_rank_scores_exact(const float* qweight) {
  CacheSpec sp;
  sp.seq_lens = {48};
  sp.num_kv_heads = 1;
  sp.num_q_heads = 1;
  TestCache t = make_cache(sp);
  const int P = 16, d = 64, r = P - 1;
  SummaryLayout sl{t.layout().num_blocks, P, 1, d, r, Precision::fp32, d};
  std::vector<float> mu(size_t(sl.num_blocks) * d), basis(size_t(sl.num_blocks) * r * d),
      coeff(size_t(sl.num_blocks) * P * r);
  SummaryView sv{sl, mu.data(), basis.data(), coeff.data()};
  sv.qweight = qweight;
  for (int j = 0; j < 3; ++j) {
    const int32_t blk = t.block_of(0, j);
    const ref::PageSummary64 s = ref::summary_build_page(t.view(), blk, 0, r, qweight);
    std::copy(s.mu.begin(), s.mu.end(), mu.begin() + blk * d);
    std::copy(s.basis.begin(), s.basis.end(), basis.begin() + blk * r * d);
    std::copy(s.coeff.begin(), s.coeff.end(), coeff.begin() + blk * P * r);
    // Summaries are stored in float: the logits carry ~1e-7 relative rounding.
    EXPECT_NEAR(ref::score_page(sv, blk, 0, t.q.data(), t.scale()),
                ref::exact_log_mass(t.view(), blk, 0, P, t.q.data(), t.scale()), 1e-5);
  }
}

TEST(RefSelfCheck, ScoreFromAFullRankSummaryIsTheExactLogMass) {
  expect_full_rank_scores_exact(nullptr);
}

TEST(RefSelfCheck, WeightedFullRankSummaryIsTheExactLogMass) {
  std::vector<float> w(static_cast<size_t>(64), 1.0f);
  for (int c = 0; c < 64; ++c) w[size_t(c)] = std::exp(0.15f * float(c % 23) - 1.5f);
  expect_full_rank_scores_exact(w.data());
}

// At a low rank the weighted basis fits the weighted deviations best: its weighted residual
// is the optimum, at most the plain basis' weighted residual.
TEST(RefSelfCheck, WeightedBasisMinimisesTheWeightedResidual) {
  CacheSpec sp;
  sp.seq_lens = {64};
  sp.num_kv_heads = 1;
  sp.num_q_heads = 1;
  TestCache t = make_cache(sp);
  const int P = 16, d = 64, r = 4;
  std::vector<float> w(static_cast<size_t>(d), 1.0f);
  for (int c = 0; c < d; ++c) w[size_t(c)] = c < 8 ? 10.0f : 0.1f;  // queries live in 8 channels
  for (int j = 0; j < 4; ++j) {
    const int32_t blk = t.block_of(0, j);
    const ref::PageSummary64 sw = ref::summary_build_page(t.view(), blk, 0, r, w.data());
    const ref::PageSummary64 sp0 = ref::summary_build_page(t.view(), blk, 0, r);
    // weighted residual of a (basis, coeff) fit given in the weighted (sw) or plain (sp0) frame
    auto resid = [&](const ref::PageSummary64& s, bool weighted) {
      double e = 0;
      for (int i = 0; i < P; ++i)
        for (int c = 0; c < d; ++c) {
          const CacheLayout& L = t.layout();
          const double k = load_as_float(t.view().k, L.dtype, L.offset(blk, i, 0) + c);
          double rec = 0;
          for (int m = 0; m < r; ++m)
            rec += s.coeff[size_t(i) * r + m] * s.basis[size_t(m) * d + c];
          if (!weighted) rec *= w[size_t(c)];  // plain fit, measured in the weighted metric
          const double x = (k - s.mu[size_t(c)]) * w[size_t(c)] - rec;
          e += x * x;
        }
      return e;
    };
    double opt = 0;
    for (size_t k = size_t(r); k < sw.sigma.size(); ++k) opt += sw.sigma[k] * sw.sigma[k];
    EXPECT_NEAR(resid(sw, true), opt, 1e-9 * (1 + opt));
    EXPECT_LE(resid(sw, true), resid(sp0, false) * (1 + 1e-12));
  }
}

}  // namespace
}  // namespace locks::test

// Checks of the float64 reference itself on cases small enough to know the answer, so that
// the yardstick the backends are compared with is not itself wrong.
#include <gtest/gtest.h>

#include <Eigen/Dense>
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

TEST(RefSelfCheck, AttentionOverEqualLogitsIsTheMeanOfValues) {
  CacheLayout l{2, 4, 1, 32, DType::f32};
  std::vector<float> k(size_t(l.num_blocks * l.block_elems()), 0.5f), v(k.size());
  Rng rng(3);
  for (auto& x : v) x = rng.normal();
  std::vector<float> q(32, 0.0f);  // q = 0: every logit is 0
  const int32_t len = 6;
  std::vector<int32_t> table{1, 0};  // page 0 lives in block 1
  BatchView bv{table.data(), 2, &len, 1, 2};
  std::vector<double> out(32), lse(1);
  ref::decode_attention({k.data(), v.data(), l}, bv, {q.data(), 1}, 0.2f, nullptr, out.data(),
                        lse.data());
  EXPECT_NEAR(lse[0], std::log(6.0), 1e-14);
  for (int c = 0; c < 32; ++c) {
    double m = 0;
    for (int s = 0; s < 4; ++s) m += v[size_t(l.offset(1, s, 0) + c)];
    for (int s = 0; s < 2; ++s) m += v[size_t(l.offset(0, s, 0) + c)];
    EXPECT_NEAR(out[size_t(c)], m / 6, 1e-12);
  }
}

TEST(RefSelfCheck, SummaryMatchesAnIndependentSvd) {
  CacheSpec sp;
  sp.seq_lens = {32};
  sp.head_dim = 32;
  sp.num_kv_heads = 1;
  sp.num_q_heads = 1;
  TestCache t = make_cache(sp);
  const int P = 16, d = 32, r = 5;
  const auto& L = t.layout();
  for (int j = 0; j < 2; ++j) {
    const int32_t blk = t.block_of(0, j);
    const ref::PageSummary64 s = ref::summary_build_page(t.view(), blk, 0, r);
    Eigen::MatrixXd K(P, d);
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < d; ++c)
        K(i, c) = load_as_float(t.view().k, L.dtype, L.offset(blk, i, 0) + c);
    const Eigen::MatrixXd D = K.rowwise() - K.colwise().mean();
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(D, Eigen::ComputeThinV);
    // The Gram route gets sigma_k^2 to ~1e-16 sigma_0^2 absolute (so a zero singular value
    // comes out ~1e-8 sigma_0): compare the squares.
    const double s0sq = svd.singularValues()(0) * svd.singularValues()(0);
    for (int k = 0; k < P; ++k)
      EXPECT_NEAR(s.sigma[size_t(k)] * s.sigma[size_t(k)],
                  svd.singularValues()(k) * svd.singularValues()(k), 1e-12 * s0sq);
    // Same projector onto the top-r subspace; basis rows orthonormal.
    Eigen::MatrixXd Vr(r, d);
    for (int k = 0; k < r; ++k)
      for (int c = 0; c < d; ++c) Vr(k, c) = s.basis[size_t(k) * d + c];
    const Eigen::MatrixXd Vs = svd.matrixV().leftCols(r);
    EXPECT_LT((Vr.transpose().lazyProduct(Vr) - Vs.lazyProduct(Vs.transpose())).norm(), 1e-8);
    EXPECT_LT((Vr.lazyProduct(Vr.transpose()) - Eigen::MatrixXd::Identity(r, r)).norm(), 1e-10);
    // Residual = sum of the discarded squared singular values.
    double resid = 0, discarded = 0;
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < d; ++c) {
        double rec = s.mu[size_t(c)];
        for (int k = 0; k < r; ++k) rec += s.basis[size_t(k) * d + c] * s.coeff[size_t(i) * r + k];
        resid += (K(i, c) - rec) * (K(i, c) - rec);
      }
    for (int k = r; k < P; ++k) discarded += s.sigma[size_t(k)] * s.sigma[size_t(k)];
    EXPECT_NEAR(resid, discarded, 1e-9 * (1 + discarded));
  }
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

TEST(TestData, StructuredPagesAreLocallyLowRankButGloballyHighRank) {
  // The premise the structured caches model: each page's centred keys live (up to 0.05 noise)
  // in a 2-4 dimensional subspace, while the pages together span many more directions.
  CacheSpec sp;
  sp.structured = true;
  sp.num_kv_heads = 1;
  sp.num_q_heads = 1;
  sp.seq_lens = {16 * 12};
  TestCache t = make_cache(sp);
  const int P = 16, d = 64;
  Eigen::MatrixXd all(16 * 12, d);
  for (int j = 0; j < 12; ++j) {
    const ref::PageSummary64 s = ref::summary_build_page(t.view(), t.block_of(0, j), 0, 4);
    double total = 0, beyond4 = 0;
    for (int k = 0; k < P; ++k) {
      total += s.sigma[size_t(k)] * s.sigma[size_t(k)];
      if (k >= 4) beyond4 += s.sigma[size_t(k)] * s.sigma[size_t(k)];
    }
    // Noise energy 0.05^2 * P * d = 2.6 spread over 15 directions vs ~150 of signal: ~1%.
    EXPECT_LT(beyond4, 0.03 * total) << "page " << j;
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < d; ++c)
        all(j * P + i, c) = t.keys[0][size_t(j * P + i) * d + c] - s.mu[size_t(c)];
  }
  // Globally: 12 pages x 2-4 directions; the top 8 directions leave much of the energy out.
  Eigen::JacobiSVD<Eigen::MatrixXd> svd(all);
  const Eigen::VectorXd sv = svd.singularValues();
  double total = sv.squaredNorm(), top8 = sv.head(8).squaredNorm();
  EXPECT_LT(top8, 0.8 * total);
}

}  // namespace
}  // namespace locks::test

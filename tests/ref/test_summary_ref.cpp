// Checks of the float64 reference itself on cases small enough to know the answer (the
// yardstick the backends are compared with must not itself be wrong).
// The reference summary build (src/ref/summary_ref.cpp) against an independent SVD, and the
// premise of the structured test data it is used on.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <numeric>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

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

// cpu::summary_build against ref::summary_build_page, on random and structured caches, every
// dtype x head_dim x page size. Singular vectors' signs are arbitrary, so the comparisons
// are on reconstructions mu + V^T c, residuals, projectors V^T V and scores.
//
// Tolerances. Two effects separate the CPU summary from the float64 reference:
//  (1) float storage of mu, V, c: each reconstructed element is off by a few ulps of the key
//      scale; we allow delta_store = 1e-6 ||K||_F (~16 float ulps).
//  (2) the solver's subspace error. By Davis-Kahan, a perturbation E of the Gram matrix
//      tilts the top-r subspace by sin(theta) <= ||E|| / gap, gap = sigma_{r-1}^2 - sigma_r^2.
//      A float-precision solver has ||E|| ~ eps32 sigma_0^2; we allow
//      sin_bound = min(1, 100 eps32 sigma_0^2 / gap) (the CPU build works in double and is
//      far inside this; the bound still admits a float solver).
// From these: reconstruction ||R_cpu - R_ref||_F <= delta_store + 2 sin_bound ||D||_F;
// residual | ||K - R_cpu||^2 - sum_{k>=r} sigma_k^2 | <= 2 ||E_opt|| delta + delta^2 with
// delta = delta_store + sin_bound ||D||_F; projectors ||P_cpu - P_ref||_F <= sqrt(2r)
// sin_bound + 1e-5, compared only where the subspace is determined (sin_bound < 0.01).
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

#include "locks/reference.h"
#include "test_params.h"
#include "test_util.h"

namespace locks::test {
namespace {

constexpr double kEps32 = 5.96e-8;

struct PageMats {
  Eigen::MatrixXd K, R_cpu, R_ref, V_cpu, V_ref;
};

PageMats page_mats(const TestCache& t, const SummaryView& sv, int32_t blk, int h,
                   const ref::PageSummary64& s) {
  const auto& L = t.layout();
  const int P = L.page_size, d = L.head_dim, r = sv.layout.rank, H = L.num_kv_heads;
  PageMats m{Eigen::MatrixXd(P, d), Eigen::MatrixXd(P, d), Eigen::MatrixXd(P, d),
             Eigen::MatrixXd(r, d), Eigen::MatrixXd(r, d)};
  const int64_t bh = int64_t(blk) * H + h;
  for (int k = 0; k < r; ++k)
    for (int c = 0; c < d; ++c) {
      m.V_cpu(k, c) = sv.basis[(bh * r + k) * d + c];
      m.V_ref(k, c) = s.basis[size_t(k) * d + c];
    }
  for (int i = 0; i < P; ++i)
    for (int c = 0; c < d; ++c) {
      m.K(i, c) = load_as_float(t.view().k, L.dtype, L.offset(blk, i, h) + c);
      double rc = sv.mu[bh * d + c], rr = s.mu[size_t(c)];
      for (int k = 0; k < r; ++k) {
        rc += m.V_cpu(k, c) * double(sv.coeff[(bh * P + i) * r + k]);
        rr += m.V_ref(k, c) * s.coeff[size_t(i) * r + k];
      }
      m.R_cpu(i, c) = rc;
      m.R_ref(i, c) = rr;
    }
  return m;
}

class SummaryBuild : public testing::TestWithParam<Combo> {};

void check_summaries(const TestCache& t, int r) {
  SummaryStore store = build_summaries(t, r, Precision::fp32);
  const SummaryView sv = store.view();
  const int H = t.spec.num_kv_heads, Hq = t.spec.num_q_heads, G = Hq / H, d = t.spec.head_dim;
  const int P = t.spec.page_size, M = t.max_blocks();
  std::vector<float> hs(size_t(t.bv().batch_size) * Hq * M);
  cpu::score_pages(sv, t.bv(), t.qv(), t.scale(), hs.data());
  int pages = 0, projector_pages = 0;
  for (int b = 0; b < t.bv().batch_size; ++b) {
    for (int j = 0; j < t.bv().seq_lens[b] / P; ++j) {
      const int32_t blk = t.block_of(b, j);
      for (int h = 0; h < H; ++h) {
        SCOPED_TRACE(testing::Message() << "seq " << b << " page " << j << " head " << h);
        const ref::PageSummary64 s = ref::summary_build_page(t.view(), blk, h, r);
        const PageMats m = page_mats(t, sv, blk, h, s);
        const double sig0sq = s.sigma[0] * s.sigma[0];
        const double gap = s.sigma[size_t(r - 1)] * s.sigma[size_t(r - 1)] -
                           s.sigma[size_t(r)] * s.sigma[size_t(r)];
        const double sin_bound = gap > 0 ? std::min(1.0, 100 * kEps32 * sig0sq / gap) : 1.0;
        const double Kn = m.K.norm();
        const double Dn = (m.K.rowwise() - m.K.colwise().mean()).norm();
        const double d_store = 1e-6 * Kn;

        // Centroid: plain mean, no subspace ambiguity.
        for (int c = 0; c < d; ++c)
          EXPECT_NEAR(sv.mu[(int64_t(blk) * H + h) * d + c], s.mu[size_t(c)],
                      1e-6 * (1 + std::fabs(s.mu[size_t(c)])));
        // Reconstruction.
        EXPECT_LE((m.R_cpu - m.R_ref).norm(), d_store + 2 * sin_bound * Dn);
        // Residual = sum of discarded squared singular values.
        double discarded = 0;
        for (int k = r; k < P; ++k) discarded += s.sigma[size_t(k)] * s.sigma[size_t(k)];
        const double resid = (m.K - m.R_cpu).squaredNorm();
        const double delta = d_store + sin_bound * Dn;
        EXPECT_NEAR(resid, discarded, 2 * std::sqrt(discarded) * delta + delta * delta + 1e-12);
        // Projector onto the top-r subspace, where the subspace is well determined.
        if (sin_bound < 0.01) {
          ++projector_pages;
          // ||V1^T V1 - V2^T V2||_F^2 = ||V1 V1^T||^2 + ||V2 V2^T||^2 - 2 ||V1 V2^T||^2, exactly
          // (trace identities), with r x r products only: a d x d product would take Eigen's
          // multi-threaded GEMM path.
          const double a = m.V_cpu.lazyProduct(m.V_cpu.transpose()).squaredNorm();
          const double bb = m.V_ref.lazyProduct(m.V_ref.transpose()).squaredNorm();
          const double cross = m.V_cpu.lazyProduct(m.V_ref.transpose()).squaredNorm();
          EXPECT_LE(std::sqrt(std::max(0.0, a + bb - 2 * cross)),
                    std::sqrt(2.0 * r) * sin_bound + 1e-5);
        }
        // Orthonormal basis rows (the scoring formula assumes it).
        EXPECT_LE(
            (m.V_cpu.lazyProduct(m.V_cpu.transpose()) - Eigen::MatrixXd::Identity(r, r)).norm(),
            1e-5);
        // Coefficients are the projections of the centred keys onto the basis rows.
        const Eigen::MatrixXd D_cpu = m.K.rowwise() - m.K.colwise().mean();
        const Eigen::MatrixXd C_expect = D_cpu.lazyProduct(m.V_cpu.transpose());
        for (int i = 0; i < P; ++i)
          for (int k = 0; k < r; ++k)
            EXPECT_NEAR(sv.coeff[((int64_t(blk) * H + h) * P + i) * r + k], C_expect(i, k),
                        1e-5 * (1 + Dn));

        // CPU scores from the CPU summary vs the score of the reference summary:
        // logits differ by at most scale ||q|| max_i ||R_cpu,i - R_ref,i|| (LSE is 1-Lipschitz
        // in the max norm), plus float scoring arithmetic (1e-5 relative, see test_score).
        for (int hh = h * G; hh < (h + 1) * G; ++hh) {
          const float* q = t.q.data() + (size_t(b) * Hq + hh) * d;
          Eigen::VectorXd qd(d);
          for (int c = 0; c < d; ++c) qd(c) = q[c];
          const Eigen::VectorXd l_ref = m.R_ref.lazyProduct(qd) * double(t.scale());
          const double m0 = l_ref.maxCoeff();
          const double s_ref = m0 + std::log((l_ref.array() - m0).exp().sum());
          double row_err = 0;
          for (int i = 0; i < P; ++i)
            row_err = std::max(row_err, (m.R_cpu - m.R_ref).row(i).norm());
          const double tol = t.scale() * qd.norm() * row_err +
                             1e-5 * (1 + std::fabs(s_ref) + t.scale() * qd.norm() * Kn);
          EXPECT_NEAR(hs[(size_t(b) * Hq + hh) * M + j], s_ref, tol);
        }
        ++pages;
      }
    }
  }
  EXPECT_GT(pages, 0);
  testing::Test::RecordProperty("projector_pages", projector_pages);
  if (!t.spec.structured) {
    // Random keys have well separated singular values: most subspaces are determined.
    EXPECT_GE(projector_pages, pages / 2);
  }
}

TEST_P(SummaryBuild, RandomKeysMatchReference) {
  const Combo c = GetParam();
  check_summaries(make_cache(spec_for(c, false, 11)), rank_for(c.page_size));
}

TEST_P(SummaryBuild, StructuredKeysMatchReference) {
  const Combo c = GetParam();
  check_summaries(make_cache(spec_for(c, true, 12)), rank_for(c.page_size));
}

INSTANTIATE_TEST_SUITE_P(AllCombos, SummaryBuild, testing::ValuesIn(all_combos()), combo_name);

TEST(SummaryBuildRank, FullRankReconstructsKeysExactly) {
  // r = P - 1 spans the centred keys (rank <= P - 1): the residual is zero up to float storage.
  for (DType dt : {DType::f32, DType::bf16}) {
    CacheSpec sp;
    sp.dtype = dt;
    sp.page_size = 8;
    sp.seq_lens = {8 * 3 + 2, 17};
    TestCache t = make_cache(sp);
    SummaryStore store = build_summaries(t, 7, Precision::fp32);
    for (int32_t blk : t.full_blocks())
      for (int h = 0; h < 2; ++h) {
        const ref::PageSummary64 s = ref::summary_build_page(t.view(), blk, h, 7);
        const PageMats m = page_mats(t, store.view(), blk, h, s);
        EXPECT_LE((m.K - m.R_cpu).norm(), 1e-6 * m.K.norm());
        EXPECT_LE((m.K - m.R_ref).norm(), 1e-12 * m.K.norm());
      }
  }
}

TEST(SummaryBuildRank, IdenticalKeysGiveZeroDeviation) {
  // A page whose keys are all equal: mu = the key, every coefficient 0 (the basis is
  // undetermined; whatever it is, it must be finite).
  CacheLayout l{2, 8, 1, 32, DType::f32};
  PagedKvCache cache(l);
  cache.add_sequence();
  std::vector<float> k(8 * 32), v(8 * 32, 1.0f);
  for (int i = 0; i < 8; ++i)
    for (int c = 0; c < 32; ++c) k[size_t(i) * 32 + c] = 0.1f * float(c) - 1.0f;
  const auto full = cache.append(0, k.data(), v.data(), 8);
  ASSERT_EQ(full.size(), 1u);
  SummaryStore store(summary_layout_for(l, 3, Precision::fp32));
  cpu::summary_build(cache.view(), full.data(), 1, store.view());
  const SummaryView sv = store.view();
  for (int c = 0; c < 32; ++c) EXPECT_NEAR(sv.mu[full[0] * 32 + c], k[size_t(c)], 1e-6);
  for (int i = 0; i < 8 * 3; ++i) EXPECT_NEAR(sv.coeff[full[0] * 24 + i], 0.0f, 1e-6);
  for (int i = 0; i < 3 * 32; ++i) EXPECT_TRUE(std::isfinite(sv.basis[full[0] * 96 + i]));
}

}  // namespace
}  // namespace locks::test

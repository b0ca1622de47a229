// cpu::score_pages and cpu::aggregate_gqa against the float64 reference, on the same
// summaries (fp32 and quant), random and structured caches, GQA group sizes 1, 4, 8.
//
// Tolerance of a page score (same summary, float vs double arithmetic): every logit is
// scale * (q.mu + sum_k w_k c_ik) with w = V q; a float dot product of n terms is off by at
// most ~n eps32 sum|terms| (the worst-case gamma_n bound), so with
//   A = scale * (sum_c |q_c mu_c| + max_i sum_k (sum_c |V_kc q_c|) |c_ik|)
// each logit is within (d + r) eps32 A, and the log-sum-exp (1-Lipschitz in the max norm)
// adds a few eps32 (|s| + log P). We allow tol = 2 (d + r) eps32 A + 8 eps32 (|s| + P).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_params.h"
#include "test_util.h"

namespace locks::test {
namespace {

constexpr double kEps32 = 5.96e-8;

// The float-arithmetic error budget A of one page for one query (see the file comment).
double logit_magnitude(const SummaryView& sv, int32_t blk, int g, const float* q, float scale) {
  const SummaryLayout& l = sv.layout;
  const int d = l.head_dim, r = l.rank, P = l.page_size;
  std::vector<float> mu(static_cast<size_t>(d)), basis(size_t(r) * d), coeff(size_t(P) * r);
  const int64_t bh = int64_t(blk) * l.num_kv_heads + g;
  if (l.precision == Precision::fp32) {
    std::copy_n(sv.mu + bh * d, d, mu.begin());
    std::copy_n(sv.basis + bh * r * d, r * d, basis.begin());
    std::copy_n(sv.coeff + bh * P * r, P * r, coeff.begin());
  } else {
    summary_dequantize(sv.mu_q + bh * d, sv.mu_scale[bh], sv.basis_q + bh * r * (d / 2),
                       sv.basis_scale + bh * r, sv.coeff_q + bh * P * r, sv.coeff_scale + bh * r, d,
                       P, r, mu.data(), basis.data(), coeff.data());
  }
  double a_mu = 0;
  for (int c = 0; c < d; ++c) a_mu += std::fabs(double(q[c]) * mu[size_t(c)]);
  std::vector<double> w(size_t(r), 0.0);
  for (int k = 0; k < r; ++k)
    for (int c = 0; c < d; ++c) w[size_t(k)] += std::fabs(double(basis[size_t(k) * d + c]) * q[c]);
  double a_c = 0;
  for (int i = 0; i < P; ++i) {
    double s = 0;
    for (int k = 0; k < r; ++k) s += w[size_t(k)] * std::fabs(coeff[size_t(i) * r + k]);
    a_c = std::max(a_c, s);
  }
  return scale * (a_mu + a_c);
}

// Scores every page with the CPU and the reference; checks -inf exactly where the contract
// says, and the finite scores within the arithmetic tolerance.
void check_scores(const TestCache& t, const SummaryView& sv) {
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, M = t.max_blocks();
  const int G = Hq / t.spec.num_kv_heads, P = t.spec.page_size, d = t.spec.head_dim;
  std::vector<float> hs(size_t(B) * Hq * M, 12345.0f);
  std::vector<double> hr(hs.size());
  cpu::score_pages(sv, t.bv(), t.qv(), t.scale(), hs.data());
  ref::score_pages(sv, t.bv(), t.qv(), t.scale(), hr.data());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < M; ++j) {
        const size_t i = (size_t(b) * Hq + h) * M + j;
        SCOPED_TRACE(testing::Message() << "seq " << b << " head " << h << " page " << j);
        if (j >= t.bv().seq_lens[b] / P) {  // tail page, or beyond the sequence
          EXPECT_EQ(hs[i], kNegInfF);
          EXPECT_EQ(hr[i], kNegInf);
          continue;
        }
        const double A = logit_magnitude(sv, t.block_of(b, j), h / G,
                                         t.q.data() + (size_t(b) * Hq + h) * d, t.scale());
        const double tol =
            2 * (d + sv.layout.rank) * kEps32 * A + 8 * kEps32 * (std::fabs(hr[i]) + P);
        EXPECT_NEAR(hs[i], hr[i], tol);
      }
}

class ScorePages : public testing::TestWithParam<Combo> {};

TEST_P(ScorePages, Fp32SummariesMatchReference) {
  const Combo c = GetParam();
  for (bool structured : {false, true}) {
    TestCache t = make_cache(spec_for(c, structured, 21));
    SummaryStore store = build_summaries(t, rank_for(c.page_size), Precision::fp32);
    check_scores(t, store.view());
  }
}

TEST_P(ScorePages, QuantSummariesMatchReference) {
  // The reference decodes the quant summary with summary_dequantize and scores it in double;
  // the CPU may score the codes directly: same numbers, float arithmetic.
  const Combo c = GetParam();
  for (bool structured : {false, true}) {
    TestCache t = make_cache(spec_for(c, structured, 22));
    SummaryStore store = build_summaries(t, rank_for(c.page_size), Precision::quant);
    check_scores(t, store.view());
  }
}

INSTANTIATE_TEST_SUITE_P(AllCombos, ScorePages, testing::ValuesIn(all_combos()), combo_name);

// Aggregation tolerance: s - LSE in float loses ~eps32 (|s| + |LSE|) absolute; a float LSE
// over M entries adds ~M eps32; exp/log/sum of G shares add ~G eps32 in the log domain.
double aggregate_tol(const float* hs, int64_t n, int M, int G) {
  double mx = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(hs[i])) mx = std::max(mx, std::fabs(double(hs[i])));
  return 16 * kEps32 * (2 * mx + M + G + 1);
}

void check_aggregate(const std::vector<float>& hs, const BatchView& bv, int Hq, int H) {
  const int M = bv.max_blocks_per_seq, B = bv.batch_size;
  std::vector<float> gs(size_t(B) * H * M, 999.0f);
  std::vector<double> gr(gs.size()), hd(hs.begin(), hs.end());
  cpu::aggregate_gqa(hs.data(), bv, Hq, H, gs.data());
  ref::aggregate_gqa(hd.data(), bv, Hq, H, gr.data());
  const double tol = aggregate_tol(hs.data(), int64_t(hs.size()), M, Hq / H);
  for (size_t i = 0; i < gs.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "entry " << i);
    if (gr[i] == kNegInf) {
      EXPECT_EQ(gs[i], kNegInfF);
    } else {
      EXPECT_NEAR(gs[i], gr[i], tol);
    }
  }
}

TEST(AggregateGqa, RandomScoresMatchReference) {
  // Ragged -inf patterns, one head with huge logits (normalisation must keep it from
  // drowning the others), a sequence with no full page (all -inf).
  Rng rng(31);
  const std::vector<int32_t> lens{70, 16, 9, 33};
  const int P = 8, M = 10;
  std::vector<int32_t> table(lens.size() * M, 0);
  for (int G : {1, 4, 8}) {
    const int H = 2, Hq = H * G;
    BatchView bv{table.data(), M, lens.data(), int(lens.size()), M};
    std::vector<float> hs(lens.size() * Hq * M, kNegInfF);
    for (size_t b = 0; b < lens.size(); ++b)
      for (int h = 0; h < Hq; ++h)
        for (int j = 0; j < lens[b] / P; ++j)
          hs[(b * Hq + h) * M + j] = (h == 1 ? 80.0f : 0.0f) + 3.0f * rng.normal();
    SCOPED_TRACE(testing::Message() << "G = " << G);
    check_aggregate(hs, bv, Hq, H);
  }
}

TEST(AggregateGqa, GroupSizes148OnStructuredCache) {
  // Full score -> aggregate pipeline; the relevant pages of a group must get the group's
  // largest scores (they are aligned with every head of the group).
  for (int G : {1, 4, 8}) {
    CacheSpec sp;
    sp.structured = true;
    sp.num_kv_heads = 2;
    sp.num_q_heads = 2 * G;
    sp.seq_lens = {16 * 9 + 3, 16 * 7};
    sp.seed = 40 + uint64_t(G);
    TestCache t = make_cache(sp);
    SummaryStore store = build_summaries(t, 8, Precision::fp32);
    const int M = t.max_blocks(), B = t.bv().batch_size;
    std::vector<float> hs(size_t(B) * sp.num_q_heads * M);
    cpu::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hs.data());
    SCOPED_TRACE(testing::Message() << "G = " << G);
    check_aggregate(hs, t.bv(), sp.num_q_heads, 2);
    std::vector<float> gs(size_t(B) * 2 * M);
    cpu::aggregate_gqa(hs.data(), t.bv(), sp.num_q_heads, 2, gs.data());
    for (auto [s, j] : t.relevant) {
      for (int g = 0; g < 2; ++g) {
        const float* row = gs.data() + (size_t(s) * 2 + g) * M;
        int better = 0;  // pages scoring above the relevant one
        for (int jj = 0; jj < M; ++jj) better += row[jj] > row[j];
        EXPECT_LT(better, sp.relevant_per_seq) << "relevant page " << j << " of seq " << s;
      }
    }
  }
}

}  // namespace
}  // namespace locks::test

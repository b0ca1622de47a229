// Comparisons of backend results with the float64 reference, with their tolerances (shared
// by the CPU tests and reusable by other backends' tests).
//
// Score tolerance (same summary, float vs double arithmetic): every logit is
// scale * (q.mu + sum_k w_k c_ik) with w = V q; a float dot product of n terms is off by at
// most ~n eps32 sum|terms| (the worst-case gamma_n bound), so with
//   A = scale * (sum_c |q_c mu_c| + max_i sum_k (sum_c |V_kc q_c|) |c_ik|)
// each logit is within (d + r) eps32 A, and the log-sum-exp (1-Lipschitz in the max norm)
// adds a few eps32 (|s| + log P). We allow tol = 2 (d + r) eps32 A + 8 eps32 (|s| + P).
//
// Attention tolerance per (sequence, query head): a float logit q.k * scale is within
// d eps32 A of the exact one, A = scale * max_t sum_c |q_c k_tc|. The softmax weights then
// carry a relative error of ~2 d eps32 A, plus ~eps32 per accumulated token and per
// online-softmax rescale (one per page). So
//   |out - out_ref| <= max|v| * 4 eps32 (d A + n_tokens + n_pages + 1)
//   |lse - lse_ref| <= 4 eps32 (d A + n_tokens + n_pages + 1 + |lse|).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {

constexpr double kEps32 = 5.96e-8;

// Extra rounding a backend's arithmetic adds on top of float32 (the CPU adds none): the
// bounds below grow by these terms. u_score: relative error of a page logit's products
// (|error| <= u_score * A); u_query: relative rounding of the query in attention logits;
// u_weight: relative rounding of the softmax weights before the P V product; agg_abs: the
// absolute error of approximate exp/log per aggregated share. Int4 bases with several scale
// groups a row (basis_group < head_dim), whose entries a backend may round before its
// products: each entry B_kc within u_basis |B_kc| + basis_abs max_j s_kj, which moves a logit
// by at most u_basis A + basis_abs Z (Z: grouped_basis_magnitude). tests/cuda states the CUDA
// kernels' values and where they come from.
struct ArithModel {
  double u_score = 0, u_query = 0, u_weight = 0, agg_abs = 0;
  double u_basis = 0, basis_abs = 0;
};

// The float-arithmetic error budget A of one page for one query (see the file comment).
inline double logit_magnitude(const SummaryView& sv, int32_t blk, int g, const float* q,
                              float scale) {
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
                       sv.basis_scale + bh * basis_scales_per_head(l), sv.coeff_q + bh * P * r,
                       sv.coeff_scale + bh * r, d, P, r, l.basis_group, mu.data(), basis.data(),
                       coeff.data());
  }
  double a_mu = 0;
  for (int c = 0; c < d; ++c) a_mu += std::fabs(double(q[c]) * mu[size_t(c)]);
  // (V q) in the page's basis; query-weighted summaries multiply the basis by q / w.
  const float* qw = sv.qweight ? sv.qweight + int64_t(g) * d : nullptr;
  std::vector<double> w(size_t(r), 0.0);
  for (int k = 0; k < r; ++k)
    for (int c = 0; c < d; ++c)
      w[size_t(k)] += std::fabs(double(basis[size_t(k) * d + c]) * q[c] / (qw ? qw[c] : 1.0f));
  double a_c = 0;
  for (int i = 0; i < P; ++i) {
    double s = 0;
    for (int k = 0; k < r; ++k) s += w[size_t(k)] * std::fabs(coeff[size_t(i) * r + k]);
    a_c = std::max(a_c, s);
  }
  return scale * (a_mu + a_c);
}

// Z = scale * max_i sum_k |c_ik| max_j s_kj ||q / w||_1 for an int4 summary with several basis
// scale groups a row (0 otherwise): the logit shift of an absolute error max_j s_kj on every
// basis entry (ArithModel::basis_abs).
inline double grouped_basis_magnitude(const SummaryView& sv, int32_t blk, int g, const float* q,
                                      float scale) {
  const SummaryLayout& l = sv.layout;
  if (l.precision != Precision::quant || l.basis_group == l.head_dim) return 0;
  const int d = l.head_dim, r = l.rank, P = l.page_size, ng = d / l.basis_group;
  const int64_t bh = int64_t(blk) * l.num_kv_heads + g;
  const float* qw = sv.qweight ? sv.qweight + int64_t(g) * d : nullptr;
  double q1 = 0;
  for (int c = 0; c < d; ++c) q1 += std::fabs(double(q[c]) / (qw ? qw[c] : 1.0f));
  double z = 0;
  for (int i = 0; i < P; ++i) {
    double s = 0;
    for (int k = 0; k < r; ++k) {
      double smax = 0;
      for (int j = 0; j < ng; ++j)
        smax = std::max(smax, double(std::fabs(sv.basis_scale[(bh * r + k) * ng + j])));
      s += std::fabs(double(sv.coeff_q[(bh * P + i) * r + k]) * sv.coeff_scale[bh * r + k]) * smax;
    }
    z = std::max(z, s);
  }
  return scale * q1 * z;
}

// The tolerance of a backend's score of (block blk, KV head g) for query q against the
// reference's ref (see the file comment and ArithModel).
inline double score_tolerance(const SummaryView& sv, int32_t blk, int g, const float* q,
                              float scale, double ref, const ArithModel& m) {
  const SummaryLayout& l = sv.layout;
  const double A = logit_magnitude(sv, blk, g, q, scale);
  double tol = (2 * (l.head_dim + l.rank) * kEps32 + m.u_score) * A +
               8 * kEps32 * (std::fabs(ref) + l.page_size);
  if (l.precision == Precision::quant && l.basis_group != l.head_dim)
    tol += m.u_basis * A + m.basis_abs * grouped_basis_magnitude(sv, blk, g, q, scale);
  return tol;
}

// Compares backend head scores hs [batch, Hq, M] (computed with scale t.scale()) with the
// reference's: -inf exactly where the contract says, finite scores within the tolerance.
inline void expect_scores_match(const TestCache& t, const SummaryView& sv, const float* hs,
                                const ArithModel& m = {}) {
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, M = t.max_blocks();
  const int G = Hq / t.spec.num_kv_heads, P = t.spec.page_size, d = t.spec.head_dim;
  std::vector<double> hr(size_t(B) * Hq * M);
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
        const double tol =
            score_tolerance(sv, t.block_of(b, j), h / G, t.q.data() + (size_t(b) * Hq + h) * d,
                            t.scale(), hr[i], m);
        EXPECT_NEAR(hs[i], hr[i], tol);
      }
}

// Aggregation tolerance: s - LSE in float loses ~eps32 (|s| + |LSE|) absolute; a float LSE
// over M entries adds ~M eps32; exp/log/sum of G shares add ~G eps32 in the log domain.
inline double aggregate_tol(const float* hs, int64_t n, int M, int G) {
  double mx = 0;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(hs[i])) mx = std::max(mx, std::fabs(double(hs[i])));
  return 16 * kEps32 * (2 * mx + M + G + 1);
}

// Compares backend group scores gs with the reference's aggregation of the same head scores.
inline void expect_aggregate_match(const std::vector<float>& hs, const BatchView& bv, int Hq, int H,
                                   const float* gs, const ArithModel& m = {}) {
  const int M = bv.max_blocks_per_seq, B = bv.batch_size;
  std::vector<double> gr(size_t(B) * H * M), hd(hs.begin(), hs.end());
  ref::aggregate_gqa(hd.data(), bv, Hq, H, gr.data());
  const double tol =
      aggregate_tol(hs.data(), int64_t(hs.size()), M, Hq / H) + m.agg_abs * (M + Hq / H);
  for (size_t i = 0; i < gr.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "entry " << i);
    if (gr[i] == kNegInf) {
      EXPECT_EQ(gs[i], kNegInfF);
    } else {
      EXPECT_NEAR(gs[i], gr[i], tol);
    }
  }
}

// Compares a backend's attention output out [batch, Hq, d] and lse [batch, Hq] (lse may be
// null: not checked) with the reference's on the pages of sel (every page when sel is null),
// for any cache, batch and query views (kernel tests with their own caches use this form).
inline void expect_attention_within_bound(const KvCacheView& kv, const BatchView& bv,
                                          const QueryView& qv, float scale, const Selection* sel,
                                          const float* out, const float* lse,
                                          const ArithModel& m = {}) {
  const CacheLayout& L = kv.layout;
  const int B = bv.batch_size, Hq = qv.num_q_heads, d = L.head_dim;
  const int H = L.num_kv_heads, G = Hq / H, P = L.page_size;
  std::vector<double> out_r(size_t(B) * Hq * d), lse_r(size_t(B) * Hq);
  ref::decode_attention(kv, bv, qv, scale, sel, out_r.data(), lse_r.data());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      SCOPED_TRACE(testing::Message() << "seq " << b << " head " << h);
      const int64_t q0 = qv.offset(b, h, d);
      const int32_t len = bv.seq_lens[b];
      std::vector<int> pages;
      if (sel) {
        const int64_t row = int64_t(b) * H + h / G;
        for (int i = 0; i < sel->counts[row]; ++i)
          pages.push_back(sel->pages[row * sel->capacity + i]);
      } else {
        for (int j = 0; j < pages_of(len, P); ++j) pages.push_back(j);
      }
      double A = 0, vmax = 0;
      int n = 0;
      for (int j : pages)
        for (int s = 0; s < std::min(P, len - j * P); ++s, ++n) {
          const int64_t off = kv.offset(bv.block_table[b * bv.block_table_stride + j], s, h / G);
          double a = 0;
          for (int c = 0; c < d; ++c) {
            a += std::fabs(double(load_as_float(qv.q, qv.dtype, q0 + c)) *
                           load_as_float(kv.k, L.dtype, off + c));
            vmax = std::max(vmax, double(std::fabs(load_as_float(kv.v, L.dtype, off + c))));
          }
          A = std::max(A, a * scale);
        }
      const double base = d * A + n + double(pages.size()) + 1;
      const size_t i = size_t(b) * Hq + h;
      // The query rounding moves each logit by <= u_query A; weights then by 2 u_query A
      // relative, plus u_weight from their own rounding.
      if (lse)
        EXPECT_NEAR(lse[i], lse_r[i],
                    2 * m.u_query * A + 4 * kEps32 * (base + std::fabs(lse_r[i])));
      for (int c = 0; c < d; ++c)
        EXPECT_NEAR(out[i * d + c], out_r[i * d + c],
                    vmax * (4 * m.u_query * A + 2 * m.u_weight + 4 * kEps32 * base));
    }
}

// The same for a TestCache's own cache, batch and query.
inline void expect_attention_match(const TestCache& t, const Selection* sel, const float* out,
                                   const float* lse, const ArithModel& m = {}) {
  expect_attention_within_bound(t.view(), t.bv(), t.qv(), t.scale(), sel, out, lse, m);
}

}  // namespace locks::test

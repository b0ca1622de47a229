// Quantized summaries (int8 centroid, int4 basis, int8 coefficients): the codes follow the
// storage contract of summary.h, dequantization is within half a step of every value, and
// quantized scores stay within the a-priori bound of docs/quantization.md of the fp32 scores:
//
//   |s_q - s_fp32| <= scale * [ ||q||_1 s_mu / 2
//                     + max_i sum_k ( e_k (|c'_ik| + s_ck / 2) + |w'_k| s_ck / 2 ) ],
//   e_k = sum_j ||q_j||_1 s_Vkj / 2   (j: the basis scale groups, q_j: q on group j's dims)
//
// s_mu, s_Vkj, s_ck are the stored scales, c' the dequantized coefficients and w'_k = V'_k . q
// with the dequantized basis: the bound is computable from the quant summary alone.
//
// Merged from the former test_impl_quantize.cpp:
// summary_quantize / summary_dequantize: code packing and round-trip error bounds.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "locks/error.h"
#include "locks/reference.h"
#include "locks/summary.h"
#include "test_params.h"
#include "test_util.h"

namespace locks::test {
namespace {

struct Dequant {
  std::vector<float> mu, basis, coeff;
  float s_mu;
  std::vector<float> s_v, s_c;  // s_v [r, d / g]
  int group;                    // g: dims per basis scale
};

Dequant dequant(const SummaryView& q, int64_t bh) {
  const SummaryLayout& l = q.layout;
  const int d = l.head_dim, r = l.rank, P = l.page_size;
  const int64_t nv = basis_scales_per_head(l);
  Dequant o{std::vector<float>(size_t(d)),
            std::vector<float>(size_t(r) * d),
            std::vector<float>(size_t(P) * r),
            q.mu_scale[bh],
            std::vector<float>(q.basis_scale + bh * nv, q.basis_scale + (bh + 1) * nv),
            std::vector<float>(q.coeff_scale + bh * r, q.coeff_scale + (bh + 1) * r),
            l.basis_group};
  summary_dequantize(q.mu_q + bh * d, q.mu_scale[bh], q.basis_q + bh * r * (d / 2),
                     q.basis_scale + bh * nv, q.coeff_q + bh * P * r, q.coeff_scale + bh * r, d, P,
                     r, l.basis_group, o.mu.data(), o.basis.data(), o.coeff.data());
  return o;
}

// The bound above, for one (page, head) and one query.
double quant_score_bound(const Dequant& z, const float* q, int d, int P, int r, float scale) {
  const double q1 = norm1(q, d);
  const int g = z.group, ng = d / g;
  std::vector<double> w(size_t(r), 0.0), e(size_t(r), 0.0);  // w'_k = V'_k . q, e_k
  for (int k = 0; k < r; ++k) {
    for (int c = 0; c < d; ++c) w[size_t(k)] += double(z.basis[size_t(k) * d + c]) * q[c];
    for (int j = 0; j < ng; ++j)
      e[size_t(k)] += norm1(q + j * g, g) * z.s_v[size_t(k * ng + j)] / 2;
  }
  double worst = 0;
  for (int i = 0; i < P; ++i) {
    double s = 0;
    for (int k = 0; k < r; ++k) {
      const double ck = std::fabs(z.coeff[size_t(i) * r + k]);
      s += e[size_t(k)] * (ck + z.s_c[size_t(k)] / 2) +
           std::fabs(w[size_t(k)]) * z.s_c[size_t(k)] / 2;
    }
    worst = std::max(worst, s);
  }
  return scale * (q1 * z.s_mu / 2 + worst);
}

class QuantizeGroups : public testing::TestWithParam<int> {};

// Per basis scale group g (g = d: one scale a row): scale of row k, group j = max over dims
// [j g, (j + 1) g) of |basis_k| / 7; codes and round trip per group.
TEST_P(QuantizeGroups, CodesScalesAndNibbleOrderFollowTheContract) {
  Rng rng(101);
  const int d = 64, P = 16, r = 8, g = GetParam(), ng = d / g;
  std::vector<float> mu = rng.normals(d), basis = rng.normals(size_t(r) * d),
                     coeff = rng.normals(size_t(P) * r, 3.0f);
  std::fill(basis.begin() + 2 * d, basis.begin() + 3 * d, 0.0f);  // a zero row: scale 0
  // Row 4: each group 4x the previous one's range, so per-group scales differ.
  for (int c = 0; c < d; ++c) basis[size_t(4 * d + c)] *= std::pow(4.0f, float(c / g));
  std::vector<int8_t> mu_q(d), coeff_q(size_t(P) * r);
  std::vector<uint8_t> basis_q(size_t(r) * d / 2);
  std::vector<float> bs(size_t(r) * ng), cs(r), mu2(d), basis2(basis.size()), coeff2(coeff.size());
  float ms = 0;
  summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, g, mu_q.data(), &ms,
                   basis_q.data(), bs.data(), coeff_q.data(), cs.data());
  summary_dequantize(mu_q.data(), ms, basis_q.data(), bs.data(), coeff_q.data(), cs.data(), d, P, r,
                     g, mu2.data(), basis2.data(), coeff2.data());
  auto max_abs = [](const float* x, int n, int stride) {
    float m = 0;
    for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i * stride]));
    return m;
  };
  // Scales = max|x| / 127 (or / 7); every value within half a step (+ float rounding).
  EXPECT_FLOAT_EQ(ms, max_abs(mu.data(), d, 1) / 127);
  for (int c = 0; c < d; ++c) {
    EXPECT_LE(std::abs(int(mu_q[size_t(c)])), 127);
    EXPECT_NEAR(mu2[size_t(c)], mu[size_t(c)], ms / 2 * (1 + 1e-5));
    EXPECT_FLOAT_EQ(mu2[size_t(c)], float(mu_q[size_t(c)]) * ms);
  }
  for (int k = 0; k < r; ++k) {
    for (int j = 0; j < ng; ++j)
      EXPECT_FLOAT_EQ(bs[size_t(k * ng + j)], max_abs(basis.data() + k * d + j * g, g, 1) / 7);
    EXPECT_FLOAT_EQ(cs[size_t(k)], max_abs(coeff.data() + k, P, r) / 127);
    for (int c = 0; c < d; ++c) {
      const float scale = bs[size_t(k * ng + c / g)];  // dim c's group
      // Independent decoding of the nibbles: low nibble = even dim, two's complement in [-7, 7].
      const uint8_t byte = basis_q[size_t(k) * d / 2 + c / 2];
      const int nib = c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
      const int code = nib >= 8 ? nib - 16 : nib;
      EXPECT_GE(code, -7);
      EXPECT_LE(code, 7);
      const size_t i = size_t(k) * d + c;
      EXPECT_FLOAT_EQ(basis2[i], float(code) * scale);
      EXPECT_NEAR(basis2[i], basis[i], scale / 2 * (1 + 1e-5));
    }
    for (int i = 0; i < P; ++i) {
      const size_t at = size_t(i) * r + k;
      EXPECT_LE(std::abs(int(coeff_q[at])), 127);
      EXPECT_NEAR(coeff2[at], coeff[at], cs[size_t(k)] / 2 * (1 + 1e-5));
    }
  }
  for (int j = 0; j < ng; ++j) EXPECT_EQ(bs[size_t(2 * ng + j)], 0.0f);  // zero range: scale 0
  for (int c = 0; c < d / 2; ++c) EXPECT_EQ(basis_q[size_t(2 * d / 2 + c)], 0);  // and codes 0
  // The graded row: one scale a row leaves the first group's small entries with codes
  // near 0; per-group scales give every group a code 7.
  if (ng > 1)
    for (int j = 0; j < ng; ++j) {
      int top = 0;
      for (int c = j * g; c < (j + 1) * g; ++c) {
        const uint8_t byte = basis_q[size_t(4 * d / 2 + c / 2)];
        const int nib = c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
        top = std::max(top, std::abs(nib >= 8 ? nib - 16 : nib));
      }
      EXPECT_EQ(top, 7) << "group " << j;
    }
}

INSTANTIATE_TEST_SUITE_P(Groups, QuantizeGroups, testing::Values(64, 32, 16, 2),
                         [](const testing::TestParamInfo<int>& i) {
                           return "g" + std::to_string(i.param);
                         });

class QuantBound : public testing::TestWithParam<Combo> {};

TEST_P(QuantBound, QuantScoresWithinDocumentedBoundOfFp32) {
  const Combo c = GetParam();
  const int P = c.page_size, r = rank_for(P), d = c.head_dim;
  for (int g : {d, 32}) {  // one basis scale a row, and per 32 dims
    double max_ratio = 0, max_err = 0, sum_bound = 0;
    int n = 0;
    for (bool structured : {false, true}) {
      SCOPED_TRACE(testing::Message()
                   << (structured ? "structured" : "random") << " basis_group " << g);
      TestCache t = make_cache(spec_for(c, structured, 111));
      SummaryStore f32 = build_summaries(t, r, Precision::fp32);
      SummaryStore q8 = build_summaries(t, r, Precision::quant, g);
      const SummaryView fv = f32.view(), qv = q8.view();
      const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, H = t.spec.num_kv_heads;
      const int G = Hq / H, M = t.max_blocks();
      std::vector<float> hq(size_t(B) * Hq * M);
      cpu::score_pages(qv, t.bv(), t.qv(), t.scale(), hq.data());
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < t.bv().seq_lens[b] / P; ++j)
          for (int h = 0; h < Hq; ++h) {
            const int32_t blk = t.block_of(b, j);
            const float* q = t.q.data() + (size_t(b) * Hq + h) * d;
            const Dequant z = dequant(qv, int64_t(blk) * H + h / G);
            const double bound = quant_score_bound(z, q, d, P, r, t.scale());
            const double s32 = ref::score_page(fv, blk, h / G, q, t.scale());
            const double s8 = ref::score_page(qv, blk, h / G, q, t.scale());
            SCOPED_TRACE(testing::Message() << "seq " << b << " page " << j << " head " << h);
            // Exact arithmetic on both sides (float64 reference): only rounding of the stored
            // floats adds to the bound.
            EXPECT_LE(std::fabs(s8 - s32), bound + 1e-6 * (1 + std::fabs(s32)));
            // The CPU's quant scores: the same bound plus float scoring arithmetic.
            EXPECT_LE(std::fabs(hq[(size_t(b) * Hq + h) * M + j] - s32),
                      bound + 1e-5 * (1 + std::fabs(s32)));
            if (bound > 0) max_ratio = std::max(max_ratio, std::fabs(s8 - s32) / bound);
            max_err = std::max(max_err, std::fabs(s8 - s32));
            sum_bound += bound;
            ++n;
          }
    }
    // Recorded for docs/quantization.md (run with --gtest_output=xml to read them); suffix
    // _g<basis_group>.
    const std::string sfx = "_g" + std::to_string(g);
    testing::Test::RecordProperty("max_error_over_bound" + sfx, std::to_string(max_ratio));
    testing::Test::RecordProperty("max_abs_error" + sfx, std::to_string(max_err));
    testing::Test::RecordProperty("mean_bound" + sfx, std::to_string(sum_bound / std::max(n, 1)));
  }
}

INSTANTIATE_TEST_SUITE_P(AllCombos, QuantBound, testing::ValuesIn(all_combos()), combo_name);

}  // namespace
}  // namespace locks::test

namespace {

struct Quant {
  std::vector<int8_t> mu_q, coeff_q;
  std::vector<uint8_t> basis_q;
  float mu_scale = 0;
  std::vector<float> basis_scale, coeff_scale;
  Quant(int d, int P, int r)
      : mu_q(static_cast<size_t>(d)),
        coeff_q(static_cast<size_t>(P * r)),
        basis_q(static_cast<size_t>(r * d / 2)),
        basis_scale(static_cast<size_t>(r)),
        coeff_scale(static_cast<size_t>(r)) {}
};

TEST(ImplQuantize, RoundTripWithinHalfAStep) {
  const int d = 64, P = 16, r = 6;
  std::mt19937 rng(7);
  std::normal_distribution<float> n01;
  std::vector<float> mu(d), basis(r * d), coeff(P * r);
  for (auto& x : mu) x = 3.0f * n01(rng);
  for (auto& x : basis) x = n01(rng);
  for (auto& x : coeff) x = 10.0f * n01(rng);
  Quant q(d, P, r);
  locks::summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, d, q.mu_q.data(),
                          &q.mu_scale, q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(),
                          q.coeff_scale.data());
  std::vector<float> mu2(d), basis2(r * d), coeff2(P * r);
  locks::summary_dequantize(q.mu_q.data(), q.mu_scale, q.basis_q.data(), q.basis_scale.data(),
                            q.coeff_q.data(), q.coeff_scale.data(), d, P, r, d, mu2.data(),
                            basis2.data(), coeff2.data());
  float mmax = 0;
  for (float x : mu) mmax = std::max(mmax, std::fabs(x));
  EXPECT_FLOAT_EQ(q.mu_scale, mmax / 127.0f);
  for (int i = 0; i < d; ++i) EXPECT_LE(std::fabs(mu[i] - mu2[i]), 0.5f * q.mu_scale * 1.0001f);
  for (int k = 0; k < r; ++k) {
    EXPECT_GT(q.basis_scale[k], 0.0f);
    for (int i = 0; i < d; ++i)
      EXPECT_LE(std::fabs(basis[k * d + i] - basis2[k * d + i]), 0.5f * q.basis_scale[k] * 1.0001f);
    for (int i = 0; i < P; ++i)
      EXPECT_LE(std::fabs(coeff[i * r + k] - coeff2[i * r + k]), 0.5f * q.coeff_scale[k] * 1.0001f);
  }
}

TEST(ImplQuantize, Int4PackingAndZeroRange) {
  const int d = 4, P = 3, r = 2;
  // Row 0 has max 7 -> scale 1: codes are the values; row 1 is all zero.
  std::vector<float> mu(d, 0.0f), basis = {1, -2, 7, -7, 0, 0, 0, 0}, coeff(P * r, 0.0f);
  coeff[0] = 127.0f;  // column 0 scale 1, column 1 all zero
  Quant q(d, P, r);
  locks::summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, d, q.mu_q.data(),
                          &q.mu_scale, q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(),
                          q.coeff_scale.data());
  EXPECT_EQ(q.mu_scale, 0.0f);
  for (int8_t c : q.mu_q) EXPECT_EQ(c, 0);
  EXPECT_FLOAT_EQ(q.basis_scale[0], 1.0f);
  EXPECT_EQ(q.basis_scale[1], 0.0f);
  EXPECT_EQ(q.basis_q[0], uint8_t(0x1 | (0xE << 4)));  // low nibble = dim 0 (1), high = -2
  EXPECT_EQ(q.basis_q[1], uint8_t(0x7 | (0x9 << 4)));  // 7, -7
  EXPECT_EQ(q.basis_q[2], 0);
  EXPECT_EQ(q.coeff_q[0], 127);
  EXPECT_EQ(q.coeff_scale[1], 0.0f);
}

TEST(ImplQuantize, RejectsNonFiniteAndBadRank) {
  const int d = 4, P = 3, r = 2;
  std::vector<float> mu(d, 1.0f), basis(r * d, 0.5f), coeff(P * r, 1.0f);
  Quant q(d, P, r);
  mu[2] = std::nanf("");
  EXPECT_THROW(locks::summary_quantize(
                   mu.data(), basis.data(), coeff.data(), d, P, r, d, q.mu_q.data(), &q.mu_scale,
                   q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(), q.coeff_scale.data()),
               locks::Error);
  mu[2] = 1.0f;
  EXPECT_THROW(locks::summary_quantize(
                   mu.data(), basis.data(), coeff.data(), d, P, P, d, q.mu_q.data(), &q.mu_scale,
                   q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(), q.coeff_scale.data()),
               locks::Error);
  // basis_group: 0, odd, not dividing head_dim
  for (int g : {0, 1, 3, 8, -2}) {
    try {
      locks::summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, g, q.mu_q.data(),
                              &q.mu_scale, q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(),
                              q.coeff_scale.data());
      ADD_FAILURE() << "basis_group " << g << " accepted";
    } catch (const locks::Error& e) {
      EXPECT_NE(std::string(e.what()).find("basis_group"), std::string::npos) << e.what();
    }
  }
}

TEST(ImplQuantize, LayoutBytes) {
  locks::SummaryLayout s;
  s.num_blocks = 1;
  s.page_size = 16;
  s.head_dim = 128;
  s.rank = 8;
  s.precision = locks::Precision::quant;
  s.basis_group = 128;
  // 128 + 4 (mu) + 512 + 32 (basis) + 128 + 32 (coeff)
  EXPECT_EQ(locks::summary_bytes_per_page(s), 836u);
  EXPECT_NEAR(locks::summary_share_of_bf16_kv(s), 836.0 / 8192.0, 1e-12);
  s.basis_group = 32;  // 8 rows x 4 scales
  EXPECT_EQ(locks::summary_bytes_per_page(s), 836u + 4 * 8 * 3);
  s.precision = locks::Precision::fp32;
  EXPECT_EQ(locks::summary_bytes_per_page(s), 4u * (128 + 1024 + 128));
  s.rank = 16;
  EXPECT_THROW(locks::validate_summary_layout(s), locks::Error);
}

// The library's scale groups: one a row up to head_dim 96 (SmolLM2's d 64 keeps its format),
// 32 dims from 128 on.
TEST(ImplQuantize, DefaultBasisGroup) {
  EXPECT_EQ(locks::default_basis_group(32), 32);
  EXPECT_EQ(locks::default_basis_group(64), 64);
  EXPECT_EQ(locks::default_basis_group(96), 96);
  EXPECT_EQ(locks::default_basis_group(128), 128);
  EXPECT_EQ(locks::default_basis_group(256), 32);
  const locks::CacheLayout c{4, 16, 2, 256, locks::DType::bf16};
  EXPECT_EQ(locks::summary_layout_for(c, 8, locks::Precision::quant).basis_group, 32);
  EXPECT_EQ(locks::summary_layout_for(c, 8, locks::Precision::quant, 256).basis_group, 256);
  // d 256, r 8: 256 + 4 + 1024 + 8 x 8 x 4 + 128 + 32 = 1700 bytes
  EXPECT_EQ(locks::summary_bytes_per_page(summary_layout_for(c, 8, locks::Precision::quant)),
            1700u);
}

// Bad scale groups are refused with a message naming the field.
TEST(ImplQuantize, LayoutRejectsBadBasisGroup) {
  locks::SummaryLayout s;
  s.num_blocks = 1;
  s.head_dim = 128;
  s.precision = locks::Precision::quant;
  for (int g : {0, -32, 1, 3, 33, 48, 256}) {
    s.basis_group = g;
    try {
      locks::validate_summary_layout(s);
      ADD_FAILURE() << "basis_group " << g << " accepted";
    } catch (const locks::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("basis_group"), std::string::npos) << m;
      if (g == 0) EXPECT_NE(m.find("unset"), std::string::npos) << m;
    }
  }
  const locks::CacheLayout c{4, 16, 2, 128, locks::DType::bf16};
  EXPECT_THROW(summary_layout_for(c, 8, locks::Precision::quant, 3), locks::Error);
  for (int g : {2, 16, 32, 64, 128}) {
    s.basis_group = g;
    EXPECT_NO_THROW(locks::validate_summary_layout(s)) << g;
  }
}

}  // namespace

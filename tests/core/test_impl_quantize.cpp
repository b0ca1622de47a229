// summary_quantize / summary_dequantize: code packing and round-trip error bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "locks/error.h"
#include "locks/summary.h"

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
  locks::summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, q.mu_q.data(),
                          &q.mu_scale, q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(),
                          q.coeff_scale.data());
  std::vector<float> mu2(d), basis2(r * d), coeff2(P * r);
  locks::summary_dequantize(q.mu_q.data(), q.mu_scale, q.basis_q.data(), q.basis_scale.data(),
                            q.coeff_q.data(), q.coeff_scale.data(), d, P, r, mu2.data(),
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
  locks::summary_quantize(mu.data(), basis.data(), coeff.data(), d, P, r, q.mu_q.data(),
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
                   mu.data(), basis.data(), coeff.data(), d, P, r, q.mu_q.data(), &q.mu_scale,
                   q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(), q.coeff_scale.data()),
               locks::Error);
  mu[2] = 1.0f;
  EXPECT_THROW(locks::summary_quantize(
                   mu.data(), basis.data(), coeff.data(), d, P, P, q.mu_q.data(), &q.mu_scale,
                   q.basis_q.data(), q.basis_scale.data(), q.coeff_q.data(), q.coeff_scale.data()),
               locks::Error);
}

TEST(ImplQuantize, LayoutBytes) {
  locks::SummaryLayout s;
  s.num_blocks = 1;
  s.page_size = 16;
  s.head_dim = 128;
  s.rank = 8;
  s.precision = locks::Precision::quant;
  // 128 + 4 (mu) + 512 + 32 (basis) + 128 + 32 (coeff)
  EXPECT_EQ(locks::summary_bytes_per_page(s), 836u);
  EXPECT_NEAR(locks::summary_share_of_bf16_kv(s), 836.0 / 8192.0, 1e-12);
  s.precision = locks::Precision::fp32;
  EXPECT_EQ(locks::summary_bytes_per_page(s), 4u * (128 + 1024 + 128));
  s.rank = 16;
  EXPECT_THROW(locks::validate_summary_layout(s), locks::Error);
}

}  // namespace

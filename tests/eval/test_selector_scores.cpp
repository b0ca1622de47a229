// Each selector's head scores against a brute-force float64 computation written here,
// independently of the selector code (plain loops; Eigen's JacobiSVD for the shared basis).
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "eval_test_util.h"
#include "locks/error.h"
#include "locks/eval/harness.h"
#include "locks/eval/selector.h"
#include "locks/reference.h"

namespace locks::eval {
namespace {

using test::noise_layer;

constexpr int64_t kTokens = 16 * 24 + 5;  // 24 full pages and a 5-token tail
constexpr int kKv = 2, kQ = 4, kD = 32, kSteps = 2;

double lse(const std::vector<double>& x) {
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

std::vector<float> scores_of(PageSelector& s, const LayerContext& ctx, int budget = 64) {
  s.prepare(ctx);
  std::vector<float> out(size_t(ctx.steps) * ctx.q_heads * ctx.num_pages);
  SelectConfig cfg;
  cfg.budget_tokens = budget;
  s.score(ctx, cfg, out.data());
  return out;
}

// Visits every (step, q head, full page) and compares with want(step, qh, kvh, page).
template <typename F>
void expect_scores(const LayerContext& ctx, const std::vector<float>& got, F want, double tol) {
  for (int s = 0; s < ctx.steps; ++s)
    for (int h = 0; h < ctx.q_heads; ++h)
      for (int j = 0; j < ctx.num_pages; ++j) {
        const float g = got[(size_t(s) * ctx.q_heads + h) * ctx.num_pages + j];
        if (j >= ctx.num_full_pages) {
          EXPECT_TRUE(std::isinf(g) && g < 0) << "tail page must score -inf";
          continue;
        }
        const double w = want(s, h, h / ctx.group(), j);
        ASSERT_NEAR(g, w, tol * std::max(1.0, std::fabs(w)))
            << "step " << s << " head " << h << " page " << j;
      }
}

TEST(SelectorScores, OracleIsExactLogPageMass) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  auto sel = make_selector("oracle", {});
  auto got = scores_of(*sel, ctx);
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) {
        return ref::exact_log_mass(ctx.cache, j, kvh, 16, ctx.query(s, h), ctx.scale);
      },
      1e-5);
}

// Brute-force channel bound over the given channels, min/max found by scanning the page.
double bound(const LayerContext& ctx, int kvh, int j, const float* q, const std::vector<int>& ch) {
  double acc = 0;
  for (int c : ch) {
    double lo = 1e300, hi = -1e300;
    for (int i = 0; i < 16; ++i) {
      const double k = ctx.key(int64_t(j) * 16 + i, kvh)[c];
      lo = std::min(lo, k);
      hi = std::max(hi, k);
    }
    acc += std::max(q[c] * lo, q[c] * hi);
  }
  return acc * ctx.scale;
}

TEST(SelectorScores, QuestIsChannelMinMaxBound) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  auto got = scores_of(*make_selector("quest", {}), ctx);
  std::vector<int> all(kD);
  std::iota(all.begin(), all.end(), 0);
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) { return bound(ctx, kvh, j, ctx.query(s, h), all); }, 1e-5);
  // And it is an upper bound of every logit of the page (its defining property).
  for (int h = 0; h < kQ; ++h)
    for (int j = 0; j < ctx.num_full_pages; ++j)
      for (int i = 0; i < 16; ++i) {
        const float* k = ctx.key(int64_t(j) * 16 + i, h / 2);
        double dot = 0;
        for (int c = 0; c < kD; ++c) dot += double(ctx.query(0, h)[c]) * k[c];
        EXPECT_LE(dot * ctx.scale, got[size_t(h) * ctx.num_pages + j] + 1e-4);
      }
}

TEST(SelectorScores, RocketUsesTopRQueryDims) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  SelectorParams p;
  p.rocket_dims = 5;
  auto got = scores_of(*make_selector("rocket", p), ctx);
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) {
        const float* q = ctx.query(s, h);
        std::vector<std::pair<double, int>> mag;
        for (int c = 0; c < kD; ++c) mag.push_back({-std::fabs(q[c]), c});
        std::sort(mag.begin(), mag.end());
        std::vector<int> top;
        for (int i = 0; i < 5; ++i) top.push_back(mag[i].second);
        return bound(ctx, kvh, j, q, top);
      },
      1e-5);
}

TEST(SelectorScores, SharedProjectionMatchesSvdOfAllKeys) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  SelectorParams p;
  p.basis_rank = 6;
  auto got = scores_of(*make_selector("shared_proj", p), ctx);
  std::vector<Eigen::MatrixXd> W(kKv);
  for (int h = 0; h < kKv; ++h) {
    Eigen::MatrixXd K(kTokens, kD);
    for (int64_t t = 0; t < kTokens; ++t)
      for (int c = 0; c < kD; ++c) K(t, c) = ctx.key(t, h)[c];
    Eigen::JacobiSVD<Eigen::MatrixXd> svd(K, Eigen::ComputeThinV);
    W[h] = svd.matrixV().leftCols(6);  // d x R; projector W W^T is sign-independent
  }
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) {
        Eigen::VectorXd q(kD);
        for (int c = 0; c < kD; ++c) q(c) = ctx.query(s, h)[c];
        std::vector<double> logits;
        for (int i = 0; i < 16; ++i) {
          Eigen::VectorXd k(kD);
          for (int c = 0; c < kD; ++c) k(c) = ctx.key(int64_t(j) * 16 + i, kvh)[c];
          logits.push_back((W[kvh].transpose() * q).dot(W[kvh].transpose() * k) * ctx.scale);
        }
        return lse(logits);
      },
      1e-4);
}

TEST(SelectorScores, SharedProjectionAtFullRankIsExactMass) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, 1);
  const auto& ctx = l.ctx();
  SelectorParams p;
  p.basis_rank = kD;
  auto got = scores_of(*make_selector("shared_proj", p), ctx);
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) {
        return ref::exact_log_mass(ctx.cache, j, kvh, 16, ctx.query(s, h), ctx.scale);
      },
      1e-4);
}

TEST(SelectorScores, ShadowKvLandmarksAreChunkMeans) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  auto got = scores_of(*make_selector("shadowkv", {}), ctx);
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) {
        std::vector<double> chunk;
        for (int c = 0; c < 2; ++c) {
          double dot = 0;
          for (int e = 0; e < kD; ++e) {
            double mean = 0;
            for (int i = 0; i < 8; ++i) mean += ctx.key(int64_t(j) * 16 + c * 8 + i, kvh)[e];
            dot += ctx.query(s, h)[e] * mean / 8;
          }
          chunk.push_back(std::log(8.0) + dot * ctx.scale);
        }
        return lse(chunk);
      },
      1e-5);
}

TEST(SelectorScores, LocksFullRankFp32IsExactMass) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  SelectorParams p;
  p.rank = 15;  // r = P - 1: the summary reconstructs every key exactly
  auto got = scores_of(*make_selector("locks_fp32", p), ctx);
  expect_scores(
      ctx, got,
      [&](int s, int h, int kvh, int j) {
        return ref::exact_log_mass(ctx.cache, j, kvh, 16, ctx.query(s, h), ctx.scale);
      },
      1e-3);
}

TEST(SelectorScores, LocksMatchesReferenceScoring) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  for (bool quant : {false, true}) {
    auto got = scores_of(*make_selector(quant ? "locks_quant" : "locks_fp32", {}), ctx);
    // Reference: the float64 scorer over summaries built by the core (the wiring under test
    // is layout, block ids and query rows).
    SummaryStore store(
        summary_layout_for(ctx.cache.layout, 8, quant ? Precision::quant : Precision::fp32));
    std::vector<int32_t> blocks(ctx.num_full_pages);
    std::iota(blocks.begin(), blocks.end(), 0);
    cpu::summary_build(ctx.cache, blocks.data(), blocks.size(), store.view());
    expect_scores(
        ctx, got,
        [&](int s, int h, int kvh, int j) {
          return ref::score_page(store.view(), j, kvh, ctx.query(s, h), ctx.scale);
        },
        1e-4);
  }
}

TEST(SelectorScores, MetadataShares) {
  auto l = noise_layer(16 * 64, 1, 1, 128, 1);
  const auto& ctx = l.ctx();
  const double kv = 2.0 * 16 * 128 * 2;
  EXPECT_DOUBLE_EQ(make_selector("quest", {})->metadata_bytes_per_page(ctx) / kv, 0.0625);
  EXPECT_DOUBLE_EQ(make_selector("rocket", {})->metadata_bytes_per_page(ctx) / kv, 0.0625);
  EXPECT_DOUBLE_EQ(
      make_selector("locks_quant", {})->metadata_bytes_per_page(ctx) / kv,
      summary_share_of_bf16_kv(summary_layout_for(ctx.cache.layout, 8, Precision::quant)));
  EXPECT_DOUBLE_EQ(make_selector("oracle", {})->metadata_bytes_per_page(ctx), 0.0);
  // Landmarks: 2 chunks x 128 x bf16 = 512 bytes, plus the 128 x 32 bf16 basis over 64 pages.
  EXPECT_DOUBLE_EQ(make_selector("shadowkv", {})->metadata_bytes_per_page(ctx),
                   512.0 + 128.0 * 32 * 2 / 64);
}

TEST(SelectorScores, UnknownNameIsAnError) { EXPECT_THROW(make_selector("h2o", {}), Error); }

}  // namespace
}  // namespace locks::eval

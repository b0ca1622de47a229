// Synthetic generators: determinism, shapes, and that each kind has the property it is
// meant to test (checked directly in float64 on the generated data, no locks_core needed).
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "locks/error.h"
#include "locks/synthetic.h"

using locks::SynthConfig;
using locks::SynthData;
using locks::SynthKind;

namespace {

SynthConfig small(SynthKind kind, int64_t tokens = 4096, int d = 64) {
  SynthConfig c;
  c.kind = kind;
  c.tokens = tokens;
  c.head_dim = d;
  c.num_kv_heads = 2;
  c.num_q_heads = 4;
  c.steps = 2;
  c.seed = 7;
  return c;
}

const float* key(const SynthData& s, int64_t t, int h) {
  return &s.keys[(t * s.cfg.num_kv_heads + h) * s.cfg.head_dim];
}
const float* query(const SynthData& s, int step, int hq) {
  return &s.queries[(int64_t(step) * s.cfg.num_q_heads + hq) * s.cfg.head_dim];
}

// Exact softmax mass per page for query (step, hq) on its KV head, float64.
std::vector<double> page_mass(const SynthData& s, int step, int hq,
                              const float* keys_override = nullptr) {
  const auto& c = s.cfg;
  const int h = hq / (c.num_q_heads / c.num_kv_heads), d = c.head_dim;
  const float* q = query(s, step, hq);
  std::vector<double> logit(c.tokens);
  for (int64_t t = 0; t < c.tokens; ++t) {
    const float* k = keys_override ? keys_override + t * d : key(s, t, h);
    double acc = 0;
    for (int i = 0; i < d; ++i) acc += double(q[i]) * k[i];
    logit[t] = acc / std::sqrt(double(d));
  }
  const double mx = *std::max_element(logit.begin(), logit.end());
  std::vector<double> mass((c.tokens + c.page_size - 1) / c.page_size, 0.0);
  double total = 0;
  for (int64_t t = 0; t < c.tokens; ++t) {
    const double e = std::exp(logit[t] - mx);
    mass[t / c.page_size] += e;
    total += e;
  }
  for (double& m : mass) m /= total;
  return mass;
}

double share_on(const std::vector<double>& mass, const std::vector<int64_t>& pages) {
  double s = 0;
  for (int64_t j : pages) s += mass[j];
  return s;
}

// Share of the mass covered by the k pages that rank highest under `score`.
double topk_recall(const std::vector<double>& mass, const std::vector<double>& score, int k) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int a, int b) { return score[a] > score[b]; });
  double r = 0;
  for (int i = 0; i < k; ++i) r += mass[idx[i]];
  return r;
}

}  // namespace

TEST(Synthetic, NamesRoundTrip) {
  for (SynthKind k :
       {SynthKind::gaussian, SynthKind::local_lowrank, SynthKind::blind_spot, SynthKind::needles})
    EXPECT_EQ(locks::synth_from_name(locks::synth_name(k)), k);
  EXPECT_THROW(locks::synth_from_name("uniform"), locks::Error);
}

TEST(Synthetic, ShapesAndDeterminism) {
  for (SynthKind k :
       {SynthKind::gaussian, SynthKind::local_lowrank, SynthKind::blind_spot, SynthKind::needles}) {
    SynthConfig c = small(k, 1000);  // not a multiple of the page size: partial tail page
    const SynthData a = locks::synth_generate(c), b = locks::synth_generate(c);
    EXPECT_EQ(a.keys.size(), size_t(1000 * 2 * 64));
    EXPECT_EQ(a.values.size(), a.keys.size());
    EXPECT_EQ(a.queries.size(), size_t(2 * 4 * 64));
    EXPECT_EQ(a.keys, b.keys);
    EXPECT_EQ(a.values, b.values);
    EXPECT_EQ(a.queries, b.queries);
    EXPECT_EQ(a.relevant_pages, b.relevant_pages);
    for (float x : a.keys) ASSERT_TRUE(std::isfinite(x));
    c.seed = 8;
    const SynthData other = locks::synth_generate(c);
    EXPECT_NE(a.keys, other.keys);
    if (k == SynthKind::gaussian) {
      EXPECT_TRUE(a.relevant_pages.empty());
    } else {
      ASSERT_FALSE(a.relevant_pages.empty());
      EXPECT_TRUE(std::is_sorted(a.relevant_pages.begin(), a.relevant_pages.end()));
      for (int64_t j : a.relevant_pages) {
        EXPECT_GE(j, 1);              // not the first page (sink)
        EXPECT_LT(j, 1000 / 16 - 1);  // nor the last full page, nor the tail
      }
    }
  }
}

TEST(Synthetic, RelevantPageCountScalesWithLength) {
  SynthConfig c = small(SynthKind::local_lowrank, 65536, 16);
  c.num_kv_heads = c.num_q_heads = 1;
  c.steps = 1;
  EXPECT_EQ(locks::synth_generate(c).relevant_pages.size(), 4u);
}

TEST(Synthetic, GaussianHasNearlyUniformAttention) {
  const SynthData s = locks::synth_generate(small(SynthKind::gaussian));
  const auto mass = page_mass(s, 0, 0);
  EXPECT_LT(*std::max_element(mass.begin(), mass.end()), 0.05);
  double mean = 0, var = 0;
  for (float x : s.keys) mean += x;
  mean /= s.keys.size();
  for (float x : s.keys) var += (x - mean) * (x - mean);
  var /= s.keys.size();
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var, 1.0, 0.02);
}

TEST(Synthetic, LocalLowRankPagesAndPeakedAttention) {
  const SynthData s = locks::synth_generate(small(SynthKind::local_lowrank));
  const int d = s.cfg.head_dim, P = s.cfg.page_size;
  // Every page: the centred keys are rank 4..6 plus small noise.
  for (int64_t j = 0; j < 20; ++j) {
    Eigen::MatrixXd D(P, d);
    for (int i = 0; i < P; ++i)
      for (int c = 0; c < d; ++c) D(i, c) = key(s, j * P + i, 1)[c];
    D.rowwise() -= D.colwise().mean();
    const Eigen::VectorXd sv = Eigen::JacobiSVD<Eigen::MatrixXd>(D).singularValues();
    EXPECT_GE(sv.head(6).squaredNorm() / sv.squaredNorm(), 0.95) << "page " << j;
    EXPECT_LT(sv(6), 2.0) << "page " << j;
    EXPECT_GT(sv(3), 2.0) << "page " << j;
  }
  // The planted pages carry most of every query head's attention.
  for (int step = 0; step < 2; ++step)
    for (int hq = 0; hq < 4; ++hq)
      EXPECT_GT(share_on(page_mass(s, step, hq), s.relevant_pages), 0.8) << step << "," << hq;
}

TEST(Synthetic, NeedlesCarryTheMass) {
  const SynthData s = locks::synth_generate(small(SynthKind::needles));
  for (int hq = 0; hq < 4; ++hq) EXPECT_GT(share_on(page_mass(s, 0, hq), s.relevant_pages), 0.8);
  // A needle is one token: its page's other keys are ordinary Gaussian keys.
  const std::vector<double> m = page_mass(s, 0, 0);
  EXPECT_LT(m[0], 0.01);
}

// Proposition 1: scoring pages through the top-R shared basis of all keys misses the
// relevant pages, while their exact mass dominates.
TEST(Synthetic, BlindSpotDefeatsASharedBasis) {
  SynthConfig c = small(SynthKind::blind_spot, 8192);
  const SynthData s = locks::synth_generate(c);
  const int d = c.head_dim, H = c.num_kv_heads;
  const int64_t T = c.tokens, pages = T / c.page_size;
  for (int h = 0; h < H; ++h) {
    Eigen::MatrixXd K(T, d);
    for (int64_t t = 0; t < T; ++t)
      for (int i = 0; i < d; ++i) K(t, i) = key(s, t, h)[i];
    Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(K.transpose() * K);
    for (int R : {d / 4, d / 2}) {
      const Eigen::MatrixXd W = eig.eigenvectors().rightCols(R);  // top-R shared basis
      const Eigen::MatrixXd Kp = (K * W) * W.transpose();
      std::vector<float> proj(T * d);
      for (int64_t t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) proj[t * d + i] = static_cast<float>(Kp(t, i));
      const int hq = h * (c.num_q_heads / H);
      const auto exact = page_mass(s, 0, hq);
      const auto shared = page_mass(s, 0, hq, proj.data());
      const int k = static_cast<int>(pages / 32);
      EXPECT_GT(share_on(exact, s.relevant_pages), 0.8);
      EXPECT_GT(topk_recall(exact, exact, k), 0.8);
      EXPECT_LT(topk_recall(exact, shared, k), 0.3) << "head " << h << ", R " << R;
    }
  }
}

TEST(Synthetic, RejectsBadConfigs) {
  SynthConfig c = small(SynthKind::local_lowrank);
  c.num_q_heads = 3;
  EXPECT_THROW(locks::synth_generate(c), locks::Error);
  c = small(SynthKind::gaussian);
  c.tokens = 0;
  EXPECT_THROW(locks::synth_generate(c), locks::Error);
  c = small(SynthKind::needles, 8);  // no full page to plant a needle in
  EXPECT_THROW(locks::synth_generate(c), locks::Error);
  c = small(SynthKind::gaussian);
  c.head_dim = 8;
  EXPECT_THROW(locks::synth_generate(c), locks::Error);
}

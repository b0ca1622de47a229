// Quality metrics against direct float64 computations: attention-mass recall from the
// reference's exact page masses and total log-sum-exp; cosine and relative L2 on vectors
// with known answers.
#include <gtest/gtest.h>

#include <cmath>

#include "locks/metrics.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(Metrics, AttentionMassRecallMatchesReference) {
  CacheSpec sp;
  sp.structured = true;
  sp.num_q_heads = 8;
  sp.seq_lens = {16 * 7 + 5, 16 * 5, 9};
  TestCache t = make_cache(sp);
  const int B = 3, Hq = 8, H = 2, G = 4, P = 16, d = sp.head_dim;
  // An arbitrary selection per (sequence, KV head): every other page, plus page 0.
  const int cap = t.max_blocks();
  SelectionBuf s(B, H, cap);
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < H; ++g) {
      std::vector<int32_t> pick;
      for (int j = 0; j < pages_of(t.bv().seq_lens[b], P); ++j)
        if (j % 2 == g % 2 || j == 0) pick.push_back(j);
      const int64_t row = int64_t(b) * H + g;
      s.counts[size_t(row)] = int32_t(pick.size());
      for (int i = 0; i < cap; ++i)
        s.pages[size_t(row * cap + i)] = i < int(pick.size()) ? pick[size_t(i)] : -1;
    }
  std::vector<double> recall(size_t(B) * Hq), lse(size_t(B) * Hq), out(size_t(B) * Hq * d);
  attention_mass_recall(t.view(), t.bv(), t.qv(), t.scale(), s.sel, recall.data());
  ref::decode_attention(t.view(), t.bv(), t.qv(), t.scale(), nullptr, out.data(), lse.data());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      const int32_t len = t.bv().seq_lens[b];
      double hit = 0;
      for (int32_t j : s.of(b, h / G, H)) {
        const int n = std::min(P, len - j * P);
        hit += std::exp(ref::exact_log_mass(t.view(), t.block_of(b, j), h / G, n,
                                            t.q.data() + (size_t(b) * Hq + h) * d, t.scale()) -
                        lse[size_t(b) * Hq + h]);
      }
      // Both sides are float64 sums of the same exponentials.
      EXPECT_NEAR(recall[size_t(b) * Hq + h], hit, 1e-12) << "seq " << b << " head " << h;
      EXPECT_GT(hit, 0.0);
      EXPECT_LE(hit, 1.0 + 1e-12);
    }
  // Selecting every page recalls all the mass.
  SelectionBuf all(B, H, cap);
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < H; ++g) {
      const int n = int(pages_of(t.bv().seq_lens[b], P));
      all.counts[size_t(b * H + g)] = n;
      for (int i = 0; i < cap; ++i) all.pages[size_t((b * H + g) * cap + i)] = i < n ? i : -1;
    }
  attention_mass_recall(t.view(), t.bv(), t.qv(), t.scale(), all.sel, recall.data());
  for (double r : recall) EXPECT_NEAR(r, 1.0, 1e-12);
}

TEST(Metrics, CosineAndRelativeL2OnKnownVectors) {
  const std::vector<float> a{1, 2, 3, 4}, b2{2, 4, 6, 8}, neg{-1, -2, -3, -4}, orth{2, -1, 4, -3};
  EXPECT_NEAR(cosine_similarity(a.data(), b2.data(), 4), 1.0, 1e-12);
  EXPECT_NEAR(cosine_similarity(a.data(), neg.data(), 4), -1.0, 1e-12);
  EXPECT_NEAR(cosine_similarity(a.data(), orth.data(), 4), 0.0, 1e-12);
  EXPECT_NEAR(relative_l2(a.data(), a.data(), 4), 0.0, 1e-12);
  EXPECT_NEAR(relative_l2(b2.data(), a.data(), 4), 1.0, 1e-12);  // ||2a - a|| / ||a||
  EXPECT_NEAR(relative_l2(a.data(), b2.data(), 4), 0.5, 1e-12);  // ||a - 2a|| / ||2a||
  const std::vector<float> c{1, 0, 0, 1};  // cos(a, c) = 5 / (sqrt(30) sqrt(2))
  EXPECT_NEAR(cosine_similarity(a.data(), c.data(), 4), 5 / std::sqrt(60.0), 1e-12);
}

}  // namespace
}  // namespace locks::test

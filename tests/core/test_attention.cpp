// cpu::decode_attention_dense / _sparse against ref::decode_attention (float64, two-pass
// softmax), every dtype x head_dim x page size, random and structured caches, GQA 1/4/8;
// and sparse == dense bit for bit when the budget covers the context.
//
// Tolerances: test_compare.h.
//
// Merged from the former test_impl_attention.cpp:
// cpu attention, summaries and decoder: dense == sparse-over-all-pages bit for bit (also
// across several flash-decoding chunks), agreement with the float64 reference, exact
// scores at rank P - 1, and the decoder at full budget.

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "locks/attention.h"
#include "locks/decoder.h"
#include "locks/metrics.h"
#include "locks/reference.h"
#include "locks/summary.h"
#include "test_compare.h"
#include "test_params.h"
#include "test_util.h"

namespace locks::test {
namespace {

void check_attention(const TestCache& t, const Selection* sel) {
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, d = t.spec.head_dim;
  std::vector<float> out(size_t(B) * Hq * d, 777.0f), lse(size_t(B) * Hq, 777.0f);
  if (sel) {
    cpu::decode_attention_sparse(t.view(), t.bv(), t.qv(), t.scale(), *sel,
                                 {out.data(), lse.data()});
  } else {
    cpu::decode_attention_dense(t.view(), t.bv(), t.qv(), t.scale(), {out.data(), lse.data()});
  }
  expect_attention_match(t, sel, out.data(), lse.data());
}

class Attention : public testing::TestWithParam<Combo> {};

TEST_P(Attention, DenseMatchesReference) {
  for (bool structured : {false, true})
    check_attention(make_cache(spec_for(GetParam(), structured, 61)), nullptr);
}

TEST_P(Attention, SparseMatchesReferenceOnSelectedPages) {
  const Combo c = GetParam();
  for (bool structured : {false, true}) {
    TestCache t = make_cache(spec_for(c, structured, 62));
    SummaryStore store = build_summaries(t, rank_for(c.page_size), Precision::fp32);
    const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, H = t.spec.num_kv_heads;
    const int M = t.max_blocks(), P = c.page_size;
    std::vector<float> hs(size_t(B) * Hq * M), gs(size_t(B) * H * M);
    cpu::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hs.data());
    cpu::aggregate_gqa(hs.data(), t.bv(), Hq, H, gs.data());
    const SelectConfig cfg{3 * P, 1, 0};
    SelectionBuf s(B, H, select_capacity(cfg, P, M));
    cpu::select_pages(gs.data(), t.bv(), H, P, cfg, s.sel);
    check_attention(t, &s.sel);
  }
}

TEST_P(Attention, SparseEqualsDenseBitwiseWhenBudgetCoversContext) {
  const Combo c = GetParam();
  TestCache t = make_cache(spec_for(c, true, 63));
  SummaryStore store = build_summaries(t, rank_for(c.page_size), Precision::fp32);
  const int B = t.bv().batch_size, Hq = t.spec.num_q_heads, H = t.spec.num_kv_heads;
  const int M = t.max_blocks(), P = c.page_size, d = c.head_dim;
  std::vector<float> hs(size_t(B) * Hq * M), gs(size_t(B) * H * M);
  cpu::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hs.data());
  cpu::aggregate_gqa(hs.data(), t.bv(), Hq, H, gs.data());
  int32_t longest = 0;
  for (int b = 0; b < B; ++b) longest = std::max(longest, t.bv().seq_lens[b]);
  const SelectConfig cfg{longest, 0, 0};
  SelectionBuf s(B, H, select_capacity(cfg, P, M));
  cpu::select_pages(gs.data(), t.bv(), H, P, cfg, s.sel);
  std::vector<float> od(size_t(B) * Hq * d), ld(size_t(B) * Hq), os(od.size()), ls(ld.size());
  cpu::decode_attention_dense(t.view(), t.bv(), t.qv(), t.scale(), {od.data(), ld.data()});
  cpu::decode_attention_sparse(t.view(), t.bv(), t.qv(), t.scale(), s.sel, {os.data(), ls.data()});
  EXPECT_EQ(std::memcmp(od.data(), os.data(), od.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(ld.data(), ls.data(), ld.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(AllCombos, Attention, testing::ValuesIn(all_combos()), combo_name);

TEST(AttentionGqa, GroupSizes148DenseAndRandomSparse) {
  for (int G : {1, 4, 8}) {
    CacheSpec sp;
    sp.num_kv_heads = 2;
    sp.num_q_heads = 2 * G;
    sp.seq_lens = {16 * 5 + 9, 16 * 4, 3};
    sp.seed = 70 + uint64_t(G);
    TestCache t = make_cache(sp);
    SCOPED_TRACE(testing::Message() << "G = " << G);
    check_attention(t, nullptr);
    // An arbitrary ascending subset of pages per (sequence, KV head), not necessarily one that
    // select_pages would produce: the kernel must attend exactly those pages.
    Rng rng(80 + uint64_t(G));
    const int B = 3, M = t.max_blocks();
    SelectionBuf s(B, 2, M);
    for (int b = 0; b < B; ++b)
      for (int g = 0; g < 2; ++g) {
        std::vector<int32_t> pick;
        for (int j = 0; j < pages_of(t.bv().seq_lens[b], 16); ++j)
          if (rng.integer(0, 1)) pick.push_back(j);
        if (pick.empty()) pick.push_back(0);
        const int64_t row = int64_t(b) * 2 + g;
        s.counts[size_t(row)] = int32_t(pick.size());
        for (int i = 0; i < M; ++i)
          s.pages[size_t(row * M + i)] = i < int(pick.size()) ? pick[size_t(i)] : -1;
      }
    check_attention(t, &s.sel);
  }
}

TEST(AttentionExtremeLogits, StableForLargeLogits) {
  // Queries scaled so logits reach the hundreds: a naive exp would overflow float. The
  // tolerance of check_attention scales with the logit magnitude.
  CacheSpec sp;
  sp.num_kv_heads = 1;
  sp.num_q_heads = 1;
  sp.seq_lens = {40};
  TestCache t = make_cache(sp);
  for (auto& x : t.q) x *= 100.0f;
  std::vector<float> out(64), lse(1);
  cpu::decode_attention_dense(t.view(), t.bv(), t.qv(), t.scale(), {out.data(), lse.data()});
  EXPECT_GT(std::fabs(lse[0]), 100.0f);
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
  check_attention(t, nullptr);
}

}  // namespace
}  // namespace locks::test

namespace {

struct Fixture {
  locks::CacheLayout L;
  std::unique_ptr<locks::PagedKvCache> cache;
  locks::PagedKvCache::Batch batch;
  std::vector<float> q;
  int Hq = 4;

  Fixture(locks::DType t, std::vector<int32_t> lens, int d = 64, int P = 16) {
    L.page_size = P;
    L.num_kv_heads = 2;
    L.head_dim = d;
    L.dtype = t;
    int64_t blocks = 0;
    for (int32_t n : lens) blocks += (n + P - 1) / P;
    L.num_blocks = blocks + 1;
    cache = std::make_unique<locks::PagedKvCache>(L);
    std::mt19937 rng(11);
    std::normal_distribution<float> n01;
    const int64_t row = int64_t(L.num_kv_heads) * d;
    for (int32_t n : lens) {
      const int s = cache->add_sequence();
      std::vector<float> k(size_t(n * row)), v(size_t(n * row));
      for (auto& x : k) x = 1.5f * n01(rng);
      for (auto& x : v) x = n01(rng);
      cache->append(s, k.data(), v.data(), n);
    }
    batch = cache->batch();
    q.resize(size_t(lens.size()) * Hq * d);
    for (auto& x : q) x = n01(rng);
  }
  locks::QueryView qv() const { return {q.data(), Hq}; }
  size_t out_size() const { return q.size(); }
};

class ImplAttention : public ::testing::TestWithParam<locks::DType> {};

TEST_P(ImplAttention, SparseOverAllPagesIsDenseBitForBitAndMatchesReference) {
  // 70 pages (three 32-page chunks) + tail, and a short sequence.
  Fixture f(GetParam(), {16 * 70 + 5, 37});
  const float scale = 0.125f;
  const int B = f.batch.view.batch_size, M = f.batch.view.max_blocks_per_seq;
  std::vector<float> dense(f.out_size()), sparse(f.out_size()), lse_d(B * f.Hq), lse_s(B * f.Hq);
  locks::cpu::decode_attention_dense(f.cache->view(), f.batch.view, f.qv(), scale,
                                     {dense.data(), lse_d.data()});
  std::vector<int32_t> pages(size_t(B) * 2 * M, -1), counts(size_t(B) * 2);
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < 2; ++g) {
      const int n = (f.batch.seq_lens[b] + 15) / 16;
      counts[b * 2 + g] = n;
      for (int j = 0; j < n; ++j) pages[(b * 2 + g) * M + j] = j;
    }
  locks::Selection sel{pages.data(), counts.data(), M};
  locks::cpu::decode_attention_sparse(f.cache->view(), f.batch.view, f.qv(), scale, sel,
                                      {sparse.data(), lse_s.data()});
  EXPECT_EQ(std::memcmp(dense.data(), sparse.data(), dense.size() * 4), 0);
  EXPECT_EQ(std::memcmp(lse_d.data(), lse_s.data(), lse_d.size() * 4), 0);

  std::vector<double> ref(f.out_size()), ref_lse(B * f.Hq);
  locks::ref::decode_attention(f.cache->view(), f.batch.view, f.qv(), scale, nullptr, ref.data(),
                               ref_lse.data());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(dense[i], ref[i], 2e-5) << i;
  for (size_t i = 0; i < ref_lse.size(); ++i) EXPECT_NEAR(lse_d[i], ref_lse[i], 2e-5) << i;

  // A real subset: every third page plus the tail.
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < 2; ++g) {
      const int n = (f.batch.seq_lens[b] + 15) / 16;
      int c = 0;
      for (int j = 0; j < n; ++j)
        if (j % 3 == g || j == n - 1) pages[(b * 2 + g) * M + c++] = j;
      counts[b * 2 + g] = c;
    }
  locks::cpu::decode_attention_sparse(f.cache->view(), f.batch.view, f.qv(), scale, sel,
                                      {sparse.data(), nullptr});
  locks::ref::decode_attention(f.cache->view(), f.batch.view, f.qv(), scale, &sel, ref.data(),
                               nullptr);
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(sparse[i], ref[i], 2e-5) << i;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, ImplAttention,
                         ::testing::Values(locks::DType::f32, locks::DType::f16,
                                           locks::DType::bf16));

TEST(ImplSummary, FullRankScoresAreExactLogMassAndQuantIsClose) {
  Fixture f(locks::DType::f32, {16 * 6 + 3}, 32, 8);
  const float scale = 0.2f;
  const int M = f.batch.view.max_blocks_per_seq;
  std::vector<int32_t> blocks(f.cache->blocks(0).begin(), f.cache->blocks(0).end() - 1);
  for (auto prec : {locks::Precision::fp32, locks::Precision::quant}) {
    locks::SummaryStore store(locks::summary_layout_for(f.L, 7, prec));
    locks::cpu::summary_build(f.cache->view(), blocks.data(), int64_t(blocks.size()), store.view());
    std::vector<float> scores(size_t(f.Hq) * M);
    locks::cpu::score_pages(store.view(), f.batch.view, f.qv(), scale, scores.data());
    for (int h = 0; h < f.Hq; ++h) {
      for (int j = 0; j < M; ++j) {
        const float s = scores[size_t(h * M + j)];
        if (j >= int(blocks.size())) {
          EXPECT_EQ(s, -INFINITY);
          continue;
        }
        const float* qh = f.q.data() + h * 32;
        if (prec == locks::Precision::fp32) {
          EXPECT_NEAR(
              s, locks::ref::exact_log_mass(f.cache->view(), blocks[j], h / 2, 8, qh, scale), 2e-4);
        } else {  // same quantized summary, float64 reference arithmetic
          EXPECT_NEAR(s, locks::ref::score_page(store.view(), blocks[j], h / 2, qh, scale), 2e-4);
        }
      }
    }
  }
}

TEST(ImplDecoder, FullBudgetEqualsDenseAndRecallIsOne) {
  Fixture f(locks::DType::bf16, {16 * 40, 16 * 9 + 1});
  std::vector<int32_t> all;
  for (int s = 0; s < 2; ++s)
    for (size_t i = 0; i + 1 <= f.cache->blocks(s).size(); ++i)
      if (int64_t(i + 1) * 16 <= f.cache->seq_len(s)) all.push_back(f.cache->blocks(s)[i]);
  locks::SummaryStore store(locks::summary_layout_for(f.L, 8, locks::Precision::quant));
  locks::cpu::summary_build(f.cache->view(), all.data(), int64_t(all.size()), store.view());
  locks::DecodeConfig cfg;
  cfg.select.budget_tokens = 16 * 40;
  const int M = f.batch.view.max_blocks_per_seq;
  locks::cpu::Decoder dec(f.L, f.Hq, 2, M, cfg);
  std::vector<float> out(f.out_size()), dense(f.out_size());
  dec.run(f.cache->view(), store.view(), f.batch.view, f.qv(), {out.data(), nullptr});
  const float scale = 1.0f / std::sqrt(64.0f);
  locks::cpu::decode_attention_dense(f.cache->view(), f.batch.view, f.qv(), scale,
                                     {dense.data(), nullptr});
  EXPECT_EQ(std::memcmp(out.data(), dense.data(), out.size() * 4), 0);
  std::vector<double> recall(2 * f.Hq);
  locks::attention_mass_recall(f.cache->view(), f.batch.view, f.qv(), scale, dec.selection(),
                               recall.data());
  for (double r : recall) EXPECT_NEAR(r, 1.0, 1e-12);

  // A small budget: 8 pages per KV head, recall strictly between 0 and 1 for sequence 0.
  cfg.select = {128, 1, 1};
  locks::cpu::Decoder small(f.L, f.Hq, 2, M, cfg);
  small.run(f.cache->view(), store.view(), f.batch.view, f.qv(), {out.data(), nullptr});
  const auto sel = small.selection();
  EXPECT_EQ(sel.counts[0], 8);
  EXPECT_EQ(sel.counts[2], 8);
  locks::attention_mass_recall(f.cache->view(), f.batch.view, f.qv(), scale, sel, recall.data());
  for (int h = 0; h < f.Hq; ++h) {
    EXPECT_GT(recall[h], 0.0);
    EXPECT_LT(recall[h], 1.0);
  }
  EXPECT_GE(locks::cosine_similarity(out.data(), dense.data(), int64_t(out.size())), 0.0);
}

TEST(ImplAttention, ResultsDoNotDependOnTheThreadCount) {
  Fixture f(locks::DType::bf16, {16 * 100 + 7, 16 * 3, 5});
  std::vector<float> one(f.out_size()), many(f.out_size()), lse1(3 * f.Hq), lse2(3 * f.Hq);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  locks::cpu::decode_attention_dense(f.cache->view(), f.batch.view, f.qv(), 0.1f,
                                     {one.data(), lse1.data()});
  omp_set_num_threads(4);
  locks::cpu::decode_attention_dense(f.cache->view(), f.batch.view, f.qv(), 0.1f,
                                     {many.data(), lse2.data()});
  omp_set_num_threads(saved);
  EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * 4), 0);
  EXPECT_EQ(std::memcmp(lse1.data(), lse2.data(), lse1.size() * 4), 0);
}

}  // namespace

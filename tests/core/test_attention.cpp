// cpu::decode_attention_dense / _sparse against ref::decode_attention (float64, two-pass
// softmax), every dtype x head_dim x page size, random and structured caches, GQA 1/4/8;
// and sparse == dense bit for bit when the budget covers the context.
//
// Tolerances: test_compare.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "locks/reference.h"
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

// cpu::score_pages and cpu::aggregate_gqa against the float64 reference, on the same
// summaries (fp32 and quant), random and structured caches, GQA group sizes 1, 4, 8.
//
// Tolerances: test_compare.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_compare.h"
#include "test_params.h"
#include "test_util.h"

namespace locks::test {
namespace {

// Scores every page with the CPU and compares with the reference (test_compare.h).
void check_scores(const TestCache& t, const SummaryView& sv) {
  std::vector<float> hs(size_t(t.bv().batch_size) * t.spec.num_q_heads * t.max_blocks(), 12345.0f);
  cpu::score_pages(sv, t.bv(), t.qv(), t.scale(), hs.data());
  expect_scores_match(t, sv, hs.data());
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

void check_aggregate(const std::vector<float>& hs, const BatchView& bv, int Hq, int H) {
  std::vector<float> gs(size_t(bv.batch_size) * H * bv.max_blocks_per_seq, 999.0f);
  cpu::aggregate_gqa(hs.data(), bv, Hq, H, gs.data());
  expect_aggregate_match(hs, bv, Hq, H, gs.data());
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
  // Full score -> aggregate pipeline, fp32 and quant summaries; the relevant pages of a group must
  // get the group's largest scores (they are aligned with every head of the group).
  for (int G : {1, 4, 8}) {
    CacheSpec sp;
    sp.structured = true;
    sp.num_kv_heads = 2;
    sp.num_q_heads = 2 * G;
    sp.seq_lens = {16 * 9 + 3, 16 * 7};
    sp.seed = 40 + uint64_t(G);
    TestCache t = make_cache(sp);
    for (Precision prec : {Precision::fp32, Precision::quant}) {
      SummaryStore store = build_summaries(t, 8, prec);
      const int M = t.max_blocks(), B = t.bv().batch_size;
      std::vector<float> hs(size_t(B) * sp.num_q_heads * M);
      cpu::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hs.data());
      SCOPED_TRACE(testing::Message() << "G = " << G << " " << precision_name(prec));
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
}

}  // namespace
}  // namespace locks::test

// Property (LOCKS.md): with r = P - 1 and no quantization the summary reconstructs every key
// exactly, so the page score equals the exact log page mass, and the whole selection equals
// the exact-mass oracle's (select_pages on the exact log masses, aggregated the same way).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "locks/reference.h"
#include "test_params.h"
#include "test_util.h"

namespace locks::test {
namespace {

class ExactMass : public testing::TestWithParam<Combo> {};

TEST_P(ExactMass, FullRankScoresEqualExactLogMassAndSelectionEqualsOracle) {
  const Combo c = GetParam();
  const int P = c.page_size, r = P - 1;
  for (bool structured : {false, true}) {
    SCOPED_TRACE(structured ? "structured" : "random");
    CacheSpec sp = spec_for(c, structured, 91);
    sp.seq_lens = {9 * P + 3, 8 * P, 11 * P - 1};
    TestCache t = make_cache(sp);
    SummaryStore store = build_summaries(t, r, Precision::fp32);
    const int B = t.bv().batch_size, Hq = sp.num_q_heads, H = sp.num_kv_heads, M = t.max_blocks();

    std::vector<float> hs(size_t(B) * Hq * M), gs(size_t(B) * H * M);
    cpu::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hs.data());
    const std::vector<double> exact = exact_head_scores(t);
    for (size_t i = 0; i < hs.size(); ++i) {
      if (exact[i] == kNegInf) {
        EXPECT_EQ(hs[i], kNegInfF) << "entry " << i;
      } else {
        // Reconstruction is exact up to float storage (~1e-7 relative), logits are O(10).
        EXPECT_NEAR(hs[i], exact[i], 1e-4) << "entry " << i;
      }
    }

    std::vector<double> oracle_g(gs.size());
    cpu::aggregate_gqa(hs.data(), t.bv(), Hq, H, gs.data());
    ref::aggregate_gqa(exact.data(), t.bv(), Hq, H, oracle_g.data());
    for (const SelectConfig cfg :
         {SelectConfig{2 * P, 0, 0}, SelectConfig{4 * P, 1, 1}, SelectConfig{5 * P + 3, 2, 0}}) {
      SCOPED_TRACE(testing::Message() << "budget " << cfg.budget_tokens);
      const int cap = select_capacity(cfg, P, M);
      SelectionBuf got(B, H, cap), oracle(B, H, cap);
      cpu::select_pages(gs.data(), t.bv(), H, P, cfg, got.sel);
      ref::select_pages(oracle_g.data(), t.bv(), H, P, cfg, oracle.sel);
      // The comparison is meaningful only if the oracle's choice is not a near-tie at the
      // cutoff (scores agree to ~1e-4): check the data has a clear margin.
      const int k = cfg.budget_tokens / P;
      for (int b = 0; b < B; ++b)
        for (int g = 0; g < H; ++g) {
          const int n_full = t.bv().seq_lens[b] / P;
          std::vector<double> cand;
          for (int j = cfg.sink_pages; j < n_full - cfg.recent_pages; ++j)
            cand.push_back(oracle_g[(size_t(b) * H + g) * M + j]);
          std::sort(cand.rbegin(), cand.rend());
          const int free_slots =
              k - cfg.sink_pages - cfg.recent_pages - (t.bv().seq_lens[b] % P != 0);
          if (free_slots > 0 && free_slots < int(cand.size())) {
            ASSERT_GT(cand[size_t(free_slots - 1)] - cand[size_t(free_slots)], 1e-3)
                << "test data has a near-tie at the cutoff (seq " << b << ", head " << g << ")";
          }
        }
      EXPECT_EQ(got.counts, oracle.counts);
      EXPECT_EQ(got.pages, oracle.pages);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SmallPages, ExactMass,
                         testing::Values(Combo{DType::f32, 64, 8}, Combo{DType::f32, 128, 16},
                                         Combo{DType::f16, 64, 16}, Combo{DType::bf16, 128, 8},
                                         Combo{DType::bf16, 64, 32}),
                         combo_name);

}  // namespace
}  // namespace locks::test

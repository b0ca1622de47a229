// The two-level LOCKS selector (src/eval/selector_locks_h2.cpp): its name grammar, the flat
// fallback on short contexts (identical to locks_quant), its recall against flat LOCKS on
// planted single-token needles, and the bytes it reports.
#include <gtest/gtest.h>

#include <cmath>

#include "eval_test_util.h"
#include "locks/error.h"
#include "locks/eval/harness.h"
#include "locks/eval/selector.h"

namespace locks::eval {
namespace {

TEST(LocksH2, NameGrammar) {
  EXPECT_EQ(make_selector("locks_h2", {})->name(), "locks_h2");
  EXPECT_NO_THROW(make_selector("h2-s16-r4-a2.5-m2-f4-g0.5-max-cen-p32", {}));
  EXPECT_THROW(make_selector("h2-zz", {}), InvalidArgument);
  EXPECT_THROW(make_selector("h2-a0.5", {}), InvalidArgument);  // alpha < 1
  EXPECT_THROW(make_selector("h2-s1x", {}), InvalidArgument);
}

TEST(LocksH2, ShortContextFallsBackToFlatLocks) {
  // 24 full pages = fewer than 8 complete groups of 32: every page is scored, as locks_quant.
  auto l = test::noise_layer(16 * 24 + 5, 2, 4, 64, 2);
  const auto& ctx = l.ctx();
  auto flat = make_selector("locks_quant", {});
  auto two = make_selector("locks_h2", {});
  flat->prepare(ctx);
  two->prepare(ctx);
  const SelectConfig cfg{64, 0, 0};
  std::vector<float> a(size_t(ctx.steps) * ctx.q_heads * ctx.num_pages), b(a.size());
  flat->score(ctx, cfg, a.data());
  two->score(ctx, cfg, b.data());
  EXPECT_EQ(a, b);
  EXPECT_DOUBLE_EQ(two->scoring_bytes_at(ctx, cfg), flat->scoring_bytes_per_step(ctx));
}

TEST(LocksH2, NeedlesWithinOneHundredthOfFlatAndFewerBytes) {
  // 16K tokens of needles: 32 complete groups of 32 pages, so level 1 chooses 8 of them at
  // budget 128 (8 page slots). Head_dim 64 and one KV head keep it quick enough for the
  // sanitizer build (measured: flat 0.936, two-level 0.936).
  auto l = test::synth_layer(SynthKind::needles, 16384, 1, 4, 64, 4);
  EvalConfig cfg;
  cfg.budgets = {128};
  cfg.methods = {"locks_quant", "locks_h2"};
  EvalResult r;
  r.methods = cfg.methods;
  eval_layer(l.ctx(), 0, cfg, r);
  aggregate(r);
  ASSERT_EQ(r.table.size(), 2u);
  const Aggregate& flat = r.table[0];
  const Aggregate& two = r.table[1];
  EXPECT_GT(flat.recall_mean, 0.5);  // the needles hold the mass
  EXPECT_GE(two.recall_mean, flat.recall_mean - 0.01);
  EXPECT_LT(two.bytes_per_step, flat.bytes_per_step);
}

TEST(LocksH2, CentroidOnlyLevelOneLosesPlantedKeys) {
#ifdef LOCKS_SANITIZED
  // 16K tokens x 2 KV heads at head_dim 128 through three selectors: ~3 s optimised, ~160 s
  // under ASan; the two-level path is sanitized by the test above.
  GTEST_SKIP() << "a quality property at full size; runs in the optimised build";
#endif
  // The losing design, kept as a variant: single planted keys diluted in their page's
  // centroid, which a centroid-only level 1 misses (measured: recall 0.004 against 0.93);
  // the extent keeps them.
  auto l = test::synth_layer(SynthKind::needles, 16384, 2, 8, 128, 4);
  EvalConfig cfg;
  cfg.budgets = {128};
  cfg.methods = {"locks_quant", "locks_h2", "h2-cen"};
  EvalResult r;
  r.methods = cfg.methods;
  eval_layer(l.ctx(), 0, cfg, r);
  aggregate(r);
  ASSERT_EQ(r.table.size(), 3u);
  const Aggregate& flat = r.table[0];
  const Aggregate& two = r.table[1];
  const Aggregate& centroid_only = r.table[2];
  EXPECT_GT(flat.recall_mean, 0.5);
  EXPECT_GE(two.recall_mean, flat.recall_mean - 0.01);
  EXPECT_LT(centroid_only.recall_mean, 0.5 * flat.recall_mean);
}

}  // namespace
}  // namespace locks::eval

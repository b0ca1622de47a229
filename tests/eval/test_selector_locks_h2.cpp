// The two-level LOCKS selector (src/eval/selector_locks_h2.cpp): its name grammar, the flat
// fallback on short contexts (identical to locks_quant), its recall against flat LOCKS on
// planted single-token needles, and the bytes it reports.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

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

// 16K tokens of needles (32 complete groups of 32 pages; budget 128 = 8 page slots, so level
// 1 keeps 8 groups under min_groups 4: "-m4", as the default floor of 32 would score all
// pages) through `methods`: one Aggregate per method, in order.
std::vector<Aggregate> needles_16k(int kv_heads, int q_heads, int head_dim,
                                   std::vector<std::string> methods) {
  auto l = test::synth_layer(SynthKind::needles, 16384, kv_heads, q_heads, head_dim, 4);
  EvalConfig cfg;
  cfg.budgets = {128};
  cfg.methods = methods;
  EvalResult r;
  r.methods = methods;
  eval_layer(l.ctx(), 0, cfg, r);
  aggregate(r);
  return r.table;
}

TEST(LocksH2, NeedlesWithinOneHundredthOfFlatAndFewerBytes) {
  // Head_dim 64 and one KV head keep it quick enough for the sanitizer build (measured: flat
  // 0.936, two-level 0.936).
  const auto t = needles_16k(1, 4, 64, {"locks_quant", "h2-m4"});
  ASSERT_EQ(t.size(), 2u);
  EXPECT_GT(t[0].recall_mean, 0.5);  // the needles hold the mass
  EXPECT_GE(t[1].recall_mean, t[0].recall_mean - 0.01);
  EXPECT_LT(t[1].bytes_per_step, t[0].bytes_per_step);
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
  const auto t = needles_16k(2, 8, 128, {"locks_quant", "h2-m4", "h2-cen-m4"});
  ASSERT_EQ(t.size(), 3u);
  EXPECT_GT(t[0].recall_mean, 0.5);
  EXPECT_GE(t[1].recall_mean, t[0].recall_mean - 0.01);
  EXPECT_LT(t[2].recall_mean, 0.5 * t[0].recall_mean);
}

}  // namespace
}  // namespace locks::eval

// Invariants of the common selection path: the oracle dominates, b >= context is FullKV,
// the GQA rules and the selection agree with the float64 reference, percentiles.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "eval_test_util.h"
#include "locks/attention.h"
#include "locks/error.h"
#include "locks/eval/harness.h"
#include "locks/reference.h"

namespace locks::eval {
namespace {

using test::noise_layer;
using test::synth_layer;

// Mean recall over the query heads of KV group g at step s: the quantity share-averaging
// maximises.
double group_recall(const LayerContext& ctx, const MethodRun& r, int s, int g) {
  double acc = 0;
  for (int i = 0; i < ctx.group(); ++i)
    acc += r.recall[size_t(s) * ctx.q_heads + g * ctx.group() + i];
  return acc / ctx.group();
}

class OracleDominates : public ::testing::TestWithParam<SynthKind> {};

TEST_P(OracleDominates, OnEveryQueryAndBudget) {
  auto l = synth_layer(GetParam(), 16 * 64 + 7, 2, 4, 64, 2);
  const auto& ctx = l.ctx();
  std::vector<std::unique_ptr<PageSelector>> sels;
  for (const auto& name : selector_names()) {
    sels.push_back(make_selector(name, {}));
    sels.back()->prepare(ctx);
  }
  for (int recent : {0, 1}) {
    for (int b : {64, 256, 512}) {
      SelectConfig cfg;
      cfg.budget_tokens = b;
      cfg.sink_pages = recent;
      cfg.recent_pages = recent;
      MethodRun o = run_selector(*sels[1], ctx, cfg);  // selector_names()[1] is the oracle
      for (auto& sel : sels) {
        const std::string name = sel->name();
        MethodRun r = run_selector(*sel, ctx, cfg);
        for (int s = 0; s < ctx.steps; ++s)
          for (int g = 0; g < ctx.kv_heads; ++g) {
            if (name == "full") {
              EXPECT_NEAR(group_recall(ctx, r, s, g), 1.0, 1e-9);
              continue;
            }
            EXPECT_GE(group_recall(ctx, o, s, g) + 1e-6, group_recall(ctx, r, s, g))
                << name << " b=" << b << " step " << s << " group " << g;
            EXPECT_LE(attended_tokens(ctx, r.sel, s, g), b) << name << " over budget";
          }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OracleDominates,
                         ::testing::Values(SynthKind::gaussian, SynthKind::local_lowrank,
                                           SynthKind::blind_spot, SynthKind::needles),
                         [](const auto& info) { return std::string(synth_name(info.param)); });

TEST(Harness, OracleDominatesEachHeadWithoutGqa) {
  auto l = noise_layer(16 * 100, 2, 2, 32, 3);
  const auto& ctx = l.ctx();
  SelectConfig cfg;
  cfg.budget_tokens = 160;
  auto oracle = make_selector("oracle", {});
  oracle->prepare(ctx);
  MethodRun o = run_selector(*oracle, ctx, cfg);
  for (const auto& name : selector_names()) {
    if (name == "full") continue;  // not bound by the budget
    auto sel = make_selector(name, {});
    sel->prepare(ctx);
    MethodRun r = run_selector(*sel, ctx, cfg);
    for (size_t i = 0; i < r.recall.size(); ++i) EXPECT_GE(o.recall[i] + 1e-6, r.recall[i]) << name;
  }
}

TEST(Harness, BudgetCoveringContextIsFullKv) {
  auto l = synth_layer(SynthKind::local_lowrank, 16 * 40 + 3, 2, 4, 64, 2);
  const auto& ctx = l.ctx();
  std::vector<float> dense(size_t(ctx.steps) * ctx.q_heads * ctx.head_dim);
  cpu::decode_attention_dense(ctx.cache, ctx.batch, ctx.q, ctx.scale, {dense.data(), nullptr});
  for (const auto& name : selector_names()) {
    auto sel = make_selector(name, {});
    sel->prepare(ctx);
    for (int b : {int(ctx.tokens), int(ctx.tokens) + 1, 4096}) {
      SelectConfig cfg;
      cfg.budget_tokens = b;
      MethodRun r = run_selector(*sel, ctx, cfg);
      for (double rec : r.recall) EXPECT_NEAR(rec, 1.0, 1e-12) << name;
      EXPECT_EQ(0, std::memcmp(r.out.data(), dense.data(), dense.size() * sizeof(float)))
          << name << " at b=" << b << " differs from FullKV";
      for (int s = 0; s < ctx.steps; ++s)
        for (int g = 0; g < ctx.kv_heads; ++g)
          EXPECT_EQ(attended_tokens(ctx, r.sel, s, g), ctx.tokens);
    }
  }
}

TEST(Harness, FullKvIgnoresTheBudget) {
  auto l = noise_layer(16 * 30, 1, 2, 32, 1);
  auto sel = make_selector("full", {});
  sel->prepare(l.ctx());
  SelectConfig cfg;
  cfg.budget_tokens = 64;
  MethodRun r = run_selector(*sel, l.ctx(), cfg);
  EXPECT_EQ(attended_tokens(l.ctx(), r.sel, 0, 0), 16 * 30);
}

TEST(Harness, SelectionMatchesReferencePath) {
  // Selector scores -> float64 reference aggregation and selection must pick the same pages
  // as the harness's path (share-averaging selectors).
  auto l = noise_layer(16 * 50 + 9, 2, 4, 32, 2);
  const auto& ctx = l.ctx();
  for (const char* name : {"quest", "rocket", "oracle", "locks_fp32"}) {
    auto sel = make_selector(name, {});
    sel->prepare(ctx);
    SelectConfig cfg;
    cfg.budget_tokens = 128;
    cfg.recent_pages = 1;
    MethodRun r = run_selector(*sel, ctx, cfg);
    std::vector<double> hs(r.head_scores.begin(), r.head_scores.end());
    std::vector<double> gs(size_t(ctx.steps) * ctx.kv_heads * ctx.num_pages);
    ref::aggregate_gqa(hs.data(), ctx.batch, ctx.q_heads, ctx.kv_heads, gs.data());
    std::vector<int32_t> pages(r.pages.size(), -1), counts(r.counts.size(), 0);
    Selection want{pages.data(), counts.data(), r.sel.capacity};
    ref::select_pages(gs.data(), ctx.batch, ctx.kv_heads, ctx.page_size, cfg, want);
    EXPECT_EQ(counts, r.counts) << name;
    EXPECT_EQ(pages, r.pages) << name;
  }
}

TEST(Harness, MaxShareRuleIsGroupMaxOfNormalisedShares) {
  auto l = noise_layer(16 * 20, 2, 6, 32, 2);
  const auto& ctx = l.ctx();
  const int n = ctx.num_pages;
  std::vector<float> hs(size_t(ctx.steps) * ctx.q_heads * n);
  for (size_t i = 0; i < hs.size(); ++i) hs[i] = float(std::sin(double(i)) * 3);
  std::vector<float> gs(size_t(ctx.steps) * ctx.kv_heads * n);
  aggregate_group_scores(GqaRule::max_share, ctx, hs.data(), gs.data());
  for (int s = 0; s < ctx.steps; ++s)
    for (int g = 0; g < ctx.kv_heads; ++g)
      for (int j = 0; j < n; ++j) {
        double best = -1;
        for (int i = 0; i < 3; ++i) {
          const float* row = hs.data() + (size_t(s) * ctx.q_heads + g * 3 + i) * n;
          double z = 0;
          for (int t = 0; t < n; ++t) z += std::exp(double(row[t]));
          best = std::max(best, std::exp(double(row[j])) / z);
        }
        EXPECT_NEAR(gs[(size_t(s) * ctx.kv_heads + g) * n + j], std::log(best), 1e-5);
      }
}

TEST(Harness, ShadowKvOutliersAndSnapKvEvictionStayInBudget) {
  auto l = synth_layer(SynthKind::needles, 16 * 300, 2, 4, 64, 2);
  const auto& ctx = l.ctx();
  for (const char* name : {"shadowkv", "rocket_snapkv"}) {
    auto sel = make_selector(name, {});
    std::string why;
    ASSERT_TRUE(sel->available(ctx, &why)) << why;
    sel->prepare(ctx);
    for (int b : {64, 256, 1024}) {
      SelectConfig cfg;
      cfg.budget_tokens = b;
      MethodRun r = run_selector(*sel, ctx, cfg);
      for (int s = 0; s < ctx.steps; ++s)
        for (int g = 0; g < ctx.kv_heads; ++g) {
          EXPECT_EQ(attended_tokens(ctx, r.sel, s, g), b) << name;
        }
    }
  }
}

TEST(Harness, SnapKvNeedsObservationWindow) {
  auto l = synth_layer(SynthKind::gaussian, 16 * 10, 1, 1, 32, 1, /*obs=*/0);
  std::string why;
  EXPECT_FALSE(make_selector("rocket_snapkv", {})->available(l.ctx(), &why));
  EXPECT_NE(why.find("qobs"), std::string::npos);
}

TEST(Harness, Percentile) {
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2, 4, 5}, 0), 1);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2, 4, 5}, 100), 5);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2, 4, 5}, 50), 3);
  EXPECT_DOUBLE_EQ(percentile({1, 2}, 5), 1.05);  // numpy: 1 + 0.05 * (2 - 1)
  EXPECT_THROW(percentile({}, 5), Error);
}

TEST(Harness, BudgetTooSmallForSinkAndRecentIsAnError) {
  auto l = noise_layer(16 * 30, 1, 1, 32, 1);
  auto sel = make_selector("quest", {});
  sel->prepare(l.ctx());
  SelectConfig cfg;
  cfg.budget_tokens = 32;  // 2 slots: tail + sink + recent needs 3
  cfg.sink_pages = 1;
  cfg.recent_pages = 1;
  EXPECT_THROW(run_selector(*sel, l.ctx(), cfg), Error);
}

}  // namespace
}  // namespace locks::eval

// The lx-* LOCKS variants (src/eval/selector_locks_variant.cpp) against the library and the
// float64 reference: the default spelling is the shipped int4 layout, the all-fp32 spelling
// the fp32 one, full rank is exact in any metric, and the byte counts follow the layouts.
#include <gtest/gtest.h>

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
constexpr int kKv = 2, kQ = 4, kD = 64, kSteps = 2;

std::vector<float> scores_of(PageSelector& s, const LayerContext& ctx) {
  s.prepare(ctx);
  std::vector<float> out(size_t(ctx.steps) * ctx.q_heads * ctx.num_pages);
  s.score(ctx, SelectConfig{}, out.data());
  return out;
}

// Largest |a - b| / max(1, |b|) over the full pages; both -inf on the tail page.
double max_rel_diff(const LayerContext& ctx, const std::vector<float>& a,
                    const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int j = int(i % ctx.num_pages);
    if (j >= ctx.num_full_pages) {
      EXPECT_TRUE(std::isinf(a[i]) && a[i] < 0 && std::isinf(b[i]) && b[i] < 0);
      continue;
    }
    worst =
        std::max(worst, std::fabs(double(a[i]) - b[i]) / std::max(1.0, std::fabs(double(b[i]))));
  }
  return worst;
}

TEST(LocksVariant, DefaultSpellingIsTheShippedInt4Layout) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  auto want = scores_of(*make_selector("locks_quant", {}), ctx);
  auto got = scores_of(*make_selector("lx", {}), ctx);
  // Same codes and scales (both round half to even on float / double inputs that agree to
  // float precision); the tolerance covers a code that flips on a rounding tie.
  EXPECT_LT(max_rel_diff(ctx, got, want), 2e-3);
  EXPECT_DOUBLE_EQ(make_selector("lx", {})->metadata_bytes_per_page(ctx),
                   make_selector("locks_quant", {})->metadata_bytes_per_page(ctx));
}

TEST(LocksVariant, AllFp32SpellingIsLocksFp32) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  auto want = scores_of(*make_selector("locks_fp32", {}), ctx);
  auto got = scores_of(*make_selector("lx-b32-c32-m32", {}), ctx);
  EXPECT_LT(max_rel_diff(ctx, got, want), 1e-4);
}

TEST(LocksVariant, FullRankIsExactMassInEitherMetric) {
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  for (const char* name :
       {"lx-r15-b32-c32-m32", "lx-r15-b32-c32-m32-wq", "lx-r15-b32-c32-m32-wqf"}) {
    auto got = scores_of(*make_selector(name, {}), ctx);
    for (int s = 0; s < ctx.steps; ++s)
      for (int h = 0; h < ctx.q_heads; ++h)
        for (int j = 0; j < ctx.num_full_pages; ++j) {
          const double w =
              ref::exact_log_mass(ctx.cache, j, h / ctx.group(), 16, ctx.query(s, h), ctx.scale);
          ASSERT_NEAR(got[(size_t(s) * ctx.q_heads + h) * ctx.num_pages + j], w,
                      1e-4 * std::max(1.0, std::fabs(w)))
              << name << " step " << s << " head " << h << " page " << j;
        }
  }
}

TEST(LocksVariant, GroupScalesAreNoWorseThanRowScales) {
  // Finer scales can only shrink each element's rounding error bound; on average the score
  // error to fp32 does not grow.
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  auto ref32 = scores_of(*make_selector("lx-b32-c32-m32", {}), ctx);
  auto mean_err = [&](const char* name) {
    auto g = scores_of(*make_selector(name, {}), ctx);
    double e = 0;
    int n = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (int(i % ctx.num_pages) < ctx.num_full_pages) e += std::fabs(double(g[i]) - ref32[i]), ++n;
    return e / n;
  };
  EXPECT_LE(mean_err("lx-b4g16-c32-m32"), mean_err("lx-c32-m32"));
}

TEST(LocksVariant, MetadataBytesFollowTheLayouts) {
  auto l = noise_layer(16 * 8, 1, 1, 256, 1);
  const auto& ctx = l.ctx();
  auto bytes = [&](const char* n) { return make_selector(n, {})->metadata_bytes_per_page(ctx); };
  // d 256, r 8, P 16: mu 256 + 4, basis 8 * 128 + 8 * 4, coeff 128 + 8 * 4.
  EXPECT_DOUBLE_EQ(bytes("lx"), 1476.0);
  EXPECT_DOUBLE_EQ(bytes("lx-b4g32"), 1476.0 - 32 + 8 * 8 * 4);
  EXPECT_DOUBLE_EQ(bytes("lx-b4g32-fp16s"), 258.0 + 1024 + 8 * 8 * 2 + 128 + 16);
  EXPECT_DOUBLE_EQ(bytes("lx-r10"), 260.0 + 10 * 128 + 40 + 160 + 40);
  EXPECT_DOUBLE_EQ(bytes("lx-b32-c32-m32"), 4.0 * (256 + 8 * 256 + 16 * 8));
}

TEST(LocksVariant, AdaptiveBudgetKeepsTheFewestPagesCoveringTau) {
  auto l = noise_layer(16 * 64 + 5, kKv, kQ, kD, kSteps);
  const auto& ctx = l.ctx();
  SelectConfig cfg;
  cfg.budget_tokens = 16 * 32;  // ceiling: 32 slots of 65 pages
  auto fixed_sel = make_selector("lx", {});
  fixed_sel->prepare(ctx);
  MethodRun fixed = run_selector(*fixed_sel, ctx, cfg);
  for (const char* name : {"lx-tau50-fl2", "lx-tau90-fl2"}) {
    const double tau = name[6] == '5' ? 0.5 : 0.9;
    auto sel = make_selector(name, {});
    sel->prepare(ctx);
    MethodRun run = run_selector(*sel, ctx, cfg);
    for (int64_t row = 0; row < int64_t(ctx.steps) * ctx.kv_heads; ++row) {
      const int32_t* p = run.sel.pages + row * run.sel.capacity;
      const int c = run.sel.counts[row];
      ASSERT_LE(c, fixed.sel.counts[row]);
      EXPECT_TRUE(std::is_sorted(p, p + c));
      EXPECT_EQ(p[c - 1], ctx.num_pages - 1) << "the tail page is always attended";
      const float* s = run.group_scores.data() + row * ctx.num_pages;
      double total = 0, kept = 0, smallest = 1e300;
      for (int j = 0; j < ctx.num_full_pages; ++j) total += std::exp(double(s[j]));
      for (int i = 0; i < c - 1; ++i) {
        kept += std::exp(double(s[p[i]]));
        smallest = std::min(smallest, std::exp(double(s[p[i]])));
      }
      EXPECT_GE(c - 1, 2) << "floor";
      if (c < fixed.sel.counts[row] && c - 1 > 2) {
        EXPECT_GE(kept, tau * total * (1 - 1e-9));             // covers tau ...
        EXPECT_LT(kept - smallest, tau * total * (1 + 1e-9));  // ... and one page fewer does not
      }
    }
  }
}

TEST(LocksVariant, BadNamesAndMissingInputsAreReported) {
  EXPECT_THROW(make_selector("lx-zz", {}), Error);
  EXPECT_THROW(make_selector("lx-rx", {}), Error);
  auto l = noise_layer(kTokens, kKv, kQ, kD, kSteps);
  std::string why;
  EXPECT_FALSE(make_selector("lx-r16", {})->available(l.ctx(), &why));
  EXPECT_NE(why.find("rank"), std::string::npos);
  EXPECT_FALSE(make_selector("lx-b4g48", {})->available(l.ctx(), &why));
}

}  // namespace
}  // namespace locks::eval

// cpu::select_pages against ref::select_pages (exact: both see the same score values, so the
// selected sets, counts and -1 padding must be identical), plus the contract's properties:
// tail always attended, sink and recent pages selected, ties to the lower index, b >= context
// selects everything, ascending output.
//
// Merged from the former test_impl_select.cpp:
// cpu::select_pages on hand-made scores: tail, sink, recent, top-k, ties, full budget.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/reference.h"
#include "locks/score.h"
#include "locks/select.h"
#include "test_util.h"

namespace locks::test {
namespace {

struct Case {
  std::vector<int32_t> lens;
  int page_size;
  SelectConfig cfg;
};

// Integer-valued random scores (many exact ties), -inf for tail pages and beyond.
std::vector<float> tied_scores(Rng& rng, const std::vector<int32_t>& lens, int H, int M, int P) {
  std::vector<float> s(lens.size() * H * M, kNegInfF);
  for (size_t b = 0; b < lens.size(); ++b)
    for (int g = 0; g < H; ++g)
      for (int j = 0; j < lens[b] / P; ++j) s[(b * H + g) * M + j] = float(rng.integer(-3, 3));
  return s;
}

void check_against_ref(const std::vector<float>& gs, const BatchView& bv, int H, int P,
                       const SelectConfig& cfg) {
  const int cap = select_capacity(cfg, P, bv.max_blocks_per_seq);
  SelectionBuf c(bv.batch_size, H, cap), r(bv.batch_size, H, cap);
  const std::vector<double> gd(gs.begin(), gs.end());
  cpu::select_pages(gs.data(), bv, H, P, cfg, c.sel);
  ref::select_pages(gd.data(), bv, H, P, cfg, r.sel);  // throws if cap is too small
  EXPECT_EQ(c.counts, r.counts);
  EXPECT_EQ(c.pages, r.pages);  // including the -1 padding

  for (int b = 0; b < bv.batch_size; ++b) {
    const int32_t len = bv.seq_lens[b];
    const int n_pages = int(pages_of(len, P)), n_full = len / P, k = cfg.budget_tokens / P;
    for (int g = 0; g < H; ++g) {
      const std::vector<int32_t> sel = c.of(b, g, H);
      SCOPED_TRACE(testing::Message() << "seq " << b << " (len " << len << ") head " << g);
      EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
      EXPECT_TRUE(std::adjacent_find(sel.begin(), sel.end()) == sel.end());
      auto has = [&](int j) { return std::find(sel.begin(), sel.end(), j) != sel.end(); };
      if (cfg.budget_tokens >= len) {
        EXPECT_EQ(int(sel.size()), n_pages);  // everything: exact full attention
        continue;
      }
      EXPECT_EQ(int(sel.size()), k);
      if (n_full < n_pages) {
        EXPECT_TRUE(has(n_full)) << "tail page not attended";
      }
      for (int j = 0; j < cfg.sink_pages; ++j) EXPECT_TRUE(has(j)) << "sink page " << j;
      for (int j = n_full - cfg.recent_pages; j < n_full; ++j)
        EXPECT_TRUE(has(j)) << "recent page " << j;
    }
  }
}

TEST(SelectPages, MatchesReferenceWithTiesRaggedBatchesAndAllRules) {
  Rng rng(51);
  const std::vector<Case> cases{
      {{37, 64, 5, 100, 16}, 16, {48, 0, 0}},  // b a multiple of P; 16 and 5 fit entirely
      {{37, 64, 5, 100, 16}, 16, {40, 0, 0}},  // b not a multiple of P: floor(b / P) = 2
      {{37, 64, 5, 100, 16}, 16, {64, 1, 1}},  // b == 64 == a sequence length: all of it
      {{37, 64, 5, 100, 16}, 16, {80, 2, 1}},  // sink 2, recent 1, tail
      {{200, 131, 9}, 8, {72, 1, 3}},          // P = 8
      {{200, 131, 96}, 32, {96, 0, 2}},        // P = 32, b == len for the last
      {{300, 257}, 16, {10000, 1, 1}},         // b covers every sequence
  };
  for (const Case& cs : cases) {
    const int P = cs.page_size;
    int M = 0;
    for (int32_t len : cs.lens) M = std::max<int>(M, int(pages_of(len, P)));
    M += 1;  // a spare column: entries beyond a sequence must be ignored
    std::vector<int32_t> table(cs.lens.size() * M, 0);
    const BatchView bv{table.data(), M, cs.lens.data(), int(cs.lens.size()), M};
    for (int H : {1, 3}) {
      SCOPED_TRACE(testing::Message()
                   << "P " << P << " budget " << cs.cfg.budget_tokens << " sink "
                   << cs.cfg.sink_pages << " recent " << cs.cfg.recent_pages << " H " << H);
      check_against_ref(tied_scores(rng, cs.lens, H, M, P), bv, H, P, cs.cfg);
    }
  }
}

TEST(SelectPages, TiesGoToTheLowerIndex) {
  const int P = 4, M = 6;
  const int32_t len = 24;  // 6 full pages, no tail
  std::vector<int32_t> table(M, 0);
  const BatchView bv{table.data(), M, &len, 1, M};
  const std::vector<float> s{1, 2, 2, 2, 0, 2};
  SelectionBuf out(1, 1, select_capacity({12, 0, 0}, P, M));
  cpu::select_pages(s.data(), bv, 1, P, {12, 0, 0}, out.sel);  // k = 3
  EXPECT_EQ(out.of(0, 0, 1), (std::vector<int32_t>{1, 2, 3}));
}

TEST(SelectPages, SelectionFromScoresIsOptimalUpToScoreTolerance) {
  // End to end: CPU scores -> aggregate -> select. Near-ties may legitimately resolve
  // differently from the reference, so check optimality under the reference scores: no
  // unselected candidate beats a selected (non-forced) page by more than the score tolerance.
  CacheSpec sp;
  sp.structured = true;
  sp.num_q_heads = 8;
  sp.seq_lens = {16 * 12 + 7, 16 * 10, 16 * 3 + 1};
  TestCache t = make_cache(sp);
  SummaryStore store = build_summaries(t, 8, Precision::fp32);
  const int B = 3, H = 2, Hq = 8, M = t.max_blocks(), P = 16;
  std::vector<float> hs(size_t(B) * Hq * M), gs(size_t(B) * H * M);
  std::vector<double> hr(hs.size()), gr(gs.size());
  cpu::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hs.data());
  cpu::aggregate_gqa(hs.data(), t.bv(), Hq, H, gs.data());
  ref::score_pages(store.view(), t.bv(), t.qv(), t.scale(), hr.data());
  ref::aggregate_gqa(hr.data(), t.bv(), Hq, H, gr.data());
  const SelectConfig cfg{64, 1, 1};
  SelectionBuf c(B, H, select_capacity(cfg, P, M));
  cpu::select_pages(gs.data(), t.bv(), H, P, cfg, c.sel);
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < H; ++g) {
      const int n_full = t.bv().seq_lens[b] / P;
      const std::vector<int32_t> sel = c.of(b, g, H);
      const double* row = gr.data() + (size_t(b) * H + g) * M;
      double worst_in = 1e300, best_out = -1e300;
      for (int j = cfg.sink_pages; j < n_full - cfg.recent_pages; ++j) {
        const bool in = std::find(sel.begin(), sel.end(), j) != sel.end();
        if (in) {
          worst_in = std::min(worst_in, row[j]);
        } else {
          best_out = std::max(best_out, row[j]);
        }
      }
      EXPECT_GE(worst_in, best_out - 1e-4) << "seq " << b << " head " << g;
    }
}

}  // namespace
}  // namespace locks::test

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Run {
  std::vector<int32_t> pages, counts;
  std::vector<int> got(int row) const {
    return {pages.begin() + row * cap, pages.begin() + row * cap + counts[size_t(row)]};
  }
  int cap = 0;
};

Run select(const std::vector<float>& scores, std::vector<int32_t> lens, int heads, int M, int P,
           locks::SelectConfig cfg) {
  Run r;
  r.cap = locks::select_capacity(cfg, P, M);
  r.pages.assign(lens.size() * heads * r.cap, 7);
  r.counts.assign(lens.size() * heads, 0);
  locks::BatchView bv;
  bv.seq_lens = lens.data();
  bv.batch_size = static_cast<int>(lens.size());
  bv.max_blocks_per_seq = M;
  locks::cpu::select_pages(scores.data(), bv, heads, P, cfg,
                           {r.pages.data(), r.counts.data(), r.cap});
  return r;
}

TEST(ImplSelect, TailSinkRecentThenTopScoresWithTies) {
  const int P = 4, M = 10;
  // 9 full pages + a tail of 2 tokens = 38 tokens; budget 5 pages.
  std::vector<float> s = {9, 1, 5, 3, 5, 2, 8, 0, 4, kNegInf};
  locks::SelectConfig cfg{20, 1, 1};
  auto r = select(s, {38}, 1, M, P, cfg);
  // tail 9, sink 0, recent 8, then the two best of {1..7}: 6 (8), then 2 and 4 tie at 5 -> 2.
  EXPECT_EQ(r.got(0), (std::vector<int>{0, 2, 6, 8, 9}));
  EXPECT_EQ(r.cap, 5);
  // No sink/recent: top 4 of the full pages + tail.
  r = select(s, {38}, 1, M, P, {20, 0, 0});
  EXPECT_EQ(r.got(0), (std::vector<int>{0, 2, 4, 6, 9}));
}

TEST(ImplSelect, FullBudgetSelectsEveryPageAndPads) {
  const int P = 4, M = 4;
  std::vector<float> s = {1, 2, 3, kNegInf, /*seq 1*/ 0, kNegInf, kNegInf, kNegInf};
  auto r = select(s, {14, 5}, 1, M, P, {14, 0, 0});  // b = 14 covers seq 0 (14 tokens)
  EXPECT_EQ(r.cap, 4);                               // ceil(14 / 4)
  EXPECT_EQ(r.got(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.got(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(r.pages[size_t(r.cap + 2)], -1);
  EXPECT_EQ(r.pages[size_t(r.cap + 3)], -1);
}

TEST(ImplSelect, PerKvHeadAndNoTailWhenPagesAreFull) {
  const int P = 2, M = 4;
  std::vector<float> s = {0, 5, 1, 2, /*head 1*/ 3, 0, 0, 9};
  auto r = select(s, {8}, 2, M, P, {4, 0, 0});  // 2 pages, no tail: the two best
  EXPECT_EQ(r.got(0), (std::vector<int>{1, 3}));
  EXPECT_EQ(r.got(1), (std::vector<int>{0, 3}));
}

TEST(ImplSelect, RejectsTooSmallBudgetAndNaN) {
  EXPECT_THROW(locks::validate_select({15, 0, 0}, 16), locks::Error);
  EXPECT_THROW(locks::validate_select({32, 1, 1}, 16), locks::Error);
  EXPECT_NO_THROW(locks::validate_select({48, 1, 1}, 16));
  EXPECT_THROW(locks::validate_select({48, -1, 0}, 16), locks::Error);
  std::vector<float> s = {1, std::nanf(""), 0};
  EXPECT_THROW(select(s, {12}, 1, 3, 4, {4, 0, 0}), locks::Error);
}

TEST(ImplSelect, RejectsBadAdaptiveBudgets) {
  using locks::SelectConfig;
  using locks::validate_select;
  // 64 tokens of 16 = 4 pages: sink 1 + recent 1 + tail leave 1 scored slot.
  for (const float tau : {std::nanf(""), -0.5f, -0.0f + -1e-30f, 1.0001f, 2.0f,
                          std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(testing::Message() << "tau " << tau);
    EXPECT_THROW(validate_select(SelectConfig{64, 1, 1, tau, 1}, 16), locks::InvalidArgument);
  }
  EXPECT_THROW(validate_select(SelectConfig{64, 1, 1, 0.5f, -1}, 16), locks::InvalidArgument);
  EXPECT_THROW(validate_select(SelectConfig{64, 1, 1, 0.0f, -1}, 16), locks::InvalidArgument);
  EXPECT_THROW(validate_select(SelectConfig{64, 1, 1, 0.5f, 2}, 16), locks::InvalidArgument)
      << "a floor above the ceiling";
  EXPECT_NO_THROW(validate_select(SelectConfig{64, 1, 1, 0.5f, 1}, 16));
  EXPECT_NO_THROW(validate_select(SelectConfig{64, 1, 1, 1.0f, 0}, 16));
  // tau = 0 leaves the floor unused: the default floor 1 with no scored slot is fine.
  EXPECT_NO_THROW(validate_select(SelectConfig{48, 1, 1}, 16));
  try {
    validate_select(SelectConfig{64, 0, 0, 1.5f, 1}, 16);
    ADD_FAILURE() << "no error";
  } catch (const locks::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("tau"), std::string::npos) << e.what();
  }
}

TEST(ImplAggregate, ShareAveragingByHand) {
  // One KV head, two query heads, three pages (last is the tail: -inf).
  const float l2 = std::log(2.0f);
  std::vector<float> hs = {0.0f, l2, kNegInf, /*head 1*/ 5.0f, 5.0f, kNegInf};
  std::vector<float> out(3);
  std::vector<int32_t> lens = {10};
  locks::BatchView bv;
  bv.seq_lens = lens.data();
  bv.batch_size = 1;
  bv.max_blocks_per_seq = 3;
  locks::cpu::aggregate_gqa(hs.data(), bv, 2, 1, out.data());
  // Shares: head 0 (1/3, 2/3), head 1 (1/2, 1/2) -> means 5/12, 7/12.
  EXPECT_NEAR(out[0], std::log(5.0f / 12.0f), 1e-6);
  EXPECT_NEAR(out[1], std::log(7.0f / 12.0f), 1e-6);
  EXPECT_EQ(out[2], kNegInf);
  hs[1] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(locks::cpu::aggregate_gqa(hs.data(), bv, 2, 1, out.data()), locks::Error);
}

}  // namespace

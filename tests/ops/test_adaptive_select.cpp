// The adaptive budget (select.h, tau > 0) of the backend of this binary (tests/ops: CPU;
// tests/cuda: CUDA) against the float64 reference, on hand-made group scores: random,
// a few hot pages over a flat floor, ties, -inf pages and an all -inf row; sequences that
// fit one selection chunk and ones that need two (the CUDA two-stage path). Plus the
// graph-safety shape: one plan, one workspace, one output buffer, counts that vary with the
// data while the capacity stays the budget's.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "backend.h"
#include "locks/reference.h"
#include "locks/rules.h"
#include "select_rows.h"
#include "test_util.h"

namespace locks::test {
namespace {

// The backend sums masses in float (CUDA) or double in another order than the reference, so
// a page whose mass lands within rounding of tau * total may go either way. Accepted: the
// reference's selection at some tau' within a relative kTauTol of tau. float32 sums of up to
// 4096 masses in a tree plus expf's 2 ulp stay below 1e-5 relative; 1e-4 leaves room.
constexpr double kTauTol = 1e-4;

// Every row: ascending, -1 padded, and the reference's selection for a tau' in
// [tau (1 - kTauTol), tau (1 + kTauTol)]: the pages of the reference at the low end, then a
// best-first prefix of those the high end adds. The CPU sums as the reference does (same
// doubles, same order): exactly the reference's selection at tau.
void expect_matches(Backend kind, const Rows& rows, const SelectConfig& sc, const SelRun& got) {
  const int cap = got.capacity;
  const SelectionBuf at = reference(rows, sc, sc.tau, cap);
  const SelectionBuf lo = reference(rows, sc, sc.tau * (1 - kTauTol), cap);
  const SelectionBuf hi = reference(rows, sc, std::min(1.0, sc.tau * (1 + kTauTol)), cap);
  for (int b = 0; b < rows.B; ++b)
    for (int g = 0; g < rows.H; ++g) {
      const int64_t row = int64_t(b) * rows.H + g;
      SCOPED_TRACE(testing::Message() << "sequence " << b << " head " << g);
      const int n = got.counts[size_t(row)];
      ASSERT_TRUE(n >= 0 && n <= cap) << "count " << n;
      const auto first = got.pages.begin() + row * cap;
      const std::vector<int32_t> sel(first, first + n);
      EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
      EXPECT_TRUE(std::all_of(first + n, first + cap, [](int32_t p) { return p == -1; }));
      if (kind == Backend::cpu) {
        EXPECT_EQ(sel, at.of(b, g, rows.H));
        continue;
      }
      const std::vector<int32_t> l = lo.of(b, g, rows.H), u = hi.of(b, g, rows.H);
      EXPECT_TRUE(std::includes(sel.begin(), sel.end(), l.begin(), l.end())) << "misses a page";
      EXPECT_TRUE(std::includes(u.begin(), u.end(), sel.begin(), sel.end())) << "extra page";
      const float* s = &rows.scores[size_t(row) * rows.M];
      const std::set<int32_t> in(sel.begin(), sel.end()), base(l.begin(), l.end());
      for (int32_t x : sel)
        for (int32_t y : u)
          if (!base.count(x) && !in.count(y))
            EXPECT_TRUE(s[x] > s[y] || (s[x] == s[y] && x < y))
                << "page " << x << " kept over the better page " << y;
    }
}

using AdaptiveSelect = SelectOnBackend;

TEST_F(AdaptiveSelect, MatchesReferenceOnHandMadeScores) {
  int rows_checked = 0, trimmed = 0;
  for (const int M : {300, 2200})  // 2200 pages: two selection chunks on CUDA
    for (const Kind kind : {Kind::random, Kind::hot, Kind::ties, Kind::neg_inf}) {
      const Rows rows(M, kind, 11 + M + int(kind));
      for (const SelectConfig base : {SelectConfig{64 * 16 + 3, 0, 0}, SelectConfig{64 * 16, 1, 2}})
        for (const float tau : {0.5f, 0.9f, 0.99f, 1.0f})
          for (const int floor_pages : {0, 1, 4}) {
            SelectConfig sc = base;
            sc.tau = tau;
            sc.floor_pages = floor_pages;
            SCOPED_TRACE(testing::Message()
                         << "M " << M << " kind " << int(kind) << " sink " << sc.sink_pages
                         << " tau " << tau << " floor " << floor_pages);
            const SelRun got = run_select(be_.get(), rows, sc);
            expect_matches(be_->kind(), rows, sc, got);
            const SelectionBuf fixed = reference(rows, base, 0.0, got.capacity);
            for (size_t i = 0; i < got.counts.size(); ++i, ++rows_checked) {
              EXPECT_LE(got.counts[i], fixed.counts[i]) << "the budget is the ceiling";
              trimmed += got.counts[i] < fixed.counts[i];
            }
          }
    }
  // The cases must exercise the rule, not only the ceiling (rows that fit the budget, and
  // spread scores at tau 0.99 / 1, reach it): 204 of 1536 rows are trimmed on the CPU.
  EXPECT_GT(trimmed, rows_checked / 10);
}

// One plan, one workspace, one output buffer: the counts follow the data (a step where two
// pages hold the mass, one where it is spread), the capacity and the buffers do not.
TEST_F(AdaptiveSelect, CountsVaryUnderAFixedCapacity) {
  SelectConfig sc{64 * 16, 0, 0};
  sc.tau = 0.9f;
  Rows peaked(300, Kind::hot, 5), spread(300, Kind::random, 5);
  std::fill(peaked.scores.begin(), peaked.scores.end(), -20.0f);
  for (size_t row = 0; row < size_t(peaked.B) * peaked.H; ++row)
    peaked.scores[row * 300 + 3] = peaked.scores[row * 300 + 7] = 0.0f;  // half the mass each
  for (float& s : spread.scores) s = 0.1f * s;                           // near uniform
  Session session(be_.get(), peaked, sc);
  const SelRun a = session.run(peaked), b = session.run(spread), c = session.run(peaked);
  EXPECT_EQ(session.plan().capacity,
            rules::select_capacity(sc.budget_tokens, 16, 300, sc.dense_below));
  EXPECT_EQ(c.pages, a.pages) << "a replay of the same data selects the same pages";
  EXPECT_EQ(c.counts, a.counts);
  expect_matches(be_->kind(), peaked, sc, a);
  expect_matches(be_->kind(), spread, sc, b);
  // Sequence 0 (300 full pages): pages 3 and 7 cover 0.9, the spread scores need the budget.
  EXPECT_EQ(a.counts[0], 2);
  EXPECT_EQ(b.counts[0], 64);
  // Sequence 2 (37 tokens, 3 pages) fits the budget: every page, tau or not.
  EXPECT_EQ(a.counts[4], 3);
}

}  // namespace
}  // namespace locks::test

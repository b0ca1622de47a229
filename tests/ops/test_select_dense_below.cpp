// The minimum context (SelectConfig::dense_below) on the backend of this binary (tests/ops:
// CPU; tests/cuda: CUDA) against the float64 reference: in one launch, the sequences shorter
// than dense_below keep every page and the others select under the budget; the boundary
// (len == dense_below selects, len == dense_below - 1 does not) and the capacity the rule
// gives. One selection chunk (300 pages) and two (2200: the CUDA two-stage path).
#include <gtest/gtest.h>

#include <string>

#include "backend.h"
#include "locks/reference.h"
#include "locks/rules.h"
#include "select_rows.h"
#include "test_util.h"

namespace locks::test {
namespace {

class SelectDenseBelow : public SelectOnBackend {};

TEST_F(SelectDenseBelow, ShortSequencesKeepEveryPageLongOnesSelect) {
  for (int M : {300, 2200})
    for (Kind kind : {Kind::random, Kind::ties, Kind::neg_inf}) {
      const Rows rows(M, kind, uint64_t(M) * 7 + int(kind));
      // lens = {M P, (M / 2) P + 5, 37, 20 P}; budget 2 pages + 1 sink + 0 recent.
      const int mid = rows.lens[1];
      for (int dense_below : {0, 37, 38, 20 * 16 + 1, mid, mid + 1, M * 16 + 1}) {
        SCOPED_TRACE("M " + std::to_string(M) + " kind " + std::to_string(int(kind)) +
                     " dense_below " + std::to_string(dense_below));
        SelectConfig sc{3 * 16, 1, 0};
        sc.dense_below = dense_below;
        const SelRun got = run_select(be_.get(), rows, sc);
        ASSERT_EQ(got.capacity, rules::select_capacity(sc.budget_tokens, 16, M, dense_below));
        const SelectionBuf want = reference(rows, sc, 0.0, got.capacity);
        EXPECT_EQ(got.counts, want.counts);
        EXPECT_EQ(got.pages, want.pages);
        // The rule itself, independently of the reference: a short row is 0, 1, ..., n - 1.
        for (int b = 0; b < rows.B; ++b) {
          const int len = rows.lens[size_t(b)];
          const int n = rules::num_pages(len, 16);
          const bool all = len < dense_below || sc.budget_tokens >= len;
          for (int h = 0; h < rows.H; ++h) {
            const size_t row = size_t(b) * rows.H + h;
            ASSERT_EQ(got.counts[row], all ? n : 3) << "sequence " << b << " len " << len;
            if (!all) continue;
            for (int i = 0; i < n; ++i)
              ASSERT_EQ(got.pages[row * got.capacity + i], i) << "sequence " << b;
            for (int i = n; i < got.capacity; ++i)
              ASSERT_EQ(got.pages[row * got.capacity + i], -1) << "padding of sequence " << b;
          }
        }
      }
    }
}

TEST_F(SelectDenseBelow, NegativeIsRefusedByThePlan) {
  const Rows rows(300, Kind::random, 1);
  SelectConfig sc{3 * 16, 1, 0};
  sc.dense_below = -1;
  EXPECT_THROW(be_->plan(rows.params(sc)), InvalidArgument);
}

}  // namespace
}  // namespace locks::test

// rules.h (the budget and filled-page rules every backend shares) against brute-force
// statements of select.h's contract over every small case.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "locks/error.h"
#include "locks/rules.h"
#include "locks/select.h"

namespace locks {
namespace {

TEST(Rules, CapacityHoldsEveryPageTheBudgetSelects) {
  for (int P : {2, 3, 16})
    for (int b = 0; b <= 6 * P; ++b)
      for (int M = 1; M <= 8; ++M)
        for (int dense_below : {0, 1, b, b + 1, b + 2, 3 * P + 1, 9 * P}) {
          const int cap = rules::select_capacity(b, P, M, dense_below);
          int most = 0;  // the most pages any length selects: the capacity must be exactly that
          for (int len = 1; len <= M * P; ++len) {
            // Pages selected: every page when b >= len or len < dense_below, else floor(b / P).
            const bool all = b >= len || len < dense_below;
            EXPECT_EQ(rules::selects_all(b, len, dense_below), all);
            const int selected = all ? (len + P - 1) / P : b / P;
            EXPECT_LE(selected, cap) << "P " << P << " b " << b << " M " << M << " len " << len
                                     << " dense_below " << dense_below;
            most = std::max(most, selected);
          }
          EXPECT_LE(cap, M);
          // ceil(b / P) is kept even when no length reaches it (b > M P is capped by M; b
          // between multiples of P keeps the rounded-up slot), so the capacity is the larger
          // of the budget's slots and what the dense lengths need.
          const int dense_need = dense_below > 1 ? std::min((dense_below - 2) / P + 1, M) : 0;
          EXPECT_EQ(cap, std::max(std::min((b + P - 1) / P, M), dense_need));
          if (dense_below > b + 1) EXPECT_EQ(cap, std::max(most, std::min((b + P - 1) / P, M)));
        }
}

// The kernels' reading of a length from device memory: inside its block-table row (1 to M P
// tokens) it stands, outside it is a sequence of no page (docs/bad_input.md).
TEST(Rules, UntrustedLengthsOutsideTheRowCountAsEmpty) {
  for (int P : {1, 4, 16})
    for (int M = 1; M <= 6; ++M)
      for (int len = -P - 2; len <= M * P + P + 2; ++len) {
        const bool inside = len >= 1 && len <= M * P;
        EXPECT_EQ(rules::trusted_len(len, M, P), inside ? len : 0) << len;
        EXPECT_EQ(rules::trusted_full_pages(len, M, P), inside ? rules::full_pages(len, P) : 0)
            << len;
      }
  EXPECT_EQ(rules::trusted_len(INT32_MIN, 4, 16), 0);
  EXPECT_EQ(rules::trusted_full_pages(INT32_MAX, 4, 16), 0);
}

TEST(Rules, BudgetValidityMatchesValidateSelect) {
  for (int P : {2, 16})
    for (int b = -1; b <= 5 * P; ++b)
      for (int sink = -1; sink <= 3; ++sink)
        for (int recent = 0; recent <= 3; ++recent) {
          const SelectConfig cfg{b, sink, recent};
          bool threw = false;
          try {
            validate_select(cfg, P);
          } catch (const InvalidArgument&) {
            threw = true;
          }
          EXPECT_EQ(!threw, rules::budget_valid(b, sink, recent, P));
          EXPECT_EQ(!threw, b >= 0 && sink >= 0 && b / P >= sink + recent + 1);
        }
}

TEST(Rules, FilledPageIsThePageTheLastTokensCompleted) {
  for (int P : {2, 5, 16})
    for (int appended = 1; appended <= P; ++appended)
      for (int len = 1; len <= 5 * P; ++len) {
        int completed = -1;
        for (int t = std::max(0, len - appended); t < len; ++t)
          if ((t + 1) % P == 0) completed = t / P;  // token t was the last slot of its page
        EXPECT_EQ(rules::filled_page(len, appended, P), completed)
            << "P " << P << " appended " << appended << " len " << len;
      }
}

TEST(Rules, SlotRuleBuildsABlockWhenItsLastSlotIsWritten) {
  for (int P : {2, 16})
    for (int64_t slot = -3; slot < 6 * P; ++slot) {
      const int64_t want = (slot >= 0 && slot % P == P - 1) ? slot / P : -1;
      EXPECT_EQ(rules::slot_filled_block(slot, P), want);
    }
}

}  // namespace
}  // namespace locks

// rules.h (the budget and filled-page rules every backend shares) against brute-force
// statements of select.h's contract over every small case.
#include <gtest/gtest.h>

#include <algorithm>

#include "locks/error.h"
#include "locks/rules.h"
#include "locks/select.h"

namespace locks {
namespace {

TEST(Rules, CapacityHoldsEveryPageTheBudgetSelects) {
  for (int P : {2, 3, 16})
    for (int b = 0; b <= 6 * P; ++b)
      for (int M = 1; M <= 8; ++M) {
        const int cap = rules::select_capacity(b, P, M);
        for (int len = 1; len <= M * P; ++len) {
          // Pages selected: every page when b >= len, else floor(b / P).
          const int selected = b >= len ? (len + P - 1) / P : b / P;
          EXPECT_LE(selected, cap) << "P " << P << " b " << b << " M " << M << " len " << len;
        }
        EXPECT_LE(cap, M);
        EXPECT_EQ(cap, std::min((b + P - 1) / P, M));
      }
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

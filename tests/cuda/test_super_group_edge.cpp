// The group-edge rule of cuda::super_build_filled (src/common/super_group_edge.h) as a pure
// function: no GPU needed, so it runs in the CPU CI too. Checked against a restatement by
// brute force: the group g is completed by the step iff its last token (g + 1) * S * P - 1
// is among the step's tokens [len - appended, len).
#include <gtest/gtest.h>

#include "../../src/common/super_group_edge.h"

namespace locks::cuda_test {
namespace {

int brute(int len, int appended, int gt, int max_blocks, int P, int max_groups) {
  if (len < 1 || len > max_blocks * P) return -1;
  int found = -1;
  for (int g = 0; (g + 1) * gt <= len; ++g) {
    const int last = (g + 1) * gt - 1;
    if (last >= len - appended && last < len) found = g;
  }
  return found < max_groups ? found : -1;
}

TEST(SuperGroupEdge, MatchesBruteForce) {
  const int P = 16;
  for (int S : {2, 8, 32}) {
    const int gt = S * P, max_blocks = 5 * S + 3, max_groups = max_blocks / S;
    for (int appended : {1, 2, 15, gt - 1, gt})
      for (int len = -2; len <= max_blocks * P + 2; ++len)
        ASSERT_EQ(locks::detail::completed_group(len, appended, gt, max_blocks, P, max_groups),
                  brute(len, appended, gt, max_blocks, P, max_groups))
            << "S " << S << " appended " << appended << " len " << len;
  }
  // A table narrower than the block table: groups past it are not built.
  EXPECT_EQ(locks::detail::completed_group(3 * 32, 1, 32, 10, 16, 2), -1);
  EXPECT_EQ(locks::detail::completed_group(2 * 32, 1, 32, 10, 16, 2), 1);
}

}  // namespace
}  // namespace locks::cuda_test

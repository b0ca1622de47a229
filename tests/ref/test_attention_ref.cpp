// Checks of the float64 reference itself on cases small enough to know the answer (the
// yardstick the backends are compared with must not itself be wrong).
// The reference attention (src/ref/attention_ref.cpp) against a closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "locks/error.h"
#include "locks/reference.h"
#include "test_util.h"

namespace locks::test {
namespace {

TEST(RefSelfCheck, AttentionOverEqualLogitsIsTheMeanOfValues) {
  CacheLayout l{2, 4, 1, 32, DType::f32};
  std::vector<float> k(size_t(l.num_blocks * l.block_elems()), 0.5f), v(k.size());
  Rng rng(3);
  for (auto& x : v) x = rng.normal();
  std::vector<float> q(32, 0.0f);  // q = 0: every logit is 0
  const int32_t len = 6;
  std::vector<int32_t> table{1, 0};  // page 0 lives in block 1
  BatchView bv{table.data(), 2, &len, 1, 2};
  std::vector<double> out(32), lse(1);
  ref::decode_attention({k.data(), v.data(), l}, bv, {q.data(), 1}, 0.2f, nullptr, out.data(),
                        lse.data());
  EXPECT_NEAR(lse[0], std::log(6.0), 1e-14);
  for (int c = 0; c < 32; ++c) {
    double m = 0;
    for (int s = 0; s < 4; ++s) m += v[size_t(l.offset(1, s, 0) + c)];
    for (int s = 0; s < 2; ++s) m += v[size_t(l.offset(0, s, 0) + c)];
    EXPECT_NEAR(out[size_t(c)], m / 6, 1e-12);
  }
}

}  // namespace
}  // namespace locks::test

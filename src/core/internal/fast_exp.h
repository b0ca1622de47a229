// exp for the softmax inner loops: glibc's expf is a scalar call (~15 ns) that GCC cannot
// vectorize without -ffast-math, and one is needed per (token, query head). This one is
// branch-free, so a loop of it vectorizes in every SIMD clone.
#pragma once

#include <cstdint>
#include <cstring>

namespace locks::detail {

// exp(x) for x <= 0 (softmax arguments x - max): relative error below 3e-7 (about 2 ulp;
// checked against std::exp by a unit test), 0 below -87.3 (where exp(x) < 2^-126, the
// float normal range ends) and for -inf. Not for x > 0.
inline float exp_nonpos(float x) {
  const bool under = !(x >= -87.3f);  // also catches -inf (and NaN -> 0, never produced here)
  const float xc = under ? -87.3f : x;
  // x = n ln2 + r, |r| <= ln2 / 2; n by the round-to-nearest magic constant (no rint call).
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float n = (xc * 1.44269504088896341f + kMagic) - kMagic;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = hi - lo, hi exact
  // Taylor to degree 7 on |r| <= 0.347: truncation error < 6e-9 relative.
  float p = 1.98412698e-4f;
  p = p * r + 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;  // n in [-126, 0]: a normal exponent
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  const float y = p * scale;
  return under ? 0.0f : y;
}

}  // namespace locks::detail

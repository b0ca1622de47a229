// The vectorizable fp16 -> fp32 conversion of the CPU kernels equals half_to_float exactly.
#include <gtest/gtest.h>

#include <cstring>

#include "../../src/core/internal/row_convert.h"

TEST(ImplFp16, FastConversionIsBitIdenticalForEveryHalf) {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = locks::half_to_float(uint16_t(h));
    const float b = locks::detail::half_to_float_fast(uint16_t(h));
    if (std::memcmp(&a, &b, 4) != 0) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
  // The row conversion used by attention (vectorized loop) agrees too.
  std::vector<uint16_t> row(65536);
  std::vector<float> out(65536);
  for (uint32_t h = 0; h < 65536; ++h) row[h] = uint16_t(h);
  locks::detail::convert_row(row.data(), locks::DType::f16, 0, 65536, out.data());
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = locks::half_to_float(uint16_t(h));
    ASSERT_EQ(std::memcmp(&a, &out[h], 4), 0) << h;
  }
}

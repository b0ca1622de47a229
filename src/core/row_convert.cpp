// The fp16 -> fp32 lookup table used by the CPU kernels.
#include "internal/row_convert.h"

#include <vector>

namespace locks::detail {

const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = half_to_float(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

}  // namespace locks::detail

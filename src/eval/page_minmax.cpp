#include "page_minmax.h"

#include <algorithm>

namespace locks::eval {

void PageMinMax::build(const LayerContext& ctx) {
  kv_heads = ctx.kv_heads;
  const int d = ctx.head_dim, P = ctx.page_size;
  const size_t n = size_t(ctx.num_full_pages) * ctx.kv_heads * d;
  lo.assign(n, 0.0f);
  hi.assign(n, 0.0f);
#pragma omp parallel for schedule(static)
  for (int j = 0; j < ctx.num_full_pages; ++j) {
    for (int h = 0; h < ctx.kv_heads; ++h) {
      float* l = lo.data() + idx(j, h, d);
      float* u = hi.data() + idx(j, h, d);
      const float* k0 = ctx.key(int64_t(j) * P, h);
      std::copy(k0, k0 + d, l);
      std::copy(k0, k0 + d, u);
      for (int i = 1; i < P; ++i) {
        const float* k = ctx.key(int64_t(j) * P + i, h);
        for (int c = 0; c < d; ++c) {
          l[c] = std::min(l[c], k[c]);
          u[c] = std::max(u[c], k[c]);
        }
      }
    }
  }
}

}  // namespace locks::eval

// Per-page, per-channel key minima and maxima (Quest's and RocketKV's metadata).
#pragma once

#include <vector>

#include "locks/eval/layer_setup.h"

namespace locks::eval {

// lo/hi: [num_full_pages, kv_heads, head_dim]; full pages only (the tail has none).
struct PageMinMax {
  std::vector<float> lo, hi;
  void build(const LayerContext& ctx);
  const float* min(int page, int kv_head, int d) const { return lo.data() + idx(page, kv_head, d); }
  const float* max(int page, int kv_head, int d) const { return hi.data() + idx(page, kv_head, d); }
  int kv_heads = 0;
  static int64_t idx_of(int page, int kv_head, int kvh, int d) {
    return (int64_t(page) * kvh + kv_head) * d;
  }

 private:
  int64_t idx(int page, int kv_head, int d) const { return idx_of(page, kv_head, kv_heads, d); }
};

// Upper bound of q.k over the page's keys restricted to the listed channels:
//   sum_c max(q_c * max_c, q_c * min_c).
inline double channel_bound(const float* q, const float* lo, const float* hi, const int* dims,
                            int n_dims) {
  double acc = 0;
  for (int i = 0; i < n_dims; ++i) {
    const int c = dims[i];
    const double a = double(q[c]) * hi[c], b = double(q[c]) * lo[c];
    acc += a > b ? a : b;
  }
  return acc;
}

}  // namespace locks::eval

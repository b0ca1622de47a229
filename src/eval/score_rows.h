// The loop every per-page selector shares: one row of page scores per (decode step,
// query head), rows in parallel, the tail page (no metadata) at -inf like every method.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "locks/eval/selector.h"

namespace locks::eval {

// make_row(q, kv_head) is called once per row (for per-row set-up such as projecting q) and
// returns a callable page -> score (double) used on every full page of that row.
template <typename MakeRow>
void score_rows(const LayerContext& ctx, float* head_scores, MakeRow&& make_row) {
  const int n = ctx.num_pages;
  const int64_t rows = int64_t(ctx.steps) * ctx.q_heads;
#pragma omp parallel for schedule(dynamic)
  for (int64_t r = 0; r < rows; ++r) {
    const int s = static_cast<int>(r / ctx.q_heads), qh = static_cast<int>(r % ctx.q_heads);
    auto page_score = make_row(ctx.query(s, qh), qh / ctx.group());
    float* out = head_scores + r * n;
    for (int j = 0; j < n; ++j)
      out[j] = j < ctx.num_full_pages ? static_cast<float>(page_score(j))
                                      : -std::numeric_limits<float>::infinity();
  }
}

// log sum_i exp(x_i), shifted by the maximum (n >= 1).
inline double log_sum_exp(const double* x, int n) {
  double m = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) m = std::max(m, x[i]);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(x[i] - m);
  return m + std::log(sum);
}

}  // namespace locks::eval

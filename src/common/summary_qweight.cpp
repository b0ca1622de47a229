// Query weights of query-weighted summaries (include/locks/summary.h): the check every
// backend's host entry points share, and the calibration from observed queries that the
// drop-in and the evaluation harness use.
#include <cmath>
#include <vector>

#include "locks/error.h"
#include "locks/summary.h"

namespace locks {

void validate_qweight(const float* qweight, int num_kv_heads, int head_dim) {
  if (qweight == nullptr) return;
  const int64_t n = int64_t(num_kv_heads) * head_dim;
  for (int64_t i = 0; i < n; ++i)
    LOCKS_REQUIRE(std::isfinite(qweight[i]) && qweight[i] > 0.0f,
                  "query weights (qweight) must be finite and > 0; entry ", i, " (KV head ",
                  i / head_dim, ", channel ", i % head_dim, ") is ", qweight[i]);
}

void qweight_from_queries(const float* q, int64_t n, int num_q_heads, int num_kv_heads,
                          int head_dim, float* out, double floor) {
  LOCKS_REQUIRE(n >= 1, "qweight_from_queries needs at least one observed query, got ", n);
  LOCKS_REQUIRE(num_kv_heads >= 1 && num_q_heads % num_kv_heads == 0,
                "num_q_heads must be a multiple of num_kv_heads, got ", num_q_heads, " and ",
                num_kv_heads);
  LOCKS_REQUIRE(head_dim >= 1, "head_dim must be >= 1, got ", head_dim);
  LOCKS_REQUIRE(std::isfinite(floor) && floor > 0, "floor must be finite and > 0, got ", floor);
  const int G = num_q_heads / num_kv_heads;
  for (int h = 0; h < num_kv_heads; ++h) {
    std::vector<double> acc(size_t(head_dim), 0.0);
    for (int64_t s = 0; s < n; ++s)
      for (int g = 0; g < G; ++g) {
        const float* x = q + (s * num_q_heads + int64_t(h) * G + g) * head_dim;
        for (int c = 0; c < head_dim; ++c) {
          LOCKS_REQUIRE(std::isfinite(x[c]), "observed query has NaN or Inf");
          acc[size_t(c)] += double(x[c]) * x[c];
        }
      }
    double mean = 0;
    for (int c = 0; c < head_dim; ++c) mean += acc[size_t(c)] / double(n * G);
    mean /= head_dim;
    // A zero query set (mean 0) gives w = 1: no channel is preferred.
    for (int c = 0; c < head_dim; ++c) {
      const double p = acc[size_t(c)] / double(n * G);
      out[int64_t(h) * head_dim + c] =
          mean > 0 ? float(std::sqrt(std::max(p, floor * mean))) : 1.0f;
    }
  }
}

}  // namespace locks

// Brute-force float64 reference implementations of every operation: the yardstick that
// every backend (CPU, CUDA) is tested against. Straightforward loops, no threading.
#pragma once

#include <cstdint>
#include <vector>

#include "locks/attention.h"
#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks::ref {

// Summary of one (block, head) in float64: mu[d], basis[r*d] (rows), coeff[P*r],
// via eigen-decomposition of the centred P x P Gram matrix (independent of cpu::'s SVD).
// sigma[P]: every singular value of the centred keys, descending (sigma_k^2 are the Gram
// eigenvalues, accurate to ~1e-16 sigma_0^2 absolute), so sum_{k >= rank} sigma_k^2 is
// the optimal rank-`rank` residual.
// A direction whose singular value is numerically zero (sigma_k <= 1e-6 sigma_0) is
// undetermined: its basis row and coefficients are returned as zeros.
struct PageSummary64 {
  std::vector<double> mu, basis, coeff, sigma;
};
PageSummary64 summary_build_page(const KvCacheView& cache, int32_t block, int head, int rank);

// Estimated log page mass from a summary view (either precision), float64 arithmetic.
double score_page(const SummaryView& s, int32_t block, int head, const float* q, float scale);
// Exact log page mass: log sum_i exp(q.k_i * scale) over the page's first n_valid tokens.
double exact_log_mass(const KvCacheView& cache, int32_t block, int head, int n_valid,
                      const float* q, float scale);

// Same contracts as the cpu:: functions, float64 inside.
void score_pages(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                 float scale, double* head_scores);
void aggregate_gqa(const double* head_scores, const BatchView& batch, int num_q_heads,
                   int num_kv_heads, double* group_scores);
void select_pages(const double* group_scores, const BatchView& batch, int num_kv_heads,
                  int page_size, const SelectConfig& cfg, const Selection& out);
void decode_attention(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                      float scale, const Selection* sel, double* out, double* lse);

}  // namespace locks::ref

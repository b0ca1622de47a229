// Brute-force float64 reference implementations of every operation: the yardstick that
// every backend (CPU, CUDA) is tested against. Straightforward loops, no threading.
#pragma once

#include <cstdint>
#include <vector>

#include "locks/attention.h"
#include "locks/kv_cache.h"
#include "locks/request_rows.h"
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
// qweight: the query weights [num_kv_heads, head_dim] of query-weighted summaries (summary.h),
// or nullptr; basis and coefficients are then those of the weighted deviations.
PageSummary64 summary_build_page(const KvCacheView& cache, int32_t block, int head, int rank,
                                 const float* qweight = nullptr);

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

// Each token row's list from its request's selection (request_rows.h), as vectors: the
// request's pages at or before the row's last page, that page if missing and there is room,
// then any pages past the request's last; a row of length < 1 gets none. Host arrays, any
// values: an invalid request count or a partial last page without room gives count -1.
void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                  const Selection& out);

// The filled-page rules of the contract (contract.h), as the blocks each build must
// summarise: filled_blocks for summary_build_filled (one entry per sequence whose last
// `appended` tokens completed a page), slot_blocks for summary_build_slots (one entry per
// slot with offset P - 1, in slot order). Host arrays; throws on out-of-range values.
std::vector<int32_t> filled_blocks(const CacheLayout& cache, const BatchView& batch, int appended);
std::vector<int32_t> slot_blocks(const CacheLayout& cache, const int32_t* slot_mapping,
                                 int64_t n_slots);
// Float64 summaries of those blocks (every KV head, in order block-major), so that a
// backend's filled builds are checked against the reference build.
struct BlockSummary64 {
  int32_t block = 0;
  int head = 0;
  PageSummary64 summary;
};
std::vector<BlockSummary64> summary_build_filled(const KvCacheView& cache, const BatchView& batch,
                                                 int appended, int rank,
                                                 const float* qweight = nullptr);
std::vector<BlockSummary64> summary_build_slots(const KvCacheView& cache,
                                                const int32_t* slot_mapping, int64_t n_slots,
                                                int rank, const float* qweight = nullptr);

}  // namespace locks::ref

// Reference page scoring and GQA share-averaging, straight from the formulas in score.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// log sum_i exp(x_i), stable; -inf when every x_i is -inf (or there are none).
double log_sum_exp(const std::vector<double>& x) {
  double m = kNegInf;
  for (double v : x) m = std::max(m, v);
  if (m == kNegInf) return kNegInf;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

}  // namespace

double score_page(const SummaryView& s, int32_t block, int head, const float* q, float scale) {
  detail::check_summary_view(s);
  const SummaryLayout& l = s.layout;
  LOCKS_REQUIRE(block >= 0 && block < l.num_blocks, "block ", block, " out of range");
  LOCKS_REQUIRE(head >= 0 && head < l.num_kv_heads, "head ", head, " out of range");
  LOCKS_REQUIRE(q != nullptr, "q must not be null");
  const int d = l.head_dim, P = l.page_size, r = l.rank;
  detail::check_finite(q, d, "q");
  const int64_t bh = int64_t(block) * l.num_kv_heads + head;

  std::vector<float> mu(d), basis(size_t(r) * d), coeff(size_t(P) * r);
  if (l.precision == Precision::fp32) {
    std::copy_n(s.mu + bh * d, d, mu.begin());
    std::copy_n(s.basis + bh * r * d, r * d, basis.begin());
    std::copy_n(s.coeff + bh * P * r, P * r, coeff.begin());
  } else {
    summary_dequantize(s.mu_q + bh * d, s.mu_scale[bh], s.basis_q + bh * r * (d / 2),
                       s.basis_scale + bh * basis_scales_per_head(l), s.coeff_q + bh * P * r,
                       s.coeff_scale + bh * r, d, P, r, l.basis_group, mu.data(), basis.data(),
                       coeff.data());
  }

  double qmu = 0;
  for (int c = 0; c < d; ++c) qmu += double(q[c]) * mu[c];
  // w = V (q / qweight), the query in the page's own (weighted) basis
  const float* qw = s.qweight ? s.qweight + int64_t(head) * d : nullptr;
  std::vector<double> w(r, 0.0);
  for (int k = 0; k < r; ++k)
    for (int c = 0; c < d; ++c)
      w[k] += double(basis[size_t(k) * d + c]) * (qw ? double(q[c]) / qw[c] : double(q[c]));
  std::vector<double> logits(P);
  for (int i = 0; i < P; ++i) {
    double wc = 0;
    for (int k = 0; k < r; ++k) wc += w[k] * coeff[size_t(i) * r + k];
    logits[i] = (qmu + wc) * double(scale);
  }
  return log_sum_exp(logits);
}

double exact_log_mass(const KvCacheView& cache, int32_t block, int head, int n_valid,
                      const float* q, float scale) {
  detail::check_cache(cache);
  const CacheLayout& l = cache.layout;
  LOCKS_REQUIRE(block >= 0 && block < l.num_blocks, "block ", block, " out of range");
  LOCKS_REQUIRE(head >= 0 && head < l.num_kv_heads, "head ", head, " out of range");
  LOCKS_REQUIRE(n_valid >= 1 && n_valid <= l.page_size, "n_valid must be in [1, page_size]");
  LOCKS_REQUIRE(q != nullptr, "q must not be null");
  detail::check_finite(q, l.head_dim, "q");
  std::vector<double> logits(n_valid);
  for (int i = 0; i < n_valid; ++i) {
    const int64_t off = detail::element_offset(cache, block, i, head);
    double dot = 0;
    for (int c = 0; c < l.head_dim; ++c)
      dot += double(q[c]) * load_as_float(cache.k, l.dtype, off + c);
    logits[i] = dot * double(scale);
  }
  return log_sum_exp(logits);
}

void score_pages(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                 float scale, double* head_scores) {
  detail::check_summary_view(summaries);
  const SummaryLayout& l = summaries.layout;
  detail::check_batch(l.page_size, l.num_blocks, batch);
  LOCKS_REQUIRE(q.q != nullptr && head_scores != nullptr, "q and head_scores must not be null");
  LOCKS_REQUIRE(q.num_q_heads >= 1 && q.num_q_heads % l.num_kv_heads == 0,
                "num_q_heads must be a positive multiple of num_kv_heads");
  LOCKS_REQUIRE(q.dtype == DType::f32 || q.dtype == DType::f16 || q.dtype == DType::bf16,
                "q: unknown dtype");
  LOCKS_REQUIRE(q.stride == 0 || q.stride >= int64_t(q.num_q_heads) * l.head_dim,
                "q.stride below num_q_heads * head_dim");
  const int Hq = q.num_q_heads, G = Hq / l.num_kv_heads, M = batch.max_blocks_per_seq;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int64_t full = batch.seq_lens[b] / l.page_size;
    for (int h = 0; h < Hq; ++h) {
      const std::vector<float> qrow =
          detail::to_float(q.q, q.dtype, q.offset(b, h, l.head_dim), l.head_dim);
      const float* qv = qrow.data();
      double* row = head_scores + (int64_t(b) * Hq + h) * M;
      for (int j = 0; j < M; ++j) {
        row[j] = j < full
                     ? score_page(summaries, batch.block_table[b * batch.block_table_stride + j],
                                  h / G, qv, scale)
                     : kNegInf;
      }
    }
  }
}

void aggregate_gqa(const double* head_scores, const BatchView& batch, int num_q_heads,
                   int num_kv_heads, double* group_scores) {
  LOCKS_REQUIRE(head_scores != nullptr && group_scores != nullptr, "scores must not be null");
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.max_blocks_per_seq >= 1, "empty batch");
  LOCKS_REQUIRE(num_kv_heads >= 1 && num_q_heads >= 1 && num_q_heads % num_kv_heads == 0,
                "num_q_heads must be a positive multiple of num_kv_heads");
  const int G = num_q_heads / num_kv_heads, M = batch.max_blocks_per_seq;
  for (int b = 0; b < batch.batch_size; ++b) {
    for (int g = 0; g < num_kv_heads; ++g) {
      // a_j = log((1/G) sum_h exp(s_hj - LSE_h)), in the log domain so that no finite score
      // underflows to -inf; heads whose s_hj is -inf contribute nothing to page j.
      std::vector<std::vector<double>> terms(M);
      for (int hh = 0; hh < G; ++hh) {
        const double* s = head_scores + (int64_t(b) * num_q_heads + g * G + hh) * M;
        const std::vector<double> row(s, s + M);
        for (double v : row) LOCKS_REQUIRE(!std::isnan(v) && v != -kNegInf, "score NaN or +inf");
        const double lse = log_sum_exp(row);
        for (int j = 0; j < M; ++j)
          if (row[j] != kNegInf) terms[j].push_back(row[j] - lse);
      }
      double* out = group_scores + (int64_t(b) * num_kv_heads + g) * M;
      for (int j = 0; j < M; ++j) out[j] = log_sum_exp(terms[j]) - std::log(double(G));
    }
  }
}

}  // namespace locks::ref

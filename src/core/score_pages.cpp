// cpu::score_pages: estimated log page mass from the summaries (never reads K or V).
// One work item is (sequence, KV head, page): the page's summary is read (and for the
// quant layout, its int4 basis rows unpacked to small float code buffers) once and used
// by every query head of the group.
#include <cmath>
#include <limits>
#include <vector>

#include "internal/check.h"
#include "internal/fast_exp.h"
#include "internal/ops.h"
#include "internal/row_convert.h"
#include "internal/simd_clones.h"
#include "locks/error.h"
#include "locks/score.h"
#include "locks/super_summary.h"

namespace locks::cpu {
namespace {

// log sum_i exp(x_i), x finite; x is overwritten.
inline float log_sum_exp(float* x, int n) {
  float m = x[0];
  for (int i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int i = 0; i < n; ++i) x[i] = detail::exp_nonpos(x[i] - m);
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += x[i];
  return m + std::log(s);
}

struct Scratch {
  float* row;     // [d]
  float* proj;    // [G * r]
  float* qmu;     // [G]
  float* logits;  // [P]
  float* ct;      // [r * P]
  float* qw;      // [G * d]: the group's queries divided by the query weights (if any)
  float* qc;      // [G * d]: the group's queries as float (q in fp16 / bf16)
};

// ct[k * P + i] = float(coeff[i * r + k]): the page's coefficients transposed once per page
// (shared by the G query heads) so that the per-head loop over keys is contiguous.
template <typename C>
inline void transpose_coeff(const C* coeff, int P, int r, float* ct) {
  for (int i = 0; i < P; ++i)
    for (int k = 0; k < r; ++k) ct[k * P + i] = float(coeff[i * r + k]);
}

// logits_i = (q.mu + sum_k proj_k c_ik) * scale for one query head, then their LSE.
// proj already holds the coefficient scales in quant mode (c_ik = coeff_scale_k * code).
inline float page_lse(float qmu, const float* proj, const float* ct, int P, int r, float scale,
                      float* logits) {
  for (int i = 0; i < P; ++i) logits[i] = 0.0f;
  for (int k = 0; k < r; ++k) {
    const float pk = proj[k];
    const float* row = ct + k * P;
    for (int i = 0; i < P; ++i) logits[i] += pk * row[i];
  }
  for (int i = 0; i < P; ++i) logits[i] = (qmu + logits[i]) * scale;
  return log_sum_exp(logits, P);
}

// One page's scores for the G query heads of its KV head; dst[h * M] receives head h.
LOCKS_SIMD_CLONES
void score_fp32(const SummaryView& S, int64_t bh, const float* qg, const float* qwg, int G,
                float scale, float* dst, int M, const Scratch& w) {
  const int P = S.layout.page_size, d = S.layout.head_dim, r = S.layout.rank;
  const float* mu = S.mu + bh * d;
  const float* basis = S.basis + bh * r * d;
  transpose_coeff(S.coeff + bh * P * r, P, r, w.ct);
  for (int h = 0; h < G; ++h) {
    const float* qh = qg + int64_t(h) * d;
    const float qmu = detail::dot(qh, mu, d);
    const float* qwh = qwg + int64_t(h) * d;  // q / w for the (weighted) basis
    for (int k = 0; k < r; ++k) w.proj[k] = detail::dot(qwh, basis + int64_t(k) * d, d);
    dst[int64_t(h) * M] = page_lse(qmu, w.proj, w.ct, P, r, scale, w.logits);
  }
}

// Integer codes times scales: q.mu = mu_scale * (q . mu_q), (V q)_k = sum over the row's
// scale groups j of basis_scale_kj * (q_j . basis_q_kj) (one group: the whole row),
// c_ik = coeff_scale_k * coeff_q_ik. Codes become floats one row at a time (int4 unpacked
// into w.row); the summary is never dequantized as a whole.
LOCKS_SIMD_CLONES
void score_quant(const SummaryView& S, int64_t bh, const float* qg, const float* qwg, int G,
                 float scale, float* dst, int M, const Scratch& w) {
  const int P = S.layout.page_size, d = S.layout.head_dim, r = S.layout.rank;
  const int g = S.layout.basis_group, ng = d / g;
  const int8_t* mu_q = S.mu_q + bh * d;
  const uint8_t* basis_q = S.basis_q + bh * r * (d / 2);
  const float* basis_scale = S.basis_scale + bh * r * ng;
  transpose_coeff(S.coeff_q + bh * P * r, P, r, w.ct);
  const float* coeff_scale = S.coeff_scale + bh * r;
  for (int e = 0; e < d; ++e) w.row[e] = float(mu_q[e]);
  for (int h = 0; h < G; ++h)
    w.qmu[h] = S.mu_scale[bh] * detail::dot(qg + int64_t(h) * d, w.row, d);
  for (int k = 0; k < r; ++k) {
    const uint8_t* codes = basis_q + int64_t(k) * (d / 2);
    for (int e = 0; e < d / 2; ++e) {
      w.row[2 * e] = float(static_cast<int8_t>(static_cast<uint8_t>(codes[e] << 4)) >> 4);
      w.row[2 * e + 1] = float(static_cast<int8_t>(codes[e]) >> 4);
    }
    const float* bs = basis_scale + int64_t(k) * ng;
    if (ng == 1) {  // one scale a row: today's single dot product
      const float s = bs[0] * coeff_scale[k];
      for (int h = 0; h < G; ++h)
        w.proj[h * r + k] = s * detail::dot(qwg + int64_t(h) * d, w.row, d);
      continue;
    }
    for (int h = 0; h < G; ++h) {
      const float* qh = qwg + int64_t(h) * d;
      float acc = 0.0f;
      for (int j = 0; j < ng; ++j)
        acc += bs[j] * detail::dot(qh + int64_t(j) * g, w.row + int64_t(j) * g, g);
      w.proj[h * r + k] = coeff_scale[k] * acc;
    }
  }
  for (int h = 0; h < G; ++h)
    dst[int64_t(h) * M] = page_lse(w.qmu[h], w.proj + h * r, w.ct, P, r, scale, w.logits);
}

}  // namespace

void score_pages(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                 float scale, float* head_scores) {
  const SummaryLayout& l = summaries.layout;
  const int G = l.num_kv_heads >= 1 ? q.num_q_heads / l.num_kv_heads : 0;
  const detail::OwnedScratch sc(
      detail::checked_bytes(impl::score_scratch_bytes, G, l.rank, l.head_dim, l.page_size));
  impl::score_pages(summaries, batch, q, scale, head_scores, sc.view());
}

void score_pages_masked(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                        float scale, const uint8_t* page_mask, float* head_scores) {
  LOCKS_REQUIRE(page_mask != nullptr, "page_mask is null");
  const SummaryLayout& l = summaries.layout;
  const int G = l.num_kv_heads >= 1 ? q.num_q_heads / l.num_kv_heads : 0;
  const detail::OwnedScratch sc(
      detail::checked_bytes(impl::score_scratch_bytes, G, l.rank, l.head_dim, l.page_size));
  impl::score_pages(summaries, batch, q, scale, head_scores, sc.view(), page_mask);
}

size_t impl::score_scratch_bytes(int G, int r, int d, int P) {
  using detail::carve_bytes;
  return carve_bytes<float>(size_t(d)) + carve_bytes<float>(size_t(G) * r) +
         carve_bytes<float>(size_t(G)) + carve_bytes<float>(size_t(P)) +
         carve_bytes<float>(size_t(r) * P) + 2 * carve_bytes<float>(size_t(G) * d);
}

void impl::score_pages(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                       float scale, float* head_scores, const detail::ThreadScratch& sc,
                       const uint8_t* page_mask, int64_t bt_head_stride) {
  const SummaryLayout& sl = summaries.layout;
  validate_summary_layout(sl);
  detail::check_batch_blocks(batch, sl.num_blocks, sl.page_size, __func__);
  detail::check_query(q, batch.batch_size, sl.num_kv_heads, sl.head_dim, __func__);
  detail::check_scale(scale, __func__);
  LOCKS_REQUIRE(head_scores != nullptr, "head_scores is null");
  const bool quant = sl.precision == Precision::quant;
  if (quant) {
    LOCKS_REQUIRE(summaries.mu_q && summaries.mu_scale && summaries.basis_q &&
                      summaries.basis_scale && summaries.coeff_q && summaries.coeff_scale,
                  "quant summary arrays are null");
  } else {
    LOCKS_REQUIRE(summaries.mu && summaries.basis && summaries.coeff,
                  "fp32 summary arrays are null");
  }
  validate_qweight(summaries.qweight, sl.num_kv_heads, sl.head_dim);

  const int P = sl.page_size, Hkv = sl.num_kv_heads, d = sl.head_dim, r = sl.rank;
  const int Hq = q.num_q_heads, G = Hq / Hkv;
  const int M = batch.max_blocks_per_seq;
  const int64_t items = int64_t(batch.batch_size) * Hkv * M;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // Threads only pay off beyond a few hundred page scores (fork/join costs microseconds).
  LOCKS_REQUIRE(sc.per_thread >= impl::score_scratch_bytes(G, r, d, P), "scratch too small");
#pragma omp parallel num_threads(sc.threads) if (items * G >= 256)
  {
    detail::Carver c(sc.slice(omp_get_thread_num()));
    const Scratch w{c.take<float>(size_t(d)),     c.take<float>(size_t(G) * r),
                    c.take<float>(size_t(G)),     c.take<float>(size_t(P)),
                    c.take<float>(size_t(r) * P), c.take<float>(size_t(G) * d),
                    c.take<float>(size_t(G) * d)};
    // Dynamic chunks: a thread that the OS deschedules (a shared machine) does not hold
    // the others at the barrier; results do not depend on which thread scores an item.
#pragma omp for schedule(dynamic, 64)
    for (int64_t item = 0; item < items; ++item) {
      // KV head fastest: summaries are stored [block, head], so consecutive items read
      // consecutive memory (hardware prefetch follows) when the block ids ascend.
      const int g = static_cast<int>(item % Hkv);
      const int j = static_cast<int>((item / Hkv) % M);
      const int b = static_cast<int>(item / (int64_t(M) * Hkv));
      const int full_pages = batch.seq_lens[b] / P;
      float* dst = head_scores + (int64_t(b) * Hq + int64_t(g) * G) * M + j;  // head g*G
      if (j >= full_pages ||
          (page_mask != nullptr && page_mask[(int64_t(b) * Hkv + g) * M + j] == 0)) {
        for (int h = 0; h < G; ++h) dst[int64_t(h) * M] = kNegInf;
        continue;
      }
      const int32_t block =
          batch.block_table[int64_t(b) * batch.block_table_stride + g * bt_head_stride + j];
      const int64_t bh = int64_t(block) * Hkv + g;
      // (fp16 / bf16 q: converted per page item, G d elements against its G r d products)
      const float* qg = detail::load_row(q.q, q.dtype, q.offset(b, int64_t(g) * G, d), G * d, w.qc);
      const float* qwg = qg;
      if (summaries.qweight) {  // query-weighted summaries: the basis multiplies q / w
        const float* wg = summaries.qweight + int64_t(g) * d;
        for (int h = 0; h < G; ++h)
          for (int e = 0; e < d; ++e) w.qw[int64_t(h) * d + e] = qg[int64_t(h) * d + e] / wg[e];
        qwg = w.qw;
      }
      if (!quant) {
        score_fp32(summaries, bh, qg, qwg, G, scale, dst, M, w);
      } else {
        score_quant(summaries, bh, qg, qwg, G, scale, dst, M, w);
      }
    }
  }
}

}  // namespace locks::cpu

// Quality metrics: attention-mass recall of a selection (float64), cosine, relative L2.
#include "locks/metrics.h"

#include <cmath>
#include <limits>
#include <vector>

#include "internal/check.h"
#include "locks/error.h"

namespace locks {

void attention_mass_recall(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                           float scale, const Selection& sel, double* recall) {
  const CacheLayout& L = cache.layout;
  validate_cache(cache);
  LOCKS_REQUIRE(cache.k != nullptr, "cache.k is null");
  LOCKS_REQUIRE(recall != nullptr, "recall is null");
  detail::check_batch_blocks(batch, L.num_blocks, L.page_size, __func__);
  detail::check_query(q, batch.batch_size, L.num_kv_heads, L.head_dim, __func__);
  detail::check_scale(scale, __func__);
  detail::check_selection(sel, batch, L.num_kv_heads, L.page_size, __func__);
  const int P = L.page_size, Hkv = L.num_kv_heads, d = L.head_dim, Hq = q.num_q_heads;
  const int G = Hq / Hkv;
  const int64_t n_rows = int64_t(batch.batch_size) * Hq;

  int64_t tokens = 0;
  for (int b = 0; b < batch.batch_size; ++b) tokens += batch.seq_lens[b];
    // Threads only pay off beyond ~1e5 (token, head) logits (fork/join costs microseconds).
#pragma omp parallel if (tokens * Hq >= 100000)
  {
    std::vector<double> logit;
    std::vector<char> selected;
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < n_rows; ++bh) {
      const int b = static_cast<int>(bh / Hq), h = static_cast<int>(bh % Hq), g = h / G;
      const int32_t len = batch.seq_lens[b];
      const int n_pages = detail::num_pages(len, P);
      const int32_t* table = batch.block_table + int64_t(b) * batch.block_table_stride;
      const int64_t qoff = q.offset(b, h, d);  // q read as float whatever its dtype
      logit.resize(size_t(len));
      double mx = -std::numeric_limits<double>::infinity();
      for (int32_t t = 0; t < len; ++t) {
        const int64_t off = cache.offset(table[t / P], t % P, g);
        double x = 0.0;
        for (int e = 0; e < d; ++e)
          x += double(load_as_float(q.q, q.dtype, qoff + e)) *
               load_as_float(cache.k, L.dtype, off + e);
        x *= double(scale);
        logit[size_t(t)] = x;
        mx = std::max(mx, x);
      }
      selected.assign(size_t(n_pages), 0);
      const int64_t bg = int64_t(b) * Hkv + g;
      for (int i = 0; i < sel.counts[bg]; ++i)
        selected[size_t(sel.pages[bg * sel.capacity + i])] = 1;
      double total = 0.0, hit = 0.0;
      for (int32_t t = 0; t < len; ++t) {
        const double w = std::exp(logit[size_t(t)] - mx);
        total += w;
        if (selected[size_t(t / P)]) hit += w;
      }
      recall[bh] = hit / total;
    }
  }
}

double cosine_similarity(const float* a, const float* b, int64_t n) {
  LOCKS_REQUIRE(a != nullptr && b != nullptr, "null input");
  LOCKS_REQUIRE(n >= 1, "n must be >= 1, got ", n);
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  if (aa == 0.0 && bb == 0.0) return 1.0;  // two zero vectors agree
  if (aa == 0.0 || bb == 0.0) return 0.0;
  return ab / (std::sqrt(aa) * std::sqrt(bb));
}

double relative_l2(const float* a, const float* ref, int64_t n) {
  LOCKS_REQUIRE(a != nullptr && ref != nullptr, "null input");
  LOCKS_REQUIRE(n >= 1, "n must be >= 1, got ", n);
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = double(a[i]) - ref[i];
    num += diff * diff;
    den += double(ref[i]) * ref[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

}  // namespace locks

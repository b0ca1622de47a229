// Reference decode attention: per (sequence, query head) gather the logits of the attended
// tokens, then a two-pass softmax (max, then sum) in float64.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.h"
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::ref {

void decode_attention(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                      float scale, const Selection* sel, double* out, double* lse) {
  detail::check_cache(cache);
  const CacheLayout& l = cache.layout;
  detail::check_batch(l.page_size, l.num_blocks, batch);
  LOCKS_REQUIRE(q.q != nullptr && out != nullptr, "q and out must not be null");
  LOCKS_REQUIRE(q.num_q_heads >= 1 && q.num_q_heads % l.num_kv_heads == 0,
                "num_q_heads must be a positive multiple of num_kv_heads");
  const int Hq = q.num_q_heads, G = Hq / l.num_kv_heads, d = l.head_dim, P = l.page_size;
  LOCKS_REQUIRE(q.stride == 0 || q.stride >= int64_t(Hq) * d,
                "q.stride below num_q_heads * head_dim");
  for (int b = 0; b < batch.batch_size; ++b)
    detail::check_finite(q.q, q.dtype, q.offset(b, 0, d), int64_t(Hq) * d, "q");
  if (sel) LOCKS_REQUIRE(sel->pages && sel->counts && sel->capacity >= 1, "bad selection");

  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t len = batch.seq_lens[b];
    const int n_pages = int(detail::num_pages(len, P));
    for (int h = 0; h < Hq; ++h) {
      const int g = h / G;
      std::vector<int> pages;
      if (sel) {
        const int64_t row = int64_t(b) * l.num_kv_heads + g;
        const int cnt = sel->counts[row];
        LOCKS_REQUIRE(cnt >= 1 && cnt <= sel->capacity, "selection count out of range");
        for (int i = 0; i < cnt; ++i) {
          const int j = sel->pages[row * sel->capacity + i];
          LOCKS_REQUIRE(j >= 0 && j < n_pages, "selected page ", j, " out of range");
          LOCKS_REQUIRE(pages.empty() || j > pages.back(), "selected pages must ascend");
          pages.push_back(j);
        }
      } else {
        for (int j = 0; j < n_pages; ++j) pages.push_back(j);
      }
      const std::vector<float> qrow = detail::to_float(q.q, q.dtype, q.offset(b, h, d), d);
      const float* qv = qrow.data();
      std::vector<double> logit;
      std::vector<int64_t> offs;  // element offset of each attended token's (block, slot, g)
      for (int j : pages) {
        const int32_t blk = batch.block_table[b * batch.block_table_stride + j];
        const int n = std::min(P, len - j * P);
        for (int i = 0; i < n; ++i) {
          const int64_t off = detail::element_offset(cache, blk, i, g);
          double dot = 0;
          for (int c = 0; c < d; ++c)
            dot += double(qv[c]) * load_as_float(cache.k, l.dtype, off + c);
          logit.push_back(dot * double(scale));
          offs.push_back(off);
        }
      }
      const double m = *std::max_element(logit.begin(), logit.end());
      double sum = 0;
      for (double x : logit) sum += std::exp(x - m);
      double* o = out + (int64_t(b) * Hq + h) * d;
      std::fill(o, o + d, 0.0);
      for (size_t t = 0; t < logit.size(); ++t) {
        const double p = std::exp(logit[t] - m) / sum;
        for (int c = 0; c < d; ++c) o[c] += p * load_as_float(cache.v, l.dtype, offs[t] + c);
      }
      if (lse) lse[int64_t(b) * Hq + h] = m + std::log(sum);
    }
  }
}

}  // namespace locks::ref

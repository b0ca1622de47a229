// cpu::select_pages: the budget rules of select.h (rules.h) on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "internal/check.h"
#include "internal/ops.h"
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/select.h"

namespace locks {

namespace cpu {

void select_pages(const float* group_scores, const BatchView& batch, int num_kv_heads,
                  int page_size, const SelectConfig& cfg, const Selection& out) {
  const detail::OwnedScratch sc(
      detail::checked_bytes(impl::select_scratch_bytes, batch.max_blocks_per_seq));
  impl::select_pages(group_scores, batch, num_kv_heads, page_size, cfg, out, sc.view());
}

size_t impl::select_scratch_bytes(int M) {
  return detail::carve_bytes<char>(size_t(M)) + detail::carve_bytes<int32_t>(size_t(M)) +
         detail::carve_bytes<double>(size_t(M));
}

namespace {

// The adaptive budget (select.h): of the candidates cand[0, hi), already the hi best, how
// many to keep. Masses exp(s - max) in double, the max over the full pages; cum: scratch of
// hi + 1 doubles for the running sums in score order.
int adaptive_keep(const float* s, int full, const char* chosen, int32_t* cand, int hi,
                  const SelectConfig& cfg, double* cum) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < full; ++j) mx = std::max(mx, s[j]);
  double total = 0, fixed = 0;
  for (int j = 0; j < full; ++j) {
    const double m = std::exp(double(s[j]) - double(mx));  // NaN when mx is not finite
    total += m;
    if (chosen[size_t(j)]) fixed += m;  // sink and recent pages
  }
  std::sort(cand, cand + hi, [s](int32_t x, int32_t y) {
    return s[x] > s[y] || (s[x] == s[y] && x < y);  // the selection order
  });
  cum[0] = fixed;
  for (int i = 0; i < hi; ++i) cum[i + 1] = cum[i] + std::exp(double(s[cand[i]]) - double(mx));
  return rules::adaptive_pages(cfg.floor_pages, hi, cfg.tau, total,
                               [cum](int m) { return cum[m]; });
}

}  // namespace

void impl::select_pages(const float* group_scores, const BatchView& batch, int num_kv_heads,
                        int page_size, const SelectConfig& cfg, const Selection& out,
                        const detail::ThreadScratch& sc) {
  validate_select(cfg, page_size);
  LOCKS_REQUIRE(page_size >= 2 && page_size <= 256, "page_size must be in [2, 256], got ",
                page_size);
  LOCKS_REQUIRE(num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", num_kv_heads);
  LOCKS_REQUIRE(group_scores != nullptr, "group_scores is null");
  detail::check_batch_shape(batch, page_size, __func__);
  LOCKS_REQUIRE(out.pages != nullptr && out.counts != nullptr, "selection arrays are null");
  const int need = select_capacity(cfg, page_size, batch.max_blocks_per_seq);
  LOCKS_REQUIRE(out.capacity >= need, "selection capacity ", out.capacity, " < ", need,
                " (select_capacity)");
  const int M = batch.max_blocks_per_seq, P = page_size;
  const int64_t groups = int64_t(batch.batch_size) * num_kv_heads;
  for (int64_t i = 0; i < groups * M; ++i) {
    LOCKS_REQUIRE(!std::isnan(group_scores[i]), "group_scores[", i, "] is NaN");
  }

  // ~10 ns a page on one thread (0.2 ms at 32K tokens, 8 KV heads): threaded from 4K pages.
  LOCKS_REQUIRE(sc.per_thread >= impl::select_scratch_bytes(M), "scratch too small");
#pragma omp parallel num_threads(sc.threads) if (groups * M >= 4096)
  {
    detail::Carver carver(sc.slice(omp_get_thread_num()));
    char* chosen = carver.take<char>(size_t(M));
    int32_t* cand = carver.take<int32_t>(size_t(M));
    double* cum = carver.take<double>(size_t(M));  // hi + 1 <= full <= M entries
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < groups; ++bg) {
      const int b = static_cast<int>(bg / num_kv_heads);
      const int32_t len = batch.seq_lens[b];
      const int n_pages = rules::num_pages(len, P);
      const int full = rules::full_pages(len, P);
      const float* s = group_scores + bg * M;
      int32_t* pages = out.pages + bg * out.capacity;
      std::fill(chosen, chosen + n_pages, 0);
      if (rules::selects_all(cfg.budget_tokens, len, cfg.dense_below)) {
        std::fill(chosen, chosen + n_pages, 1);
      } else {
        const int k = int(rules::budget_pages(cfg.budget_tokens, P));  // < n_pages here
        int taken = 0;
        auto take = [&](int j) {
          if (!chosen[size_t(j)]) {
            chosen[size_t(j)] = 1;
            ++taken;
          }
        };
        if (full < n_pages) take(full);  // partial tail page
        for (int j = 0; j < std::min(cfg.sink_pages, full); ++j) take(j);
        for (int j = std::max(0, full - cfg.recent_pages); j < full; ++j) take(j);
        const int slots = k - taken;  // >= 0 (validate_select) and < candidates
        int nc = 0;
        for (int j = 0; j < full; ++j)
          if (!chosen[size_t(j)]) cand[size_t(nc++)] = j;
        if (slots > 0) {
          auto better = [s](int32_t x, int32_t y) {
            return s[x] > s[y] || (s[x] == s[y] && x < y);  // ties to the lower index
          };
          std::nth_element(cand, cand + (slots - 1), cand + nc, better);
          const int keep =
              cfg.tau > 0 ? adaptive_keep(s, full, chosen, cand, slots, cfg, cum) : slots;
          for (int i = 0; i < keep; ++i) take(cand[size_t(i)]);
        }
      }
      int count = 0;
      for (int j = 0; j < n_pages; ++j)
        if (chosen[size_t(j)]) pages[count++] = j;
      for (int i = count; i < out.capacity; ++i) pages[i] = -1;
      out.counts[bg] = count;
    }
  }
}

}  // namespace cpu
}  // namespace locks

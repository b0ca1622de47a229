// Reference page selection: the rules of select.h applied literally, candidates ranked by a
// full sort (score descending, then logical index ascending).
#include <algorithm>
#include <cmath>
#include <vector>

#include "checks.h"
#include "locks/error.h"
#include "locks/reference.h"

namespace locks::ref {

void select_pages(const double* group_scores, const BatchView& batch, int num_kv_heads,
                  int page_size, const SelectConfig& cfg, const Selection& out) {
  LOCKS_REQUIRE(group_scores != nullptr, "group_scores must not be null");
  LOCKS_REQUIRE(out.pages != nullptr && out.counts != nullptr && out.capacity >= 1,
                "selection output must not be null/empty");
  LOCKS_REQUIRE(num_kv_heads >= 1, "num_kv_heads must be >= 1");
  LOCKS_REQUIRE(page_size >= 2 && page_size <= 256, "page_size must be in [2, 256]");
  LOCKS_REQUIRE(batch.block_table != nullptr && batch.seq_lens != nullptr && batch.batch_size >= 1,
                "bad batch");
  LOCKS_REQUIRE(cfg.sink_pages >= 0 && cfg.recent_pages >= 0 && cfg.budget_tokens >= 0,
                "budget, sink_pages and recent_pages must be >= 0");
  LOCKS_REQUIRE(cfg.dense_below >= 0, "dense_below must be >= 0");
  const int k = cfg.budget_tokens / page_size;
  LOCKS_REQUIRE(k >= cfg.sink_pages + cfg.recent_pages + 1, "budget of ", k,
                " pages is below sink + recent + tail = ", cfg.sink_pages + cfg.recent_pages + 1);
  LOCKS_REQUIRE(cfg.tau == 0 || (cfg.tau > 0 && cfg.tau <= 1), "tau must be 0 or in (0, 1]");
  LOCKS_REQUIRE(cfg.floor_pages >= 0, "floor_pages must be >= 0");
  const int M = batch.max_blocks_per_seq;

  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t len = batch.seq_lens[b];
    LOCKS_REQUIRE(len >= 1 && int64_t(len) <= int64_t(M) * page_size, "seq_lens[", b,
                  "] out of range");
    const int n_pages = int(detail::num_pages(len, page_size));
    const int n_full = len / page_size;
    for (int g = 0; g < num_kv_heads; ++g) {
      const double* s = group_scores + (int64_t(b) * num_kv_heads + g) * M;
      std::vector<int> chosen;
      if (cfg.budget_tokens >= len || len < cfg.dense_below) {  // select.h's rule, literally
        for (int j = 0; j < n_pages; ++j) chosen.push_back(j);
      } else {
        // Here n_pages > k >= sink + recent + 1, so tail, sink and recent pages are distinct.
        std::vector<bool> taken(n_pages, false);
        if (n_full < n_pages) taken[n_full] = true;  // the partial tail page
        for (int j = 0; j < cfg.sink_pages; ++j) taken[j] = true;
        for (int j = n_full - cfg.recent_pages; j < n_full; ++j) taken[j] = true;
        std::vector<int> cand;
        for (int j = 0; j < n_full; ++j) {
          if (taken[j]) continue;
          LOCKS_REQUIRE(!std::isnan(s[j]), "group score is NaN");
          cand.push_back(j);
        }
        const int fixed = int(std::count(taken.begin(), taken.end(), true));
        std::sort(cand.begin(), cand.end(),
                  [&](int a, int c) { return s[a] != s[c] ? s[a] > s[c] : a < c; });
        int extra = std::min<int>(k - fixed, int(cand.size()));
        if (cfg.tau > 0) {
          // Adaptive budget, walked literally: add candidates in rank order until the floor
          // is met and the estimated mass of every taken full page covers tau of that of all
          // full pages (masses exp(s - max): the shift cancels in the ratio).
          double mx = -INFINITY;
          for (int j = 0; j < n_full; ++j) mx = std::max(mx, s[j]);
          double total = 0, covered = 0;
          for (int j = 0; j < n_full; ++j) {
            total += std::exp(s[j] - mx);
            if (taken[j]) covered += std::exp(s[j] - mx);
          }
          int m = 0;
          while (m < extra && (m < cfg.floor_pages || !(covered >= cfg.tau * total)))
            covered += std::exp(s[cand[m++]] - mx);
          extra = m;
        }
        for (int i = 0; i < extra; ++i) taken[cand[i]] = true;
        for (int j = 0; j < n_pages; ++j)
          if (taken[j]) chosen.push_back(j);
      }
      LOCKS_REQUIRE(int(chosen.size()) <= out.capacity, "selection capacity ", out.capacity,
                    " too small for ", chosen.size(), " pages");
      int32_t* row = out.pages + (int64_t(b) * num_kv_heads + g) * out.capacity;
      for (int i = 0; i < out.capacity; ++i) row[i] = i < int(chosen.size()) ? chosen[i] : -1;
      out.counts[int64_t(b) * num_kv_heads + g] = int32_t(chosen.size());
    }
  }
}

}  // namespace locks::ref

// cpu::select_groups (super_summary.h): which pages level 2 scores. Per (sequence, KV head)
// the groups' head scores are share-averaged over the query heads (score.h's rule, applied
// to groups), the m best complete groups are kept with the first groups and the groups of
// the sink and recent pages, and the open group (full pages after the last complete group) and the
// tail page are always in. Work per group is tiny (1/S of the pages), so this runs in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "internal/check.h"
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/super_summary.h"

namespace locks::cpu {

void select_groups(const float* group_head_scores, const SuperTableView& table,
                   const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                   int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                   uint8_t* page_mask) {
  validate_select(sel, page_size);
  validate_two_level(cfg);
  detail::check_batch_shape(batch, page_size, __func__);
  LOCKS_REQUIRE(group_pages >= 2 && group_pages <= 256, "group_pages must be in [2, 256], got ",
                group_pages);
  LOCKS_REQUIRE(num_kv_heads >= 1 && num_q_heads >= num_kv_heads && num_q_heads % num_kv_heads == 0,
                "num_q_heads (", num_q_heads, ") must be a positive multiple of num_kv_heads (",
                num_kv_heads, ")");
  LOCKS_REQUIRE(group_head_scores != nullptr && page_mask != nullptr,
                "group_head_scores / page_mask is null");
  const int S = group_pages, P = page_size, M = batch.max_blocks_per_seq;
  const int MG = table.max_groups_per_seq, G = num_q_heads / num_kv_heads;
  LOCKS_REQUIRE(MG >= (M + S - 1) / S, "super table holds ", MG,
                " groups, need ceil(max_blocks_per_seq / S) = ", (M + S - 1) / S);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < int64_t(batch.batch_size) * num_q_heads * MG; ++i)
    LOCKS_REQUIRE(!std::isnan(group_head_scores[i]), "group_head_scores[", i, "] is NaN");

  for (int64_t bg = 0; bg < int64_t(batch.batch_size) * num_kv_heads; ++bg) {
    const int b = int(bg / num_kv_heads), g = int(bg % num_kv_heads);
    const int32_t len = batch.seq_lens[b];
    const int n_pages = rules::num_pages(len, P), full = rules::full_pages(len, P);
    const int C = full / S;
    uint8_t* mask = page_mask + bg * M;
    std::fill(mask, mask + M, 0);
    const int m = groups_kept(cfg, sel, P, S, len);
    if (m < 0) {  // fallback: flat scoring of every page
      std::fill(mask, mask + n_pages, 1);
      continue;
    }
    // Share-averaging: a_j = log((1/G) sum_h exp(s_hj - LSE_h)) over the complete groups.
    std::vector<double> a(C, 0.0);
    for (int h = 0; h < G; ++h) {
      const float* s = group_head_scores + (int64_t(b) * num_q_heads + int64_t(g) * G + h) * MG;
      double mx = kNegInf;
      for (int j = 0; j < C; ++j) mx = std::max(mx, double(s[j]));
      if (mx == kNegInf) continue;
      double tot = 0;
      for (int j = 0; j < C; ++j) tot += std::exp(double(s[j]) - mx);
      const double lse = mx + std::log(tot);
      for (int j = 0; j < C; ++j) a[j] += std::exp(double(s[j]) - lse);
    }
    std::vector<char> keep(C, 0);
    auto force_page = [&](int p) {
      if (p >= 0 && p < C * S) keep[p / S] = 1;
    };
    for (int j = 0; j < std::min(cfg.first_groups, C); ++j) keep[j] = 1;
    for (int p = 0; p < std::min(sel.sink_pages, full); ++p) force_page(p);
    for (int p = std::max(0, full - sel.recent_pages); p < full; ++p) force_page(p);
    std::vector<int> order(C);
    std::iota(order.begin(), order.end(), 0);
    // Ties go to the lower group index, as select_pages does for pages.
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return a[x] > a[y]; });
    for (int i = 0; i < m; ++i) keep[order[i]] = 1;
    for (int j = 0; j < C; ++j)
      if (keep[j]) std::fill(mask + j * S, mask + (j + 1) * S, 1);
    std::fill(mask + C * S, mask + n_pages, 1);  // the open group and the tail
  }
}

}  // namespace locks::cpu

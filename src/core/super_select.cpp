// cpu::select_groups and select_groups_list (super_summary.h): which pages level 2 scores.
// Per (sequence, KV head) the groups' head scores are share-averaged over the query heads
// (score.h's rule, applied to groups); the forced groups (first groups, the groups of the
// sink and recent pages) are kept with the m best other complete groups, and the open group
// (full pages after the last complete group) and the tail page are always in. Work per
// group is tiny (1/S of the pages), so this runs in double.
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
namespace {

void check_args(const float* group_head_scores, const SuperTableView& table, const BatchView& batch,
                int num_q_heads, int num_kv_heads, int page_size, int group_pages,
                const SelectConfig& sel, const TwoLevelConfig& cfg, const char* where) {
  validate_select(sel, page_size);
  validate_two_level(cfg);
  detail::check_batch_shape(batch, page_size, where);
  LOCKS_REQUIRE(group_pages >= 2 && group_pages <= 256, "group_pages must be in [2, 256], got ",
                group_pages);
  LOCKS_REQUIRE(num_kv_heads >= 1 && num_q_heads >= num_kv_heads && num_q_heads % num_kv_heads == 0,
                "num_q_heads (", num_q_heads, ") must be a positive multiple of num_kv_heads (",
                num_kv_heads, ")");
  LOCKS_REQUIRE(group_head_scores != nullptr, "group_head_scores is null");
  const int S = group_pages, M = batch.max_blocks_per_seq, MG = table.max_groups_per_seq;
  LOCKS_REQUIRE(MG >= (M + S - 1) / S, "super table holds ", MG,
                " groups, need ceil(max_blocks_per_seq / S) = ", (M + S - 1) / S);
  for (int64_t i = 0; i < int64_t(batch.batch_size) * num_q_heads * MG; ++i)
    LOCKS_REQUIRE(!std::isnan(group_head_scores[i]), "group_head_scores[", i, "] is NaN");
}

// Rows of one call's group choice: sized once a call, reused by every (sequence, KV head).
struct KeepRows {
  std::vector<double> a;
  std::vector<char> keep;
  std::vector<int> order;
};

// The kept complete groups of (sequence b, KV head g) when the step is two-level (m >= 0):
// the forced groups and the m best others by the share-averaged score; in r.keep[0, C).
const std::vector<char>& kept_groups(const float* group_head_scores, int b, int g, int num_q_heads,
                                     int G, int MG, const ForcedGroups& f, int m, KeepRows& r) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  const int C = f.complete;
  // Share-averaging: a_j = log((1/G) sum_h exp(s_hj - LSE_h)) over the complete groups.
  std::vector<double>& a = r.a;
  a.assign(C, 0.0);
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
  std::vector<char>& keep = r.keep;
  keep.assign(C, 0);
  std::vector<int>& order = r.order;
  order.clear();
  for (int j = 0; j < C; ++j) {
    if (j < f.first_end || j >= f.recent_begin)
      keep[j] = 1;
    else
      order.push_back(j);
  }
  // Ties go to the lower group index, as select_pages does for pages.
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return a[x] > a[y]; });
  for (int i = 0; i < m; ++i) keep[order[i]] = 1;
  return keep;
}

}  // namespace

void select_groups(const float* group_head_scores, const SuperTableView& table,
                   const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                   int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                   uint8_t* page_mask) {
  check_args(group_head_scores, table, batch, num_q_heads, num_kv_heads, page_size, group_pages,
             sel, cfg, __func__);
  LOCKS_REQUIRE(page_mask != nullptr, "page_mask is null");
  const int S = group_pages, P = page_size, M = batch.max_blocks_per_seq;
  const int MG = table.max_groups_per_seq, G = num_q_heads / num_kv_heads;
  KeepRows rows;
  for (int64_t bg = 0; bg < int64_t(batch.batch_size) * num_kv_heads; ++bg) {
    const int b = int(bg / num_kv_heads), g = int(bg % num_kv_heads);
    const int32_t len = batch.seq_lens[b];
    const int n_pages = rules::num_pages(len, P);
    uint8_t* mask = page_mask + bg * M;
    std::fill(mask, mask + M, 0);
    const int m = groups_kept(cfg, sel, P, S, len);
    if (m < 0) {  // fallback: flat scoring of every page
      std::fill(mask, mask + n_pages, 1);
      continue;
    }
    const ForcedGroups f = forced_groups(cfg, sel, P, S, len);
    const std::vector<char>& keep =
        kept_groups(group_head_scores, b, g, num_q_heads, G, MG, f, m, rows);
    for (int j = 0; j < f.complete; ++j)
      if (keep[j]) std::fill(mask + j * S, mask + (j + 1) * S, 1);
    std::fill(mask + f.complete * S, mask + n_pages, 1);  // the open group and the tail
  }
}

void select_groups_list(const float* group_head_scores, const SuperTableView& table,
                        const BatchView& batch, int num_q_heads, int num_kv_heads, int page_size,
                        int group_pages, const SelectConfig& sel, const TwoLevelConfig& cfg,
                        int list_cap, int32_t* page_map, int32_t* list_lens) {
  check_args(group_head_scores, table, batch, num_q_heads, num_kv_heads, page_size, group_pages,
             sel, cfg, __func__);
  LOCKS_REQUIRE(page_map != nullptr && list_lens != nullptr, "page_map / list_lens is null");
  LOCKS_REQUIRE(list_cap >= 1, "list_cap must be >= 1, got ", list_cap);
  const int S = group_pages, P = page_size;
  const int MG = table.max_groups_per_seq, G = num_q_heads / num_kv_heads;
  // Every sequence's list length first, so that a bad call writes nothing.
  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t len = batch.seq_lens[b];
    const int m = groups_kept(cfg, sel, P, S, len);
    const int n_pages = rules::num_pages(len, P);
    const ForcedGroups f = forced_groups(cfg, sel, P, S, len);
    const int listed = m < 0 ? n_pages : (m + f.count) * S + n_pages - f.complete * S;
    LOCKS_REQUIRE(listed <= list_cap, "sequence ", b, " lists ", listed,
                  " pages, more than list_cap ", list_cap);
  }
  KeepRows rows;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t len = batch.seq_lens[b];
    const int n_pages = rules::num_pages(len, P);
    const int m = groups_kept(cfg, sel, P, S, len);
    const ForcedGroups f = forced_groups(cfg, sel, P, S, len);
    int listed = 0;
    for (int g = 0; g < num_kv_heads; ++g) {
      int32_t* map = page_map + (int64_t(b) * num_kv_heads + g) * list_cap;
      int n = 0;
      if (m < 0) {
        for (int p = 0; p < n_pages; ++p) map[n++] = p;
      } else {
        const std::vector<char>& keep =
            kept_groups(group_head_scores, b, g, num_q_heads, G, MG, f, m, rows);
        for (int j = 0; j < f.complete; ++j)
          if (keep[j])
            for (int p = j * S; p < (j + 1) * S; ++p) map[n++] = p;
        for (int p = f.complete * S; p < n_pages; ++p) map[n++] = p;
      }
      std::fill(map + n, map + list_cap, -1);
      listed = n;
    }
    list_lens[b] = int32_t(int64_t(len) - int64_t(n_pages - listed) * P);
  }
}

}  // namespace locks::cpu

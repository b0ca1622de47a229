// Super-page layout, storage and the kept-groups rule (super_summary.h).
#include <algorithm>
#include <cmath>

#include "locks/error.h"
#include "locks/rules.h"
#include "locks/super_summary.h"
#include "super_group_edge.h"

namespace locks {

void validate_super_layout(const SuperLayout& s) {
  LOCKS_REQUIRE(s.num_slots >= 0, "num_slots must be >= 0, got ", s.num_slots);
  LOCKS_REQUIRE(s.group_pages >= 2 && s.group_pages <= 256, "group_pages must be in [2, 256], got ",
                s.group_pages);
  LOCKS_REQUIRE(s.page_size >= 2 && s.page_size <= 256, "page_size must be in [2, 256], got ",
                s.page_size);
  LOCKS_REQUIRE(s.num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", s.num_kv_heads);
  LOCKS_REQUIRE(s.head_dim >= 2 && s.head_dim % 2 == 0, "head_dim must be even and >= 2, got ",
                s.head_dim);
  LOCKS_REQUIRE(s.rank >= 1 && s.rank <= 32 && s.rank <= s.head_dim,
                "super rank must be in [1, min(32, head_dim)], got ", s.rank);
}

size_t super_bytes_per_group(const SuperLayout& s) {
  validate_super_layout(s);
  const size_t d = s.head_dim, R = s.rank, S = s.group_pages;
  size_t b = d + 4;                      // centroid int8 + scale
  b += R * d / 2 + 4 * R;                // basis int4 + row scales
  b += S * R + 4 * R;                    // centroid coordinates int8 + per-k scales
  b += S + 4;                            // radii uint8 + scale
  if (s.extent) b += 2 * S * R + 4 * R;  // lo / hi int8 + per-k scales
  return b;
}

double super_bytes_per_page(const SuperLayout& s) {
  return double(super_bytes_per_group(s)) / s.group_pages;
}

SuperStore::SuperStore(const SuperLayout& layout) : layout_(layout) {
  validate_super_layout(layout);
  const size_t gh = size_t(layout.num_slots) * layout.num_kv_heads;
  const size_t d = layout.head_dim, R = layout.rank, S = layout.group_pages;
  mu_q_.assign(gh * d, 0);
  mu_scale_.assign(gh, 0.0f);
  basis_q_.assign(gh * R * (d / 2), 0);
  basis_scale_.assign(gh * R, 0.0f);
  coord_q_.assign(gh * S * R, 0);
  coord_scale_.assign(gh * R, 0.0f);
  radius_q_.assign(gh * S, 0);
  radius_scale_.assign(gh, 0.0f);
  if (layout.extent) {
    lo_q_.assign(gh * S * R, 0);
    hi_q_.assign(gh * S * R, 0);
    extent_scale_.assign(gh * R, 0.0f);
  }
}

SuperView SuperStore::view() {
  SuperView v;
  v.layout = layout_;
  v.mu_q = mu_q_.data();
  v.mu_scale = mu_scale_.data();
  v.basis_q = basis_q_.data();
  v.basis_scale = basis_scale_.data();
  v.coord_q = coord_q_.data();
  v.coord_scale = coord_scale_.data();
  v.radius_q = radius_q_.data();
  v.radius_scale = radius_scale_.data();
  if (layout_.extent) {
    v.lo_q = lo_q_.data();
    v.hi_q = hi_q_.data();
    v.extent_scale = extent_scale_.data();
  }
  return v;
}

void validate_two_level(const TwoLevelConfig& cfg) {
  LOCKS_REQUIRE(cfg.min_groups >= 1, "min_groups must be >= 1, got ", cfg.min_groups);
  LOCKS_REQUIRE(std::isfinite(cfg.alpha) && cfg.alpha >= 1.0,
                "alpha must be finite and >= 1 (kept groups must hold the budget), got ",
                cfg.alpha);
  LOCKS_REQUIRE(cfg.first_groups >= 0, "first_groups must be >= 0, got ", cfg.first_groups);
  LOCKS_REQUIRE(cfg.flat_below_groups >= 0, "flat_below_groups must be >= 0, got ",
                cfg.flat_below_groups);
  LOCKS_REQUIRE(std::isfinite(cfg.gamma) && cfg.gamma >= 0.0, "gamma must be finite and >= 0, got ",
                cfg.gamma);
}

ForcedGroups forced_groups(const TwoLevelConfig& cfg, const SelectConfig& sel, int page_size,
                           int group_pages, int64_t len_tokens) {
  const int64_t full = rules::full_pages(len_tokens, page_size);
  const int64_t C = full / group_pages, listed = C * group_pages;
  ForcedGroups f;
  f.complete = int(C);
  // Sink pages [0, min(sink, full)) and first groups: a prefix of the complete groups.
  const int64_t sink_end = std::min<int64_t>({int64_t(std::max(sel.sink_pages, 0)), full, listed});
  f.first_end = int(std::min<int64_t>(
      C, std::max<int64_t>(cfg.first_groups, (sink_end + group_pages - 1) / group_pages)));
  // Recent pages [full - recent, full): a suffix of the complete groups, when any lies in one.
  const int64_t recent_start = std::max<int64_t>(0, full - std::max(sel.recent_pages, 0));
  f.recent_begin =
      sel.recent_pages > 0 && recent_start < listed ? int(recent_start / group_pages) : int(C);
  f.count = f.first_end + (f.complete - f.recent_begin) - std::max(0, f.first_end - f.recent_begin);
  return f;
}

int forced_groups_max(const TwoLevelConfig& cfg, const SelectConfig& sel, int group_pages) {
  const int S = group_pages;
  const int first = std::max(cfg.first_groups, (std::max(sel.sink_pages, 0) + S - 1) / S);
  // r consecutive pages touch at most floor((S - 1 + r - 1) / S) + 1 groups.
  const int recent = sel.recent_pages > 0 ? (S + sel.recent_pages - 2) / S + 1 : 0;
  return first + recent;
}

int groups_kept(const TwoLevelConfig& cfg, const SelectConfig& sel, int page_size, int group_pages,
                int64_t len_tokens) {
  validate_two_level(cfg);
  LOCKS_REQUIRE(page_size >= 1 && group_pages >= 1, "page_size and group_pages must be >= 1");
  if (rules::selects_all(sel.budget_tokens, len_tokens, sel.dense_below)) return -1;
  const int complete = rules::full_pages(len_tokens, page_size) / group_pages;
  if (complete < cfg.flat_below_groups) return -1;
  const int64_t k = rules::budget_pages(sel.budget_tokens, page_size);
  const double want = std::ceil(cfg.alpha * double(k) / group_pages);
  if (want >= complete) return -1;
  const int m = std::max(cfg.min_groups, int(want));
  const int forced = forced_groups(cfg, sel, page_size, group_pages, len_tokens).count;
  if (int64_t(m) + forced >= complete) return -1;
  return m;
}

int two_level_list_capacity(const TwoLevelConfig& cfg, const SelectConfig& sel, int page_size,
                            int group_pages, int max_blocks_per_seq) {
  validate_two_level(cfg);
  LOCKS_REQUIRE(page_size >= 1 && group_pages >= 1 && max_blocks_per_seq >= 1,
                "page_size, group_pages and max_blocks_per_seq must be >= 1");
  const int64_t k = rules::budget_pages(sel.budget_tokens, page_size);
  // Capped before the multiplication: a list never exceeds max_blocks_per_seq.
  const double want = std::min(std::ceil(cfg.alpha * double(k) / group_pages), 1e9);
  const int64_t m = std::max<int64_t>(cfg.min_groups, int64_t(want));
  const int64_t groups =
      std::max<int64_t>(m + forced_groups_max(cfg, sel, group_pages), cfg.flat_below_groups) + 1;
  return int(std::min<int64_t>(max_blocks_per_seq, groups * group_pages));
}

StepBytes two_level_step_bytes(const SuperLayout& super, const SummaryLayout& pages,
                               const TwoLevelConfig& cfg, const SelectConfig& sel, int64_t len) {
  validate_super_layout(super);
  validate_summary_layout(pages);
  LOCKS_REQUIRE(len >= 1, "len must be >= 1, got ", len);
  LOCKS_REQUIRE(super.page_size == pages.page_size && super.head_dim == pages.head_dim,
                "super and page layouts disagree on page size or head_dim");
  const int P = pages.page_size, S = super.group_pages;
  const double kv_token = 2.0 * 2.0 * pages.head_dim;  // bf16 K and V
  const double page_b = double(summary_bytes_per_page(pages));
  const int64_t full = rules::full_pages(len, P), complete = full / S;
  StepBytes r;
  r.dense = double(len) * kv_token;
  r.attended = double(std::min<int64_t>(sel.budget_tokens, len)) * kv_token;
  r.flat = rules::selects_all(sel.budget_tokens, len, sel.dense_below) ? r.dense
                                                                       : full * page_b + r.attended;
  if (rules::selects_all(sel.budget_tokens, len, sel.dense_below)) {
    r.attended = r.dense;
    return r;
  }
  const int m = groups_kept(cfg, sel, P, S, len);
  if (m < 0) {
    r.level2 = full * page_b;
    return r;
  }
  const int64_t kept = m + forced_groups(cfg, sel, P, S, len).count;
  r.level1 = double(complete) * double(super_bytes_per_group(super));
  r.level2 = double(kept * S + (full - complete * S)) * page_b;
  return r;
}

namespace detail {

int check_filled_args(const SuperLayout& l, const BatchView& batch, int appended,
                      const SuperTableView& table, const char* where) {
  validate_super_layout(l);
  const int S = l.group_pages, P = l.page_size;
  if (!(appended >= 1 && appended <= S * P))
    fail(where, "appended must be in [1, S x page_size = ", S * P, "], got ", appended);
  if (!(batch.batch_size >= 1 && batch.block_table && batch.seq_lens))
    fail(where, "batch is empty or has null arrays");
  if (!(batch.max_blocks_per_seq >= 1 && batch.block_table_stride >= batch.max_blocks_per_seq))
    fail(where, "block_table_stride ", batch.block_table_stride, " < max_blocks_per_seq ",
         batch.max_blocks_per_seq);
  if (table.table == nullptr) fail(where, "super table is null");
  const int groups = batch.max_blocks_per_seq / S;  // complete groups at most
  if (!(table.max_groups_per_seq >= groups && table.stride >= table.max_groups_per_seq))
    fail(where, "super table: max_groups_per_seq ", table.max_groups_per_seq, " (stride ",
         table.stride, ") must be >= ", groups, " and <= its stride");
  return groups;
}

}  // namespace detail
}  // namespace locks

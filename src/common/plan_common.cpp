// plan_common and the run-time checks shared by cpu:: and cuda:: (plan_common.h).
#include "plan_common.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "locks/error.h"
#include "locks/rules.h"

namespace locks {

DecodeShape decode_shape(const DecodeParams& p) {
  DecodeShape s;
  s.head_dim = p.cache.head_dim;
  s.page_size = p.cache.page_size;
  s.group = p.cache.num_kv_heads >= 1 ? p.num_q_heads / p.cache.num_kv_heads : 0;
  s.kv_dtype = p.cache.dtype;
  s.rank = p.summary.rank;
  s.precision = p.summary.precision;
  return s;
}

namespace detail {

DecodePlan plan_common(const DecodeParams& params, Backend backend) {
  const CacheLayout& L = params.cache;
  const SummaryLayout& S = params.summary;
  validate_layout(L);
  LOCKS_REQUIRE(params.num_q_heads >= 1 && params.num_q_heads % L.num_kv_heads == 0, "num_q_heads ",
                params.num_q_heads, " is not a positive multiple of num_kv_heads ", L.num_kv_heads);
  LOCKS_REQUIRE(S.num_blocks == L.num_blocks && S.page_size == L.page_size &&
                    S.num_kv_heads == L.num_kv_heads && S.head_dim == L.head_dim,
                "params.summary's geometry (num_blocks ", S.num_blocks, ", page_size ", S.page_size,
                ", num_kv_heads ", S.num_kv_heads, ", head_dim ", S.head_dim,
                ") differs from the cache's (use summary_layout_for)");
  validate_summary_layout(S);
  LOCKS_REQUIRE(params.max_batch >= 1, "max_batch must be >= 1, got ", params.max_batch);
  LOCKS_REQUIRE(params.max_blocks_per_seq >= 1, "max_blocks_per_seq must be >= 1, got ",
                params.max_blocks_per_seq);
  LOCKS_REQUIRE(params.scale >= 0.0f && std::isfinite(params.scale),
                "scale must be 0 (meaning 1/sqrt(head_dim)) or positive and finite, got ",
                params.scale);
  validate_select(params.select, L.page_size);
  require_supported(backend, decode_shape(params));
  DecodePlan plan;
  plan.params = params;
  if (plan.params.scale == 0.0f) plan.params.scale = 1.0f / std::sqrt(float(L.head_dim));
  plan.backend = backend;
  plan.group = params.num_q_heads / L.num_kv_heads;
  plan.capacity = rules::select_capacity(params.select.budget_tokens, L.page_size,
                                         params.max_blocks_per_seq, params.select.dense_below);
  if (params.two_level) {
    const SuperLayout& U = params.super;
    const TwoLevelConfig& T = params.two;
    validate_super_layout(U);
    validate_two_level(T);
    LOCKS_REQUIRE(
        U.page_size == L.page_size && U.num_kv_heads == L.num_kv_heads && U.head_dim == L.head_dim,
        "params.super's geometry (page_size ", U.page_size, ", num_kv_heads ", U.num_kv_heads,
        ", head_dim ", U.head_dim, ") differs from the cache's");
    LOCKS_REQUIRE(!T.use_extent || U.extent, "two.use_extent needs a super layout with extent");
    LOCKS_REQUIRE(params.select.dense_below <= params.select.budget_tokens,
                  "the two-level step needs dense_below <= budget_tokens (got ",
                  params.select.dense_below, " > ", params.select.budget_tokens,
                  "): its page list holds the budget's groups, not a whole short sequence; use "
                  "the flat step for a minimum context above the budget");
    LOCKS_REQUIRE(params.select.tau == 0.0f,
                  "the two-level step needs the fixed budget (tau = 0), got tau ",
                  params.select.tau,
                  ": the adaptive budget's mass search needs every page's score, level 2 "
                  "scores only the listed pages");
    // The listed tokens must exceed the budget whenever the step is two-level, so that the
    // selection over the list takes floor(b / P) pages as the masked one does: guaranteed
    // by a forced first group or sink page, or by m S > floor(b / P).
    const int S = U.group_pages;
    const int64_t k = rules::budget_pages(params.select.budget_tokens, L.page_size);
    const int64_t m =
        std::max<int64_t>(T.min_groups, int64_t(std::min(std::ceil(T.alpha * double(k) / S), 1e9)));
    LOCKS_REQUIRE(T.first_groups >= 1 || params.select.sink_pages >= 1 || m * S > k,
                  "the two-level step needs first_groups >= 1, sink_pages >= 1 or kept groups "
                  "holding more pages than the budget's slots (m S > floor(b / P))");
    plan.list_cap =
        two_level_list_capacity(T, params.select, L.page_size, S, params.max_blocks_per_seq);
    plan.max_groups = (params.max_blocks_per_seq + S - 1) / S;
  }
  return plan;
}

void check_plan_backend(const DecodePlan& plan, Backend backend, const char* where) {
  if (plan.backend != backend)
    fail(where, "the plan is for backend ", backend_name(plan.backend), ", not ",
         backend_name(backend));
}

void check_regions(const DecodePlan& plan, const RegionNeed* regions, size_t n, const char* where) {
  // [offset, end) of the non-empty regions, on the stack: run calls do not allocate.
  std::array<std::pair<int64_t, int64_t>, kMaxRegions> spans;
  size_t m = 0;
  if (n > kMaxRegions) fail(where, "plan: ", n, " regions (at most ", kMaxRegions, ")");
  for (size_t i = 0; i < n; ++i) {
    const WorkspaceRegion& r = *regions[i].first;
    const int64_t need = regions[i].second;
    if (r.bytes < need || r.offset < 0 || r.offset % 256 != 0 ||
        uint64_t(r.offset) + uint64_t(r.bytes) > plan.workspace_bytes)
      fail(where, "plan: a workspace region of ", r.bytes, " bytes at ", r.offset, " (needs ", need,
           " within ", plan.workspace_bytes, ")");
    if (r.bytes > 0) spans[m++] = {r.offset, r.offset + r.bytes};
  }
  std::sort(spans.begin(), spans.begin() + m);
  for (size_t i = 1; i < m; ++i)
    if (spans[i].first < spans[i - 1].second) fail(where, "plan: workspace regions overlap");
}

void check_workspace(const DecodePlan& plan, const Workspace& ws, const char* where) {
  if (plan.workspace_bytes > 0 && ws.data == nullptr) fail(where, "workspace is null");
  if (ws.bytes < plan.workspace_bytes)
    fail(where, "workspace of ", ws.bytes, " bytes < the plan's workspace_bytes ",
         plan.workspace_bytes);
  if ((reinterpret_cast<uintptr_t>(ws.data) & 255u) != 0)
    fail(where, "workspace must be 256-byte aligned");
}

void check_run_batch(const DecodePlan& plan, const BatchView& batch, const char* where) {
  const DecodeParams& p = plan.params;
  if (batch.batch_size < 1 || batch.batch_size > p.max_batch)
    fail(where, "batch_size ", batch.batch_size, " outside [1, max_batch = ", p.max_batch, "]");
  if (batch.max_blocks_per_seq < 1 || batch.max_blocks_per_seq > p.max_blocks_per_seq)
    fail(where, "batch.max_blocks_per_seq ", batch.max_blocks_per_seq, " outside [1, planned ",
         p.max_blocks_per_seq, "]");
  if (batch.block_table_stride < batch.max_blocks_per_seq)
    fail(where, "block_table_stride ", batch.block_table_stride, " < max_blocks_per_seq ",
         batch.max_blocks_per_seq);
  if (batch.block_table == nullptr || batch.seq_lens == nullptr)
    fail(where, "batch.block_table or batch.seq_lens is null");
}

void check_run_cache(const DecodePlan& plan, const CacheLayout& L, const char* where) {
  const CacheLayout& P = plan.params.cache;
  if (L.num_blocks != P.num_blocks || L.page_size != P.page_size ||
      L.num_kv_heads != P.num_kv_heads || L.head_dim != P.head_dim || L.dtype != P.dtype)
    fail(where, "cache layout differs from the planned one");
}

void check_run_summary(const DecodePlan& plan, const SummaryLayout& S, const char* where) {
  const SummaryLayout& P = plan.params.summary;
  if (S.num_blocks != P.num_blocks || S.page_size != P.page_size ||
      S.num_kv_heads != P.num_kv_heads || S.head_dim != P.head_dim || S.rank != P.rank ||
      S.precision != P.precision || S.basis_group != P.basis_group)
    fail(where, "summary layout (rank ", S.rank, ", ", precision_name(S.precision),
         ", basis_group ", S.basis_group, ") differs from the planned one (rank ", P.rank, ", ",
         precision_name(P.precision), ", basis_group ", P.basis_group, ")");
}

void check_run_super(const DecodePlan& plan, const SuperLayout& U, const SuperTableView& table,
                     const char* where) {
  const SuperLayout& P = plan.params.super;
  if (U.group_pages != P.group_pages || U.page_size != P.page_size ||
      U.num_kv_heads != P.num_kv_heads || U.head_dim != P.head_dim || U.rank != P.rank ||
      U.extent != P.extent || U.num_slots != P.num_slots)
    fail(where, "super layout differs from the planned one");
  if (table.table == nullptr || table.max_groups_per_seq < plan.max_groups ||
      table.stride < table.max_groups_per_seq)
    fail(where, "super table is null or holds ", table.max_groups_per_seq,
         " groups a sequence (stride ", table.stride, "), the plan needs ", plan.max_groups);
}

void check_run_query(const DecodePlan& plan, const QueryView& q, const char* where) {
  if (q.q == nullptr) fail(where, "q is null");
  if (!dtype_known(q.dtype)) fail(where, "q: unknown dtype code ", static_cast<int>(q.dtype));
  const int64_t row = int64_t(plan.params.num_q_heads) * plan.params.cache.head_dim;
  if (q.stride != 0 && q.stride < row)
    fail(where, "q.stride ", q.stride, " is below one sequence's num_q_heads * head_dim = ", row);
  if (q.num_q_heads != plan.params.num_q_heads)
    fail(where, "num_q_heads ", q.num_q_heads, " differs from the planned ",
         plan.params.num_q_heads);
}

}  // namespace detail
}  // namespace locks

// The decode contract on the CPU (contract.h): plan_decode sizes one workspace for the
// step's buffers (scores, selection, attention chunk states) and every thread's scratch;
// the run calls check the call against the plan and run the ops of score.h, select.h and
// attention.h on slices of that workspace.
#include "locks/contract.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "internal/check.h"
#include "internal/ops.h"
#include "locks/error.h"
#include "plan_common.h"

namespace locks::cpu {
namespace {

using detail::region_ptr;

detail::ThreadScratch thread_scratch(const DecodePlan& plan, const Workspace& ws) {
  detail::ThreadScratch sc;
  sc.base = region_ptr<std::byte>(ws, plan.scratch);
  sc.threads = plan.threads;
  sc.per_thread = size_t(plan.scratch.bytes) / size_t(plan.threads);
  return sc;
}

constexpr size_t kRegions = 10, kTwoLevelRegions = 4;  // the last four: the two-level step's

// The CPU plan's workspace regions in layout order (plan_decode's), with the bytes the run
// calls index in each. The scratch and attention sizes come from the ops' own rules, called
// only once the plain regions are known to fit the plan's workspace (bounded arguments).
template <typename Plan>
auto regions_of(Plan& plan, bool sized_by_ops) {
  using R = std::conditional_t<std::is_const_v<Plan>, const WorkspaceRegion, WorkspaceRegion>;
  using detail::sat_product;
  const DecodeParams& p = plan.params;
  const int64_t B = p.max_batch, Hq = p.num_q_heads, Hkv = p.cache.num_kv_heads,
                M = p.max_blocks_per_seq, two = p.two_level ? 1 : 0;
  int64_t shared = 0, scratch = 0;
  if (sized_by_ops) {
    const int Bi = p.max_batch, Mi = p.max_blocks_per_seq, d = p.cache.head_dim;
    const int P = p.cache.page_size, r = p.summary.rank, G = plan.group;
    shared = int64_t(impl::attention_shared_bytes(Bi, int(Hkv), int(Hq), Mi, d));
    const size_t per_thread = detail::align_up(
        std::max({impl::score_scratch_bytes(G, r, d, P), impl::aggregate_scratch_bytes(G, Mi),
                  impl::select_scratch_bytes(Mi), impl::attention_scratch_bytes(P, d, G)}));
    scratch = sat_product({int64_t(per_thread), plan.threads});
  }
  return std::array<std::pair<R*, int64_t>, kRegions>{{
      {&plan.head_scores, sat_product({B, Hq, M, 4})},
      {&plan.group_scores, sat_product({B, Hkv, M, 4})},
      {&plan.pages, sat_product({B, Hkv, plan.capacity, 4})},
      {&plan.counts, sat_product({B, Hkv, 4})},
      {&plan.part_o, shared},  // the attention's chunk bookkeeping and states
      {&plan.scratch, scratch},
      {&plan.super_scores, sat_product({two, B, Hq, plan.max_groups, 4})},
      {&plan.page_map, sat_product({two, B, Hkv, plan.list_cap, 4})},
      {&plan.list_blocks, sat_product({two, B, Hkv, plan.list_cap, 4})},
      {&plan.list_lens, sat_product({two, B, 4})},
  }};
}

// A plan vector is caller input (plan.h): its regions must hold what the run indexes.
void check_plan_regions(const DecodePlan& plan, const char* where) {
  const auto plain = regions_of(plan, false);
  detail::check_regions(plan, plain.data(), plain.size(), where);
  const auto sized = regions_of(plan, true);
  detail::check_regions(plan, sized.data(), sized.size(), where);
}

// The whole step selects into the workspace and copies the selection to the caller's
// selection_out only once the attention has run: a call that fails writes neither.
void check_selection_out(const DecodePlan& plan, const Selection* selection_out) {
  if (!selection_out) return;
  LOCKS_REQUIRE(selection_out->capacity == plan.capacity, "selection_out capacity ",
                selection_out->capacity, " differs from the plan's ", plan.capacity);
  LOCKS_REQUIRE(selection_out->pages && selection_out->counts, "selection_out is null");
}

Selection workspace_selection(const DecodePlan& plan, const Workspace& ws) {
  return {region_ptr<int32_t>(ws, plan.pages), region_ptr<int32_t>(ws, plan.counts), plan.capacity};
}

void publish_selection(const Selection& from, const Selection* to, int64_t rows) {
  if (!to) return;
  std::copy_n(from.counts, rows, to->counts);
  std::copy_n(from.pages, rows * from.capacity, to->pages);
}

void check_call(const DecodePlan& plan, const Workspace& ws, const BatchView& batch,
                const char* where) {
  detail::check_plan_backend(plan, Backend::cpu, where);
  detail::check_workspace(plan, ws, where);
  check_plan_regions(plan, where);
  detail::check_run_batch(plan, batch, where);
}

// score -> aggregate -> select with the scores in the plan's workspace (score_select and the
// step; the caller checked the call).
void select_in_workspace(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                         const BatchView& batch, const QueryView& q, const Selection& out) {
  const DecodeParams& p = plan.params;
  const detail::ThreadScratch sc = thread_scratch(plan, ws);
  float* hs = region_ptr<float>(ws, plan.head_scores);
  float* gs = region_ptr<float>(ws, plan.group_scores);
  impl::score_pages(summaries, batch, q, p.scale, hs, sc);
  impl::aggregate_gqa(hs, batch, p.num_q_heads, p.cache.num_kv_heads, gs, sc);
  impl::select_pages(gs, batch, p.cache.num_kv_heads, p.cache.page_size, p.select, out, sc);
}

}  // namespace

DecodePlan plan_decode(const DecodeParams& params) {
  DecodePlan plan = detail::plan_common(params, Backend::cpu);
  const DecodeParams& p = plan.params;
  plan.threads = std::max(1, omp_get_max_threads());
  detail::RegionAlloc a;
  const auto regions = regions_of(plan, true);
  const size_t n = p.two_level ? kRegions : kRegions - kTwoLevelRegions;
  for (size_t i = 0; i < n; ++i) *regions[i].first = a.add(regions[i].second);
  plan.workspace_bytes = size_t(a.total());
  return plan;
}

void score_pages(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                 const BatchView& batch, const QueryView& q, float* head_scores) {
  check_call(plan, ws, batch, __func__);
  detail::check_run_summary(plan, summaries.layout, __func__);
  detail::check_run_query(plan, q, __func__);
  impl::score_pages(summaries, batch, q, plan.params.scale, head_scores, thread_scratch(plan, ws));
}

void aggregate_gqa(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                   const float* head_scores, float* group_scores) {
  check_call(plan, ws, batch, __func__);
  impl::aggregate_gqa(head_scores, batch, plan.params.num_q_heads, plan.params.cache.num_kv_heads,
                      group_scores, thread_scratch(plan, ws));
}

void select_pages(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                  const float* group_scores, const Selection& out) {
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(out.capacity == plan.capacity, "selection capacity ", out.capacity,
                " differs from the plan's ", plan.capacity);
  impl::select_pages(group_scores, batch, plan.params.cache.num_kv_heads,
                     plan.params.cache.page_size, plan.params.select, out,
                     thread_scratch(plan, ws));
}

void aggregate_select(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                      const float* head_scores, float* group_scores, const Selection& out) {
  // Both ops' checks once, first, so that a bad call writes nothing.
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(out.capacity == plan.capacity, "selection capacity ", out.capacity,
                " differs from the plan's ", plan.capacity);
  const DecodeParams& p = plan.params;
  const detail::ThreadScratch sc = thread_scratch(plan, ws);
  impl::aggregate_gqa(head_scores, batch, p.num_q_heads, p.cache.num_kv_heads, group_scores, sc);
  impl::select_pages(group_scores, batch, p.cache.num_kv_heads, p.cache.page_size, p.select, out,
                     sc);
}

void score_select(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                  const BatchView& batch, const QueryView& q, const Selection& out) {
  // Every check first, so that a bad call writes nothing.
  check_call(plan, ws, batch, __func__);
  detail::check_run_summary(plan, summaries.layout, __func__);
  detail::check_run_query(plan, q, __func__);
  LOCKS_REQUIRE(out.pages && out.counts, "selection arrays are null");
  LOCKS_REQUIRE(out.capacity == plan.capacity, "selection capacity ", out.capacity,
                " differs from the plan's ", plan.capacity);
  select_in_workspace(plan, ws, summaries, batch, q, out);
}

void decode_attention_sparse(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                             const BatchView& batch, const QueryView& q, const Selection& sel,
                             const AttentionOutput& out) {
  check_call(plan, ws, batch, __func__);
  detail::check_run_cache(plan, cache.layout, __func__);
  detail::check_run_query(plan, q, __func__);
  LOCKS_REQUIRE(sel.capacity <= plan.capacity, "selection capacity ", sel.capacity,
                " exceeds the plan's ", plan.capacity);
  impl::decode_attention(cache, batch, q, plan.params.scale, &sel, out, thread_scratch(plan, ws),
                         region_ptr<std::byte>(ws, plan.part_o), size_t(plan.part_o.bytes));
}

void decode_attention_dense(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                            const BatchView& batch, const QueryView& q,
                            const AttentionOutput& out) {
  check_call(plan, ws, batch, __func__);
  detail::check_run_cache(plan, cache.layout, __func__);
  detail::check_run_query(plan, q, __func__);
  impl::decode_attention(cache, batch, q, plan.params.scale, nullptr, out, thread_scratch(plan, ws),
                         region_ptr<std::byte>(ws, plan.part_o), size_t(plan.part_o.bytes));
}

void decode(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
            const SummaryView& summaries, const BatchView& batch, const QueryView& q,
            const AttentionOutput& out, const Selection* selection_out) {
  check_call(plan, ws, batch, __func__);
  detail::check_run_cache(plan, cache.layout, __func__);
  detail::check_run_summary(plan, summaries.layout, __func__);
  detail::check_run_query(plan, q, __func__);
  validate_cache(cache);
  LOCKS_REQUIRE(out.out != nullptr, "out.out is null");
  check_selection_out(plan, selection_out);
  const Selection sel = workspace_selection(plan, ws);
  const DecodeParams& p = plan.params;
  select_in_workspace(plan, ws, summaries, batch, q, sel);
  impl::decode_attention(cache, batch, q, p.scale, &sel, out, thread_scratch(plan, ws),
                         region_ptr<std::byte>(ws, plan.part_o), size_t(plan.part_o.bytes));
  publish_selection(sel, selection_out, int64_t(batch.batch_size) * p.cache.num_kv_heads);
}

void decode_two_level(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                      const SummaryView& summaries, const SuperView& supers,
                      const SuperTableView& super_table, const BatchView& batch, const QueryView& q,
                      const AttentionOutput& out, const Selection* selection_out) {
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(plan.params.two_level, "decode_two_level needs a plan with params.two_level");
  detail::check_run_cache(plan, cache.layout, __func__);
  detail::check_run_summary(plan, summaries.layout, __func__);
  detail::check_run_query(plan, q, __func__);
  const DecodeParams& p = plan.params;
  detail::check_run_super(plan, supers.layout, super_table, __func__);
  validate_cache(cache);
  detail::check_batch_blocks(batch, cache.layout.num_blocks, cache.layout.page_size, __func__);
  LOCKS_REQUIRE(out.out != nullptr, "out.out is null");
  check_selection_out(plan, selection_out);
  const Selection sel = workspace_selection(plan, ws);
  const int B = batch.batch_size, Hkv = p.cache.num_kv_heads, Hq = p.num_q_heads;
  const int P = p.cache.page_size, S = p.super.group_pages, L = plan.list_cap;
  const SuperTableView table{super_table.table, super_table.stride, plan.max_groups};
  float* gh = region_ptr<float>(ws, plan.super_scores);
  int32_t* map = region_ptr<int32_t>(ws, plan.page_map);
  int32_t* lblk = region_ptr<int32_t>(ws, plan.list_blocks);
  int32_t* llen = region_ptr<int32_t>(ws, plan.list_lens);
  // Level 1 and the group choice (they validate their own arguments).
  super_score(supers, table, batch, q, p.scale, p.two, gh);
  select_groups_list(gh, table, batch, Hq, Hkv, P, S, p.select, p.two, L, map, llen);
  // Level 2 over list positions: per KV head, the listed pages' block ids.
  for (int64_t bg = 0; bg < int64_t(B) * Hkv; ++bg) {
    const int b = int(bg / Hkv);
    const int32_t* row = batch.block_table + int64_t(b) * batch.block_table_stride;
    for (int i = 0; i < L; ++i) lblk[bg * L + i] = map[bg * L + i] >= 0 ? row[map[bg * L + i]] : -1;
  }
  const BatchView lb{lblk, int64_t(Hkv) * L, llen, B, L};
  float* hs = region_ptr<float>(ws, plan.head_scores);
  float* gs = region_ptr<float>(ws, plan.group_scores);
  const detail::ThreadScratch sc = thread_scratch(plan, ws);
  impl::score_pages(summaries, lb, q, p.scale, hs, sc, nullptr, L);
  impl::aggregate_gqa(hs, lb, Hq, Hkv, gs, sc);
  impl::select_pages(gs, lb, Hkv, P, p.select, sel, sc);
  // Positions -> logical pages (the map ascends, so the selection stays ascending).
  for (int64_t bg = 0; bg < int64_t(B) * Hkv; ++bg)
    for (int i = 0; i < sel.counts[bg]; ++i) {
      int32_t& x = sel.pages[bg * sel.capacity + i];
      x = map[bg * L + x];
    }
  impl::decode_attention(cache, batch, q, p.scale, &sel, out, sc,
                         region_ptr<std::byte>(ws, plan.part_o), size_t(plan.part_o.bytes));
  publish_selection(sel, selection_out, int64_t(B) * Hkv);
}

}  // namespace locks::cpu

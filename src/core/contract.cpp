// The decode contract on the CPU (contract.h): plan_decode sizes one workspace for the
// step's buffers (scores, selection, attention chunk states) and every thread's scratch;
// the run calls check the call against the plan and run the ops of score.h, select.h and
// attention.h on slices of that workspace.
#include "locks/contract.h"

#include <omp.h>

#include <algorithm>

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

void check_call(const DecodePlan& plan, const Workspace& ws, const BatchView& batch,
                const char* where) {
  detail::check_plan_backend(plan, Backend::cpu, where);
  detail::check_workspace(plan, ws, where);
  detail::check_run_batch(plan, batch, where);
}

}  // namespace

DecodePlan plan_decode(const DecodeParams& params) {
  DecodePlan plan = detail::plan_common(params, Backend::cpu);
  const DecodeParams& p = plan.params;
  const int B = p.max_batch, M = p.max_blocks_per_seq, Hq = p.num_q_heads;
  const int Hkv = p.cache.num_kv_heads, d = p.cache.head_dim, P = p.cache.page_size;
  const int r = p.summary.rank, G = plan.group;
  plan.threads = std::max(1, omp_get_max_threads());
  const size_t per_thread = detail::align_up(
      std::max({impl::score_scratch_bytes(G, r, d, P), impl::aggregate_scratch_bytes(G, M),
                impl::select_scratch_bytes(M), impl::attention_scratch_bytes(P, d, G)}));
  detail::RegionAlloc a;
  plan.head_scores = a.add(int64_t(B) * Hq * M * 4);
  plan.group_scores = a.add(int64_t(B) * Hkv * M * 4);
  plan.pages = a.add(int64_t(B) * Hkv * plan.capacity * 4);
  plan.counts = a.add(int64_t(B) * Hkv * 4);
  // CPU: part_o holds the attention's chunk bookkeeping and states (bounded by M pages).
  plan.part_o = a.add(int64_t(impl::attention_shared_bytes(B, Hkv, Hq, M, d)));
  plan.scratch = a.add(int64_t(per_thread) * plan.threads);
  if (p.two_level) {
    plan.super_scores = a.add(int64_t(B) * Hq * plan.max_groups * 4);
    plan.page_map = a.add(int64_t(B) * Hkv * plan.list_cap * 4);
    plan.list_blocks = a.add(int64_t(B) * Hkv * plan.list_cap * 4);
    plan.list_lens = a.add(int64_t(B) * 4);
  }
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
  // Both calls' checks first, so that a bad call writes nothing.
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(out.capacity == plan.capacity, "selection capacity ", out.capacity,
                " differs from the plan's ", plan.capacity);
  aggregate_gqa(plan, ws, batch, head_scores, group_scores);
  select_pages(plan, ws, batch, group_scores, out);
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
  validate_cache(cache);  // before the selection is written (its stride, K/V disjoint)
  LOCKS_REQUIRE(out.out != nullptr, "out.out is null");
  Selection sel{region_ptr<int32_t>(ws, plan.pages), region_ptr<int32_t>(ws, plan.counts),
                plan.capacity};
  if (selection_out) {
    LOCKS_REQUIRE(selection_out->capacity == plan.capacity, "selection_out capacity ",
                  selection_out->capacity, " differs from the plan's ", plan.capacity);
    sel = *selection_out;
  }
  float* hs = region_ptr<float>(ws, plan.head_scores);
  float* gs = region_ptr<float>(ws, plan.group_scores);
  const detail::ThreadScratch sc = thread_scratch(plan, ws);
  const DecodeParams& p = plan.params;
  impl::score_pages(summaries, batch, q, p.scale, hs, sc);
  impl::aggregate_gqa(hs, batch, p.num_q_heads, p.cache.num_kv_heads, gs, sc);
  impl::select_pages(gs, batch, p.cache.num_kv_heads, p.cache.page_size, p.select, sel, sc);
  impl::decode_attention(cache, batch, q, p.scale, &sel, out, sc,
                         region_ptr<std::byte>(ws, plan.part_o), size_t(plan.part_o.bytes));
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
  Selection sel{region_ptr<int32_t>(ws, plan.pages), region_ptr<int32_t>(ws, plan.counts),
                plan.capacity};
  if (selection_out) {
    LOCKS_REQUIRE(selection_out->capacity == plan.capacity, "selection_out capacity ",
                  selection_out->capacity, " differs from the plan's ", plan.capacity);
    LOCKS_REQUIRE(selection_out->pages && selection_out->counts, "selection_out is null");
    sel = *selection_out;
  }
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
}

}  // namespace locks::cpu

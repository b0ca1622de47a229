// The decode contract on the GPU (contract.h): cuda::plan_decode (validate the shapes, query
// the device once, choose chunk sizes and split counts, lay out every buffer in the caller's
// workspace) and the run calls (host checks, then the launchers of kernels.cuh on workspace
// regions; no allocation, no host sync).
#include <algorithm>
#include <cmath>
#include <string>

#include "common.cuh"
#include "decode_checks.h"
#include "kernels.cuh"
#include "locks/contract.h"
#include "locks/error.h"
#include "plan_common.h"
#include "plan_fields.h"
#include "super.cuh"

namespace locks::cuda {
namespace {
using detail::ceil_div;
using locks::detail::region_ptr;

constexpr int kDensePagesPerSplit = 16;  // at least 256 tokens, 128 KB of bf16 K+V per KV head
using detail::kMaxSplits;  // longer contexts get longer splits (the merge stays cheap)
constexpr int kSparsePagesPerSplit = 4;  // at least one page per warp

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void check_call(const DecodePlan& plan, const Workspace& ws, const BatchView& batch,
                const char* where) {
  locks::detail::check_plan_backend(plan, Backend::cuda, where);
  detail::check_plan_fields(plan, where);
  locks::detail::check_workspace(plan, ws, where);
  locks::detail::check_run_batch(plan, batch, where);
}

// A selection the ops write (select_pages, aggregate_select, score_select).
void check_selection(const DecodePlan& plan, const Selection& out, const char* where) {
  if (out.pages == nullptr || out.counts == nullptr)
    locks::detail::fail(where, "selection arrays are null");
  if (out.capacity != plan.capacity)
    locks::detail::fail(where, "selection capacity ", out.capacity, " differs from the plan's ",
                        plan.capacity);
}

void check_summaries(const DecodePlan& plan, const SummaryView& s, const char* where) {
  locks::detail::check_run_summary(plan, s.layout, where);
  if (s.layout.precision == Precision::fp32) {
    if (!(s.mu && s.basis && s.coeff)) locks::detail::fail(where, "fp32 summary arrays are null");
  } else {
    if (!(s.mu_q && s.mu_scale && s.basis_q && s.basis_scale && s.coeff_q && s.coeff_scale))
      locks::detail::fail(where, "quant summary arrays are null");
    if (!(aligned16(s.mu_q) && aligned16(s.basis_q) && aligned16(s.coeff_q)))
      locks::detail::fail(where, "quant summary code arrays must be 16-byte aligned");
  }
}

void check_attention(const DecodePlan& plan, const KvCacheView& cache, const QueryView& q,
                     const AttentionOutput& out, const char* where) {
  locks::detail::check_run_cache(plan, cache.layout, where);
  locks::detail::check_run_query(plan, q, where);
  if (!(cache.k && cache.v && aligned16(cache.k) && aligned16(cache.v)))
    locks::detail::fail(where, "cache K/V are null or not 16-byte aligned");
  validate_cache(cache);
  if (cache.block_step() * dtype_size(cache.layout.dtype) % 16 != 0)
    locks::detail::fail(where, "block_stride ", cache.block_step(),
                        " elements is not a multiple of 16 bytes (the CUDA kernels' loads)");
  // The attention kernel reads the query two elements at a time.
  const int qes = dtype_size(q.dtype);
  if ((reinterpret_cast<uintptr_t>(q.q) % (2 * qes)) != 0 || q.stride % 2 != 0)
    locks::detail::fail(where, "q must be ", 2 * qes, "-byte aligned with an even stride");
  if (out.out == nullptr) locks::detail::fail(where, "out.out is null");
  if (!dtype_known(out.dtype))
    locks::detail::fail(where, "out: unknown dtype code ", static_cast<int>(out.dtype));
}

void attend(const DecodePlan& plan, const Workspace& ws, const KvCacheView& cache,
            const BatchView& batch, const QueryView& q, const Selection* sel,
            const AttentionOutput& out, cudaStream_t st) {
  const int pps = sel ? plan.sparse_pages_per_split : plan.dense_pages_per_split;
  detail::launch_attention(cache, batch, detail::q_in(q, plan.params.cache.head_dim),
                           plan.params.num_q_heads, plan.params.scale, sel, pps,
                           std::max(plan.dense_splits, plan.sparse_splits),
                           region_ptr<float>(ws, plan.part_o), region_ptr<float>(ws, plan.part_ml),
                           {out.out, out.dtype}, out.lse, st);
}

}  // namespace

DecodePlan plan_decode(const DecodeParams& params) {
  DecodePlan plan = locks::detail::plan_common(params, Backend::cuda);
  const DecodeParams& p = plan.params;
  const CacheLayout& L = p.cache;
  LOCKS_REQUIRE(p.max_batch <= 65535, "max_batch must be in [1, 65535], got ", p.max_batch);
  // The kernels index (block, KV head) pairs in 32 bits.
  LOCKS_REQUIRE(int64_t(L.num_blocks) * L.num_kv_heads < (int64_t(1) << 31), "num_blocks ",
                L.num_blocks, " x num_kv_heads ", L.num_kv_heads, " exceeds 2^31");
  LOCKS_REQUIRE(
      p.select_chunk_pages == 0 || p.select_chunk_pages == 2048 || p.select_chunk_pages == 4096,
      "select_chunk_pages must be 0 (auto), 2048 or 4096, got ", p.select_chunk_pages);
  LOCKS_REQUIRE(p.score_chunk_pages == 0 || detail::score_chunk_supported(p.score_chunk_pages),
                "score_chunk_pages must be 0 (auto), 32, 64, 96 or 128, got ", p.score_chunk_pages);
  LOCKS_REQUIRE(p.attn_pages_per_split == 0 ||
                    (p.attn_pages_per_split >= 4 && p.attn_pages_per_split <= 512 &&
                     p.attn_pages_per_split % 4 == 0),
                "attn_pages_per_split must be 0 (auto) or a multiple of 4 in [4, 512], got ",
                p.attn_pages_per_split);
  const int M = p.max_blocks_per_seq, B = p.max_batch, Hkv = L.num_kv_heads, G = plan.group;
  plan.score_chunks = ceil_div(M, detail::kScoreChunkMin);  // room for the smallest chunks
  plan.select_chunk_pages =
      p.select_chunk_pages ? p.select_chunk_pages : detail::select_chunk_pages(M);
  plan.select_chunks = ceil_div(M, plan.select_chunk_pages);
  const int sms = detail::current_device_sms();
  detail::prepare_score_kernels();
  detail::prepare_attention_kernels();
  detail::prepare_select_kernels();
  // Aggregation + selection in one cluster launch on small grids (the adaptive budget keeps
  // the two-stage path: its mass search reads whole rows of group scores).
  LOCKS_REQUIRE(p.select.tau == 0.0f || p.select_cluster <= 0,
                "select_cluster > 0 needs the fixed budget (tau = 0), got tau ", p.select.tau);
  plan.select_cluster = p.select.tau > 0.0f ? 0
                                            : detail::select_cluster_size(M, int64_t(B) * Hkv, G,
                                                                          sms, p.select_cluster);
  // Pages per scoring block: the tensor-core path's (smaller when the grid would not fill
  // the GPU, or forced), else the CUDA-core kernel's fixed chunk. Aggregation reads the
  // partials of this chunk size.
  plan.score_chunk_pages = !detail::score_uses_tensor_cores(p.summary, G) ? detail::kScoreChunk
                           : p.score_chunk_pages
                               ? p.score_chunk_pages
                               : detail::score_chunk_pages(L.head_dim, G, int64_t(B) * Hkv, M, sms);
  // Sparse splits: the whole batch in one wave of the attention kernel (its blocks per SM
  // from the occupancy calculator: 3 at d 128 (64 KB of stages), 5 at d 64 for G <= 8 and
  // 4 for G 16), 4 to 32 pages each.
  // A split is a few pages per warp, so a second, partial wave would cost a whole block
  // time (v11: "about 4 blocks per SM" made 512 blocks for 396 slots at 128K batch 8).
  const int64_t slots = int64_t(detail::attention_blocks_per_sm(L.dtype, L.head_dim, G)) * sms;
  const int64_t per_row = std::max<int64_t>(
      1, slots / (int64_t(B) * Hkv * detail::attention_head_slices(L.head_dim, G)));
  int sparse_pps =
      int(std::clamp<int64_t>((plan.capacity + per_row - 1) / per_row, kSparsePagesPerSplit, 32));
  // A capacity beyond the budget's (SelectConfig::dense_below) lengthens the splits instead
  // of multiplying them: at most kMaxSplits, as the dense path.
  sparse_pps = std::max<int>(sparse_pps, int(ceil_div(plan.capacity, kMaxSplits)));
  plan.sparse_pages_per_split = (sparse_pps + 3) / 4 * 4;
  if (p.attn_pages_per_split > 0) {  // forced (e.g. by a benchmark's sweep)
    LOCKS_REQUIRE(ceil_div(plan.capacity, p.attn_pages_per_split) <= kMaxSplits,
                  "attn_pages_per_split ", p.attn_pages_per_split, " gives ",
                  ceil_div(plan.capacity, p.attn_pages_per_split), " splits of a ", plan.capacity,
                  "-page capacity (at most ", kMaxSplits, ")");
    plan.sparse_pages_per_split = p.attn_pages_per_split;
  }
  plan.sparse_splits = ceil_div(plan.capacity, plan.sparse_pages_per_split);
  // Dense splits: about 16 blocks per SM over the planned batch (long splits amortise each
  // block start), 16 to 128 pages each, at most kMaxSplits per sequence.
  const int64_t dense_work = int64_t(M) * B * Hkv;
  int dense_pps = int(std::clamp<int64_t>(dense_work / (16 * sms), kDensePagesPerSplit, 128));
  plan.dense_pages_per_split = std::max(dense_pps / 4 * 4, ceil_div(M, kMaxSplits));
  plan.dense_splits = ceil_div(M, plan.dense_pages_per_split);
  if (p.two_level) {
    // Level 2 runs the scoring, aggregation and selection kernels over list_cap positions:
    // their own chunk sizes and cluster choice for that length.
    const int Lc = plan.list_cap;
    if (!detail::super_score_supported(p.super, G))
      throw Unsupported("plan_decode: two-level step: super layout (rank " +
                        std::to_string(p.super.rank) + ", head_dim " +
                        std::to_string(p.super.head_dim) + ", S " +
                        std::to_string(p.super.group_pages) +
                        ") has no CUDA level-1 kernel (S <= 64; rank <= 8 at d <= 256, <= 16 "
                        "at d <= 128)");
    LOCKS_REQUIRE(plan.max_groups <= detail::max_list_groups(), "two-level step: ", plan.max_groups,
                  " groups a sequence, more than the group choice holds (",
                  detail::max_list_groups(), ")");
    detail::prepare_super_kernels();
    plan.group_cluster =
        detail::group_cluster_size(plan.max_groups, int64_t(B) * Hkv, sms, p.group_cluster);
    plan.l2_score_chunk_pages =
        !detail::score_uses_tensor_cores(p.summary, G) ? detail::kScoreChunk
        : p.score_chunk_pages                          ? p.score_chunk_pages
                              : detail::score_chunk_pages(L.head_dim, G, int64_t(B) * Hkv, Lc, sms);
    plan.l2_select_chunk_pages =
        p.select_chunk_pages ? p.select_chunk_pages : detail::select_chunk_pages(Lc);
    plan.l2_select_chunks = ceil_div(Lc, plan.l2_select_chunk_pages);
    plan.l2_select_cluster =
        detail::select_cluster_size(Lc, int64_t(B) * Hkv, G, sms, p.select_cluster);
  }
  detail::lay_out_workspace(plan);  // (check_plan_fields checks a plan vector against it)
  return plan;
}

namespace {
// The scoring launch of score_pages and of the step. whole_rows: score_pages' output is written
// whole (-inf past each row's full pages); the step's own buffer need not be (launch_score).
void launch_scores(const DecodePlan& plan, Workspace ws, const SummaryView& s,
                   const BatchView& batch, const QueryView& q, float* head_scores, bool whole_rows,
                   cudaStream_t st) {
  detail::launch_score(s, batch, detail::q_in(q, plan.params.cache.head_dim),
                       plan.params.num_q_heads, plan.params.scale, head_scores,
                       region_ptr<float>(ws, plan.chunk_lse), plan.score_chunks,
                       plan.score_chunk_pages, st, 0, whole_rows);
}
}  // namespace

void score_pages(const DecodePlan& plan, Workspace ws, const SummaryView& s, const BatchView& batch,
                 const QueryView& q, float* head_scores, cudaStream_t st) {
  check_call(plan, ws, batch, __func__);
  check_summaries(plan, s, __func__);
  locks::detail::check_run_query(plan, q, __func__);
  LOCKS_REQUIRE(head_scores != nullptr, "head_scores is null");
  launch_scores(plan, ws, s, batch, q, head_scores, true, st);
}

void aggregate_gqa(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                   const float* head_scores, float* group_scores, cudaStream_t st) {
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(head_scores != nullptr && group_scores != nullptr, "null score array");
  detail::launch_aggregate(head_scores, region_ptr<float>(ws, plan.chunk_lse), plan.score_chunks,
                           plan.score_chunk_pages, batch, plan.params.num_q_heads,
                           plan.params.cache.num_kv_heads, region_ptr<float>(ws, plan.head_lse),
                           group_scores, st);
}

void select_pages(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                  const float* group_scores, const Selection& out, cudaStream_t st) {
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(group_scores != nullptr, "group_scores is null");
  check_selection(plan, out, __func__);
  detail::launch_select(group_scores, batch, plan.params.cache.num_kv_heads, plan.params.select,
                        plan.params.cache.page_size, out, region_ptr<uint32_t>(ws, plan.cand_key),
                        region_ptr<int32_t>(ws, plan.cand_idx),
                        region_ptr<int32_t>(ws, plan.cand_cnt), plan.select_chunks,
                        plan.select_chunk_pages, st);
}

void aggregate_select(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                      const float* head_scores, float* group_scores, const Selection& out,
                      cudaStream_t st) {
  // Every check before the first launch, so that a bad call writes nothing.
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(head_scores != nullptr && group_scores != nullptr, "null score array");
  check_selection(plan, out, __func__);
  if (plan.select_cluster == 0) {
    aggregate_gqa(plan, ws, batch, head_scores, group_scores, st);
    select_pages(plan, ws, batch, group_scores, out, st);
    return;
  }
  detail::launch_aggregate_select(
      head_scores, region_ptr<float>(ws, plan.chunk_lse), plan.score_chunks, plan.score_chunk_pages,
      batch, plan.params.num_q_heads, plan.params.cache.num_kv_heads, plan.params.select,
      plan.params.cache.page_size, plan.select_cluster, region_ptr<float>(ws, plan.head_lse),
      group_scores, out, st);
}

namespace detail {
void check_score_select(const DecodePlan& plan, const Workspace& ws, const SummaryView& s,
                        const BatchView& batch, const QueryView& q, const Selection& out,
                        const char* where) {
  check_call(plan, ws, batch, where);
  check_summaries(plan, s, where);
  locks::detail::check_run_query(plan, q, where);
  check_selection(plan, out, where);
}
}  // namespace detail

void score_select(const DecodePlan& plan, Workspace ws, const SummaryView& s,
                  const BatchView& batch, const QueryView& q, const Selection& out,
                  cudaStream_t st) {
  // Every check before the first launch, so that a bad call writes nothing.
  detail::check_score_select(plan, ws, s, batch, q, out, __func__);
  float* hs = region_ptr<float>(ws, plan.head_scores);
  // The head scores stay in the workspace and the aggregation reads only each row's full pages,
  // so they are not written past them.
  launch_scores(plan, ws, s, batch, q, hs, false, st);
  aggregate_select(plan, ws, batch, hs, region_ptr<float>(ws, plan.group_scores), out, st);
}

void decode_attention_sparse(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                             const BatchView& batch, const QueryView& q, const Selection& sel,
                             const AttentionOutput& out, cudaStream_t st) {
  check_call(plan, ws, batch, __func__);
  check_attention(plan, cache, q, out, __func__);
  LOCKS_REQUIRE(sel.pages && sel.counts && sel.capacity >= 1 && sel.capacity <= plan.capacity,
                "selection is null or its capacity ", sel.capacity, " is outside [1, ",
                plan.capacity, "]");
  attend(plan, ws, cache, batch, q, &sel, out, st);
}

void decode_attention_dense(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                            const BatchView& batch, const QueryView& q, const AttentionOutput& out,
                            cudaStream_t st) {
  check_call(plan, ws, batch, __func__);
  check_attention(plan, cache, q, out, __func__);
  attend(plan, ws, cache, batch, q, nullptr, out, st);
}

namespace detail {
Selection decode_selection(const DecodePlan& plan, const Workspace& ws,
                           const Selection* selection_out) {
  return selection_out ? *selection_out
                       : Selection{region_ptr<int32_t>(ws, plan.pages),
                                   region_ptr<int32_t>(ws, plan.counts), plan.capacity};
}

void check_decode(const DecodePlan& plan, const Workspace& ws, const KvCacheView& cache,
                  const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                  const AttentionOutput& out, const Selection* selection_out, const char* where) {
  const Selection sel = decode_selection(plan, ws, selection_out);
  check_call(plan, ws, batch, where);
  check_summaries(plan, summaries, where);
  check_attention(plan, cache, q, out, where);
  if (!(sel.pages && sel.counts && sel.capacity == plan.capacity))
    locks::detail::fail(where, "selection_out is null or its capacity ", sel.capacity,
                        " differs from the plan's ", plan.capacity);
}
}  // namespace detail

void decode(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
            const SummaryView& summaries, const BatchView& batch, const QueryView& q,
            const AttentionOutput& out, const Selection* selection_out, cudaStream_t st) {
  // Every check before the first launch, so that a bad call writes nothing.
  detail::check_decode(plan, ws, cache, summaries, batch, q, out, selection_out, __func__);
  const Selection sel = detail::decode_selection(plan, ws, selection_out);
  score_select(plan, ws, summaries, batch, q, sel, st);
  attend(plan, ws, cache, batch, q, &sel, out, st);
}

void decode_two_level_stages(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                             const SummaryView& summaries, const SuperView& supers,
                             const SuperTableView& super_table, const BatchView& batch,
                             const QueryView& q, const AttentionOutput& out,
                             const Selection* selection_out, int stages, cudaStream_t st) {
  Selection sel{region_ptr<int32_t>(ws, plan.pages), region_ptr<int32_t>(ws, plan.counts),
                plan.capacity};
  if (selection_out) sel = *selection_out;
  // Every check before the first launch, so that a bad call writes nothing.
  check_call(plan, ws, batch, __func__);
  LOCKS_REQUIRE(plan.params.two_level, "decode_two_level needs a plan with params.two_level");
  LOCKS_REQUIRE(stages >= 1 && stages <= 5, "stages must be in [1, 5], got ", stages);
  check_summaries(plan, summaries, __func__);
  check_attention(plan, cache, q, out, __func__);
  LOCKS_REQUIRE(sel.pages && sel.counts && sel.capacity == plan.capacity,
                "selection_out is null or its capacity ", sel.capacity, " differs from the plan's ",
                plan.capacity);
  const DecodeParams& p = plan.params;
  locks::detail::check_run_super(plan, supers.layout, super_table, __func__);
  LOCKS_REQUIRE(detail::group_cluster_holds(plan.group_cluster, plan.max_groups),
                "decode_two_level: the plan's group_cluster ", plan.group_cluster,
                " cannot hold its ", plan.max_groups, " groups a sequence (plan it on CUDA)");
  const SuperLayout& U = supers.layout;
  LOCKS_REQUIRE(supers.mu_q && supers.mu_scale && supers.basis_q && supers.basis_scale &&
                    supers.coord_q && supers.coord_scale && supers.radius_q &&
                    supers.radius_scale &&
                    (!U.extent || (supers.lo_q && supers.hi_q && supers.extent_scale)),
                "super summary arrays are null");
  const int B = batch.batch_size, Hkv = p.cache.num_kv_heads, Hq = p.num_q_heads;
  const int P = p.cache.page_size, S = p.super.group_pages, Lc = plan.list_cap;
  const SuperTableView table{super_table.table, super_table.stride, plan.max_groups};
  float* gh = region_ptr<float>(ws, plan.super_scores);
  int32_t* map = region_ptr<int32_t>(ws, plan.page_map);
  int32_t* lblk = region_ptr<int32_t>(ws, plan.list_blocks);
  int32_t* llen = region_ptr<int32_t>(ws, plan.list_lens);
  // 1. Level 1.
  detail::launch_super_score(supers, table, batch, detail::q_in(q, plan.params.cache.head_dim), Hq,
                             p.scale, p.two, gh, st);
  if (stages < 2) return;
  // 2. Group choice: the page list and the listed pages' block ids.
  detail::launch_select_groups_list(gh, plan.max_groups, batch, Hq, Hkv, P, S, p.select, p.two, Lc,
                                    plan.group_cluster, map, llen, lblk, st);
  if (stages < 3) return;
  // 3. Level 2: the page scorer over list positions (per-head block table, list lengths).
  const BatchView lb{lblk, int64_t(Hkv) * Lc, llen, B, Lc};
  DecodePlan p2 = plan;  // the level-2 shapes: list_cap positions a sequence
  p2.params.max_blocks_per_seq = Lc;
  p2.score_chunk_pages = plan.l2_score_chunk_pages;
  p2.select_chunks = plan.l2_select_chunks;
  p2.select_chunk_pages = plan.l2_select_chunk_pages;
  p2.select_cluster = plan.l2_select_cluster;
  float* hs = region_ptr<float>(ws, plan.head_scores);
  float* gs = region_ptr<float>(ws, plan.group_scores);
  detail::launch_score(summaries, lb, detail::q_in(q, plan.params.cache.head_dim), Hq, p.scale, hs,
                       region_ptr<float>(ws, plan.chunk_lse), plan.score_chunks,
                       p2.score_chunk_pages, st, Lc);
  if (stages < 4) return;
  // 4. Aggregation and selection over positions, then positions -> logical pages.
  aggregate_select(p2, ws, lb, hs, gs, sel, st);
  detail::launch_map_positions(map, Lc, sel, int64_t(B) * Hkv, st);
  if (stages < 5) return;
  // 5. Sparse attention over the logical pages.
  attend(plan, ws, cache, batch, q, &sel, out, st);
}

void decode_two_level(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                      const SummaryView& summaries, const SuperView& supers,
                      const SuperTableView& super_table, const BatchView& batch, const QueryView& q,
                      const AttentionOutput& out, const Selection* selection_out, cudaStream_t st) {
  decode_two_level_stages(plan, ws, cache, summaries, supers, super_table, batch, q, out,
                          selection_out, 5, st);
}

}  // namespace locks::cuda

// The CUDA plan's workspace layout and the check of its derived fields (plan_fields.h).
#include "plan_fields.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "kernels.cuh"
#include "locks/error.h"
#include "plan_common.h"

namespace locks::cuda::detail {
namespace {

bool select_chunk_ok(int pages) { return pages == 2048 || pages == 4096; }
bool cluster_ok(int cluster, int64_t pages) {  // 0 (two stages) or a power of two that holds
  return cluster == 0 ||
         (cluster >= 1 && cluster <= kMaxSelectCluster && (cluster & (cluster - 1)) == 0 &&
          int64_t(cluster) * kSelectChunk >= pages);
}

constexpr int kRegions = 15, kTwoLevelRegions = 4;  // the last four: the two-level step's

// The plan's workspace regions in layout order (plan_decode's), with the bytes each needs for
// the plan's batch, heads, pages, capacity, chunk counts and splits (0 for the two-level ones
// when the plan has no two-level step).
template <typename Plan>
auto regions_of(Plan& plan) {
  using R = std::conditional_t<std::is_const_v<Plan>, const WorkspaceRegion, WorkspaceRegion>;
  const DecodeParams& p = plan.params;
  const int64_t B = p.max_batch, Hq = p.num_q_heads, Hkv = p.cache.num_kv_heads,
                M = p.max_blocks_per_seq, cap = plan.capacity;
  const int64_t splits = std::max(plan.dense_splits, plan.sparse_splits);
  const int64_t cand_chunks =
      p.two_level ? std::max(plan.select_chunks, plan.l2_select_chunks) : plan.select_chunks;
  const int64_t two = p.two_level ? 1 : 0;
  using locks::detail::sat_product;
  return std::array<std::pair<R*, int64_t>, kRegions>{{
      {&plan.head_scores, sat_product({B, Hq, M, 4})},
      {&plan.chunk_lse, sat_product({B, Hq, plan.score_chunks, 2, 4})},
      {&plan.group_scores, sat_product({B, Hkv, M, 4})},
      {&plan.head_lse, sat_product({B, Hq, 4})},
      {&plan.pages, sat_product({B, Hkv, cap, 4})},
      {&plan.counts, sat_product({B, Hkv, 4})},
      {&plan.cand_key, sat_product({B, Hkv, cand_chunks, cap, 4})},
      {&plan.cand_idx, sat_product({B, Hkv, cand_chunks, cap, 4})},
      {&plan.cand_cnt, sat_product({B, Hkv, cand_chunks, 4})},
      {&plan.part_o, sat_product({B, Hq, splits, p.cache.head_dim, 4})},
      {&plan.part_ml, sat_product({B, Hq, splits, 2, 4})},
      {&plan.super_scores, sat_product({two, B, Hq, plan.max_groups, 4})},
      {&plan.page_map, sat_product({two, B, Hkv, plan.list_cap, 4})},
      {&plan.list_blocks, sat_product({two, B, Hkv, plan.list_cap, 4})},
      {&plan.list_lens, sat_product({two, B, 4})},
  }};
}

}  // namespace

void lay_out_workspace(DecodePlan& plan) {
  locks::detail::RegionAlloc a;
  const auto regions = regions_of(plan);
  const int n = plan.params.two_level ? kRegions : kRegions - kTwoLevelRegions;
  for (int i = 0; i < n; ++i) *regions[size_t(i)].first = a.add(regions[size_t(i)].second);
  plan.workspace_bytes = size_t(a.total());
}

void check_plan_fields(const DecodePlan& plan, const char* where) {
  using locks::detail::fail;
  const DecodeParams& p = plan.params;
  const int64_t M = p.max_blocks_per_seq;
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  // Counts of partials and splits at least what M pages need (the two-level step runs the flat
  // ops on a copy of the plan with M = list_cap <= M, over the same regions), at most 512 splits.
  if (!score_chunk_supported(plan.score_chunk_pages) || plan.score_chunks < cdiv(M, kScoreChunkMin))
    fail(where, "plan: score chunks (", plan.score_chunk_pages, " pages, ", plan.score_chunks,
         " partials) are not plan_decode's for ", M, " pages");
  if (!select_chunk_ok(plan.select_chunk_pages) ||
      plan.select_chunks != cdiv(M, plan.select_chunk_pages))
    fail(where, "plan: selection chunks (", plan.select_chunk_pages, " pages, ", plan.select_chunks,
         ") are not plan_decode's for ", M, " pages");
  if (!cluster_ok(plan.select_cluster, M) || (p.select.tau > 0.0f && plan.select_cluster != 0))
    fail(where, "plan: selection cluster of ", plan.select_cluster, " blocks for ", M,
         " pages (tau ", p.select.tau, ")");
  if (plan.dense_pages_per_split < 1 || plan.sparse_pages_per_split < 1 ||
      plan.dense_splits < cdiv(M, plan.dense_pages_per_split) ||
      plan.sparse_splits < cdiv(plan.capacity, plan.sparse_pages_per_split) ||
      plan.dense_splits > kMaxSplits || plan.sparse_splits > kMaxSplits)
    fail(where, "plan: attention splits (dense ", plan.dense_splits, " x ",
         plan.dense_pages_per_split, ", sparse ", plan.sparse_splits, " x ",
         plan.sparse_pages_per_split, " pages) do not cover ", M, " pages / capacity ",
         plan.capacity, " in at most ", kMaxSplits);
  if (p.two_level) {
    const int64_t Lc = plan.list_cap;
    if (!score_chunk_supported(plan.l2_score_chunk_pages) ||
        !select_chunk_ok(plan.l2_select_chunk_pages) ||
        plan.l2_select_chunks != cdiv(Lc, plan.l2_select_chunk_pages) ||
        !cluster_ok(plan.l2_select_cluster, Lc) || Lc < 1 || Lc > M)
      fail(where, "plan: level-2 choices (list ", Lc, ", chunks ", plan.l2_score_chunk_pages, " / ",
           plan.l2_select_chunk_pages, " x ", plan.l2_select_chunks, ", cluster ",
           plan.l2_select_cluster, ") are not plan_decode's");
  }
  // Every region holds what the kernels index with these fields, and no two overlap.
  const auto regions = regions_of(plan);
  locks::detail::check_regions(plan, regions.data(), regions.size(), where);
}

}  // namespace locks::cuda::detail

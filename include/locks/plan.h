// Plan / run: the decode parameters a caller fixes once per batch shape, and the plan the
// backend derives from them (host side, once): selection capacity, workspace size, kernel
// choices and where each buffer sits in the caller's workspace. Run calls (contract.h) take
// the plan and a workspace of at least plan.workspace_bytes; they never allocate, and on
// CUDA never synchronise with the host, so a step is capturable in a CUDA graph and
// replayable with new lengths, tables, queries and cache contents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "locks/kv_cache.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "locks/super_summary.h"
#include "locks/support.h"

namespace locks {

struct DecodeParams {
  CacheLayout cache;      // num_blocks, page_size, num_kv_heads, head_dim, dtype
  SummaryLayout summary;  // rank, precision (other fields must match cache; summary_layout_for)
  int num_q_heads = 1;
  int max_batch = 1;           // batch.batch_size of every run is in [1, max_batch]
  int max_blocks_per_seq = 1;  // batch.max_blocks_per_seq of every run is in [1, this]
  SelectConfig select;         // budget_tokens, sink_pages, recent_pages, tau, floor_pages
  float scale = 0.0f;          // softmax scale; 0 = 1/sqrt(head_dim)
  // CUDA knobs (0 = chosen by the plan). Pages per tensor-core scoring block: 32, 64, 96 or 128.
  int score_chunk_pages = 0;
  // Pages per first-stage selection block: 2048 or 4096.
  int select_chunk_pages = 0;
  // Aggregation + selection in one launch, a thread-block cluster of this many blocks per
  // (sequence, KV head): 0 = the plan's rule (small grids, fixed budget), -1 = never (the
  // separate aggregation and two-stage selection), 1, 2, 4, 8 or 16 to force one.
  int select_cluster = 0;
  // Selected pages per split-K attention block (the sparse path): 0 = the plan's rule (one
  // wave of the attention kernel over the planned batch, 4 to 32 pages a split), or a multiple
  // of 4 in [4, 512] to force one (at most 512 splits a row: capacity / pages <= 512).
  int attn_pages_per_split = 0;
  // The two-level (super-page) step, decode_two_level in contract.h (super_summary.h): off
  // by default. On: the plan sizes level 1's scores, the level-2 page list (list_cap) and
  // its regions; super's page_size, num_kv_heads and head_dim must match the cache, and
  // the budget must be fixed (tau = 0).
  bool two_level = false;
  TwoLevelConfig two;
  SuperLayout super;
  // CUDA: blocks of the group choice's thread-block cluster per (sequence, KV head): 0 = the
  // plan's rule, 1, 2, 4 or 8 to force one (the same list for every size).
  int group_cluster = 0;
};

DecodeShape decode_shape(const DecodeParams& p);

// A byte range of the workspace (offset 256-aligned; bytes 0 = unused by this backend).
struct WorkspaceRegion {
  int64_t offset = 0;
  int64_t bytes = 0;
};

// Caller-owned scratch memory (host memory for cpu::, device memory for cuda::), at least
// plan.workspace_bytes bytes, 256-byte aligned. Contents between calls: see contract.h.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

struct DecodePlan {
  DecodeParams params;  // as given, with scale resolved (> 0)
  Backend backend = Backend::cpu;
  int capacity = 0;            // selection slots per (sequence, KV head): rules::select_capacity
  size_t workspace_bytes = 0;  // what every run call needs
  int group = 1;               // num_q_heads / num_kv_heads
  // Backend choices. CPU: threads the per-thread scratch was sized for.
  int threads = 1;
  // CUDA: scoring partials (chunks of the smallest chunk size), the tensor-core path's pages
  // per scoring block, selection chunks, split-K attention splits.
  int score_chunks = 0, score_chunk_pages = 0;
  int select_chunks = 0, select_chunk_pages = 0;
  int select_cluster = 0;  // blocks per row of the one-launch aggregation + selection; 0 = none
  int dense_pages_per_split = 0, dense_splits = 0;
  int sparse_pages_per_split = 0, sparse_splits = 0;
  // Where each buffer sits in the workspace. head_scores [B, Hq, M] f32, group_scores
  // [B, Hkv, M] f32, pages [B, Hkv, capacity] i32, counts [B, Hkv] i32 (used by decode()
  // when no selection_out is given), chunk_lse [B, Hq, score_chunks, 2] f32 and head_lse
  // [B, Hq] f32 (scoring -> aggregation partials, CUDA), cand_key / cand_idx / cand_cnt
  // (selection candidates, CUDA), part_o / part_ml (split-K attention partials), scratch
  // (CPU per-thread selection and attention buffers).
  WorkspaceRegion head_scores, group_scores, pages, counts, chunk_lse, head_lse, cand_key, cand_idx,
      cand_cnt, part_o, part_ml, scratch;
  // Two-level step (params.two_level): list_cap = entries per (sequence, KV head) of the
  // level-2 page list (two_level_list_capacity), max_groups = ceil(max_blocks_per_seq / S);
  // level 2's own choices over list_cap positions (CUDA: pages per scoring block, selection
  // chunks, cluster size); regions super_scores [B, Hq, max_groups] f32, page_map
  // [B, Hkv, list_cap] i32, list_blocks [B, Hkv, list_cap] i32 (the listed pages' block
  // ids), list_lens [B] i32. Level 2 reuses head_scores, chunk_lse, group_scores and the
  // candidates ([B, Hq, list_cap] etc.: list_cap <= max_blocks_per_seq).
  int list_cap = 0, max_groups = 0, group_cluster = 0;
  int l2_score_chunk_pages = 0, l2_select_chunks = 0, l2_select_chunk_pages = 0,
      l2_select_cluster = 0;
  WorkspaceRegion super_scores, page_map, list_blocks, list_lens;

  // A fixed-length int64 vector (torch carries it as int[]). Element kIntWorkspaceBytes is
  // workspace_bytes, kIntCapacity the capacity; kIntTag a version tag from_ints checks.
  static constexpr int kIntWorkspaceBytes = 0;
  static constexpr int kIntCapacity = 1;
  static constexpr int kIntTag = 2;
  static constexpr int kIntBackend = 3;
  static constexpr int64_t kTag = 0x4c4f434b5308;  // "LOCKS" v8 (v2: tau, floor_pages;
                                                   // v3: basis_group; v4: select_cluster;
                                                   // v5: two-level step, 96 ints;
                                                   // v6: select.dense_below;
                                                   // v7: group_cluster;
                                                   // v8: attn_pages_per_split, 128 ints)
  static constexpr size_t kNumInts = 128;          // room for fields to come (zeros)
  std::vector<int64_t> to_ints() const;
  // Throws locks::InvalidArgument on a vector of another length or tag, or inconsistent
  // fields (regions outside workspace_bytes, capacity not the budget rule's).
  static DecodePlan from_ints(const int64_t* v, size_t n);
  static DecodePlan from_ints(const std::vector<int64_t>& v) {
    return from_ints(v.data(), v.size());
  }
};

}  // namespace locks

// Launchers of the decode-step kernels (internal to locks_cuda; the public API is
// locks/cuda/decoder.h). All pointers are device pointers; no launcher synchronises.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype_io.h"
#include "locks/cuda/limits.h"
#include "locks/kv_cache.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "score_chunk_rule.h"  // kScoreChunk, kScoreChunkMin, score_chunk_supported

namespace locks::cuda::detail {

constexpr int kMaxGroup = limits::kMaxGroup;  // GQA group (query heads per KV head)
constexpr int kSelectChunk = 4096;  // most pages per first-stage selection block (smem keys)
// Pages per first-stage selection block: 2048 for up to 16K pages a sequence (more blocks
// for the barrier-bound first stage at batch 1), 4096 above (fewer second-stage candidates).
inline int select_chunk_pages(int64_t max_pages) { return max_pages <= 16384 ? 2048 : 4096; }

// head_scores [B, Hq, M] (natural-log page scores, -inf off the full pages) and the
// per-chunk log-sum-exp partials chunk_lse [B, Hq, n_chunks, 2] (max, sum of exp), one per
// chunk of chunk_pages pages (128, or 64 / 32 on the tensor-core path; see
// score_chunk_pages). bt_head_stride: KV head h reads its block ids at
// block_table[b * stride + h * bt_head_stride + j] (0: one row a sequence; the two-level
// step's per-head page lists: list_cap). whole_rows false: the tensor-core kernel leaves the
// head scores of chunks past a row's full pages unwritten (a step's own workspace, whose
// aggregation reads only a row's full pages; a step planned for rows longer than it serves
// would otherwise write -inf over most of the buffer); an op's output is written whole.
void launch_score(const SummaryView& s, const BatchView& batch, QIn q, int num_q_heads, float scale,
                  float* head_scores, float* chunk_lse, int n_chunks, int chunk_pages,
                  cudaStream_t st, int64_t bt_head_stride = 0, bool whole_rows = true);
// Pages per scoring block on the tensor-core path: 128, halved (down to 32) while the grid
// of (chunk, KV head, sequence) blocks would fill less than half a wave of the GPU; where
// 128 leaves a partial second wave, the one of 128 / 96 / 64 with the fewest waves x pages;
// over two waves 128, or 64 for the d 128 instance of G <= 4 (long_grid_chunk).
int score_chunk_pages(int head_dim, int group, int64_t rows, int64_t max_pages, int sms);
bool score_uses_tensor_cores(const SummaryLayout& s, int group);
// Raises the dynamic shared-memory limits once (outside any graph capture).
void prepare_score_kernels();
void prepare_attention_kernels();
// Resident blocks per SM of the attention kernel for this cache dtype, head_dim and GQA
// group (after prepare_attention_kernels); sizes the sparse splits to one wave.
int attention_blocks_per_sm(DType dtype, int head_dim, int group);
// Blocks per (split, KV head) of the attention kernel: GQA groups wider than one block's
// query m-tiles (16 heads; 8 at d 256) are split into this many head slices.
int attention_head_slices(int head_dim, int group);

// head_lse: workspace [B, Hq] (each head's log-sum-exp over its pages).
void launch_aggregate(const float* head_scores, const float* chunk_lse, int n_chunks,
                      int chunk_pages, const BatchView& batch, int num_q_heads, int num_kv_heads,
                      float* head_lse, float* group_scores, cudaStream_t st);

// Aggregation + selection in one launch (select_cluster.cu): blocks of a thread-block cluster
// per (KV head, sequence), 1 to kMaxSelectCluster of them, each over <= kSelectChunk pages.
constexpr int kMaxSelectCluster = 16;
// The plan's cluster size for max_pages a sequence over rows = batch x KV heads (group: query
// heads a KV head): forced > 0 (checked: a power of two that holds the row and fits the
// device), forced < 0 never, 0 the rule (clusters for grids of up to about one wave; 0 = the
// two-stage path).
int select_cluster_size(int64_t max_pages, int64_t rows, int group, int sms, int forced);
void prepare_select_kernels();  // sets the non-portable cluster size attribute once
// Whether a cluster of this size aggregates too (<= 8 blocks); 16 selects from the group
// scores of a separate aggregation launch.
constexpr bool select_cluster_fused(int cluster) { return cluster <= 8; }
void launch_aggregate_select(const float* head_scores, const float* chunk_lse, int n_chunks,
                             int chunk_pages, const BatchView& batch, int num_q_heads,
                             int num_kv_heads, const SelectConfig& cfg, int page_size, int cluster,
                             float* head_lse, float* group_scores, const Selection& out,
                             cudaStream_t st);

void launch_select(const float* group_scores, const BatchView& batch, int num_kv_heads,
                   const SelectConfig& cfg, int page_size, const Selection& out, uint32_t* cand_key,
                   int32_t* cand_idx, int32_t* cand_cnt, int n_chunks, int chunk_pages,
                   cudaStream_t st);

// Split-K attention. sel == nullptr: dense over every page. Partials part_o
// [B, Hq, n_splits, d], part_ml [B, Hq, n_splits, 2]; then the merge writes out / lse.
void launch_attention(const KvCacheView& cache, const BatchView& batch, QIn q, int num_q_heads,
                      float scale, const Selection* sel, int pages_per_split, int n_splits,
                      float* part_o, float* part_ml, OutBuf out, float* lse, cudaStream_t st);

}  // namespace locks::cuda::detail

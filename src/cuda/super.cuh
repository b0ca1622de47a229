// Launchers of the two-level step's kernels (super_score.cu: level 1; super.cu: the group
// choice), internal to locks_cuda; the public ops are cuda::super_score / select_groups_list
// (super_summary.h) and decode_two_level (contract.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dtype_io.h"
#include "locks/select.h"
#include "locks/super_summary.h"

namespace locks::cuda::detail {

// Shapes the level-1 kernel has instances for: S <= 64, rank <= 8 at d <= 256 or rank <= 16
// at d <= 128, GQA group <= kMaxGroup.
bool super_score_supported(const SuperLayout& l, int group);
void launch_super_score(const SuperView& s, const SuperTableView& t, const BatchView& batch, QIn q,
                        int Hq, float scale, const TwoLevelConfig& cfg, float* out,
                        cudaStream_t st);
// Raises the group choice's dynamic shared-memory limits once (outside any capture).
void prepare_super_kernels();
int max_list_groups();  // the most groups a sequence the group choice holds (8 blocks' spans)
// Blocks of the group choice's cluster per (sequence, KV head) for rows = batch x KV heads:
// forced (a power of two, throws if it cannot hold max_groups) or 0 for the rule (the fewest
// that hold the row, doubled up to 8 while the grid stays within half a wave and each block
// keeps >= 512 groups).
int group_cluster_size(int max_groups, int64_t rows, int sms, int forced);
// Whether a cluster of that many blocks (1, 2, 4 or 8) holds max_groups groups a sequence.
bool group_cluster_holds(int cluster, int max_groups);
// list_blocks (nullable): the listed pages' block ids, [B, H, L] (the level-2 block table).
// cluster: from group_cluster_size (the list is the same for every cluster size).
void launch_select_groups_list(const float* gh, int MG, const BatchView& batch, int Hq, int H,
                               int P, int S, const SelectConfig& sel, const TwoLevelConfig& cfg,
                               int L, int cluster, int32_t* page_map, int32_t* list_lens,
                               int32_t* list_blocks, cudaStream_t st);
// sel's pages (list positions, rows of B x H) -> logical pages through page_map [rows, L].
void launch_map_positions(const int32_t* page_map, int L, const Selection& sel, int64_t rows,
                          cudaStream_t st);

}  // namespace locks::cuda::detail

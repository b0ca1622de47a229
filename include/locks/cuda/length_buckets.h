// Length buckets: one captured LOCKS step whose work follows the batch's longest row, not the
// plan's max_blocks_per_seq.
//
// A CUDA graph fixes every grid at capture, and a serving engine plans for its longest context
// (vLLM: max_model_len), so a 128K row in a step planned for 1M tokens launches the scoring
// grid, the aggregation and the selection cluster sized for 1M (docs/cuda_notes.md v40: +9 to
// +23% of the step a layer, after every kernel already skips what lies past a row).
// plan_length_buckets plans the same step for M, M / 2, M / 4, ... pages a row; decode_bucketed
// records, under stream capture, a one-block kernel that picks at each replay the smallest
// bucket holding the batch's longest row, and a SWITCH conditional node (CUDA >= 12.8) whose
// bodies are the buckets' steps. Outside capture it runs the full plan (the host does not read
// device lengths). Every bucket writes the same bits as the full plan: the step's results do
// not depend on its chunk or cluster sizes (tests/cuda/test_length_buckets.cpp checks each
// bucket against the full plan bit for bit).
//
// Plain structs, caller-owned: the plans are host data, one workspace of workspace_bytes serves
// every bucket (only one runs a step). The flat step only (not decode_two_level).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "locks/contract.h"
#include "locks/plan.h"

namespace locks::cuda {

constexpr int kMaxLengthBuckets = 8;

struct LengthBuckets {
  int count = 0;  // plans in use, in [1, kMaxLengthBuckets]
  // Ascending max_blocks_per_seq; plans[count - 1] is plan_decode(params) itself. Every plan has
  // the same params but max_blocks_per_seq, and the same selection capacity.
  DecodePlan plans[kMaxLengthBuckets];
  size_t workspace_bytes = 0;  // the largest plan's
};

// Plans for params.max_blocks_per_seq M and for ceil(M / 2^k), k = 1, 2, ..., at most
// max_buckets plans (in [1, kMaxLengthBuckets]), none below min_pages pages a row (>= 1).
// Halving stops where the selection capacity would shrink (the budget's pages, or dense_below's,
// exceed the bucket's rows: every plan's selection keeps the caller's capacity) or where the
// caller's forced knobs do not plan for the smaller rows. Throws what plan_decode throws for
// params, and locks::Unsupported for the two-level step.
LengthBuckets plan_length_buckets(const DecodeParams& params, int max_buckets, int min_pages);

// decode() with the plan of the bucket that holds the batch's longest row (every argument as
// decode's; ws.bytes >= buckets.workspace_bytes; selection_out, if given, has the plans'
// capacity; with no selection_out the selection is the step's scratch). Under stream capture
// it records a bucket choice and a SWITCH node (each body captured here, on a stream of its
// own that is destroyed before return); otherwise the full plan's step. Every check runs
// before anything is launched or recorded, for every bucket: a bad call records and writes
// nothing.
void decode_bucketed(const LengthBuckets& buckets, Workspace ws, const KvCacheView& cache,
                     const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                     const AttentionOutput& out, const Selection* selection_out,
                     cudaStream_t stream);

// score_select() (score -> aggregate -> select into out) the same way: the part of a step whose
// work depends on max_blocks_per_seq, for callers that attend separately (the torch op
// select_pages_bucketed, the vLLM plugin).
void score_select_bucketed(const LengthBuckets& buckets, Workspace ws, const SummaryView& summaries,
                           const BatchView& batch, const QueryView& q, const Selection& out,
                           cudaStream_t stream);

}  // namespace locks::cuda

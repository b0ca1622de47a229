// The decode contract: every op of a LOCKS decode step, spelled the same in locks::cpu and
// locks::cuda (the CUDA ones take a trailing stream), with caller-provided outputs and
// caller-provided scratch (a Workspace of plan.workspace_bytes, see plan.h).
//
//   DecodePlan plan = cpu::plan_decode(params);          // or cuda::plan_decode (host, once)
//   std::vector<std::byte> ws(plan.workspace_bytes);     // or cudaMalloc / a torch tensor
//   cpu::decode(plan, {ws.data(), ws.size()}, cache, summaries, batch, q, out, nullptr);
//
// Memory: cpu:: pointers are host pointers, cuda:: pointers device pointers (views in
// kv_cache.h, summary.h, score.h, select.h, attention.h). Host-side arguments (n_blocks,
// n_slots, appended, the plan) are plain values.
// The two-level step (plan from params.two_level): decode_two_level below.
//
// Invariants of every run call:
//   - no allocation: every buffer of the step lives in the workspace (CPU: per-thread
//     slices for plan.threads threads; tests/ops counts operator new over 1,000 decode
//     calls; the CPU summary builds are the exception: Eigen's SVD temporaries); CUDA: no
//     allocation and no host synchronisation, grids fixed by the plan and batch.batch_size:
//     capturable in a CUDA graph (summary builds included);
//   - outputs written whole or not at all: arguments are checked before any write (CUDA:
//     what the host can check; device arrays are trusted like a kernel's inputs);
//   - the partial tail page of a sequence has no summary and is always attended.
// Errors: locks::InvalidArgument for a wrong call, locks::Unsupported for a shape the
// backend lacks (supports() says which), locks::CudaError for a CUDA failure.
//
// Workspace contents: run calls use their own regions only; score_pages leaves per-chunk
// log-sum-exp partials (CUDA) that the following aggregate_gqa on the same workspace reads,
// so call aggregate_gqa after score_pages with the same plan, workspace, batch and stream.
// decode() is the whole step and needs nothing from earlier calls. One call at a time per
// workspace (CPU: a call uses the workspace's per-thread slices; CUDA: calls on one stream).
#pragma once

#include <cstdint>

#include "locks/attention.h"
#include "locks/cache_write.h"
#include "locks/error.h"
#include "locks/kv_cache.h"
#include "locks/plan.h"
#include "locks/request_rows.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "locks/super_summary.h"
#include "locks/support.h"

// cuda_runtime_api.h's own spelling, so that this header needs no CUDA headers.
typedef struct CUstream_st* cudaStream_t;

namespace locks {

namespace cpu {
// Validates params (throws InvalidArgument / Unsupported) and sizes the workspace for
// max_batch x max_blocks_per_seq and the threads OpenMP will use.
DecodePlan plan_decode(const DecodeParams& params);

// Summary builds (no plan, no workspace). out's layout must match the cache's geometry.
//   bulk: the summaries of block_ids[0..n_blocks) (full pages), every KV head (summary.h);
//   filled: for each sequence of batch (seq_lens after the append), the page that its last
//     `appended` tokens completed, if any (1 <= appended <= page_size; rules::filled_page);
//   slots: for each slot written this step (slot = block * P + offset, -1 = padding), the
//     block whose last slot (offset P - 1) it is (rules::slot_filled_block).
// Declared in summary.h: void summary_build(cache, block_ids, n_blocks, out);
void summary_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                          const SummaryView& out);
void summary_build_slots(const KvCacheView& cache, const int32_t* slot_mapping, int64_t n_slots,
                         const SummaryView& out);
// The cache write of a step and summary_build_slots in one call (cache_write.h): token i's K
// and V rows go to slot slot_mapping[i] (block * P + offset; -1 = padding, skipped; where
// several tokens name one slot, the last of them is written), then every block whose last slot
// (offset P - 1) was named is rebuilt from the cache as it is after the writes: the same bits
// as the writes followed by summary_build_slots over the same slots. out == nullptr: the
// writes alone. The CPU checks everything first (slots in [-1, num_blocks * P), the new rows
// finite, the summary views) and writes nothing on a bad call.
void cache_write_slots(const KvCacheWriteView& cache, const TokenRows& rows,
                       const int32_t* slot_mapping, const SummaryView* out);

// head_scores [batch, num_q_heads, batch.max_blocks_per_seq] (score.h).
void score_pages(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                 const BatchView& batch, const QueryView& q, float* head_scores);
// group_scores [batch, num_kv_heads, batch.max_blocks_per_seq] (score.h).
void aggregate_gqa(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                   const float* head_scores, float* group_scores);
// out.capacity == plan.capacity; rows [0, batch_size) written (select.h).
void select_pages(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                  const float* group_scores, const Selection& out);
// aggregate_gqa then select_pages (CUDA: one launch where the plan chose it,
// plan.select_cluster > 0; the same group scores and selection bit for bit).
void aggregate_select(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                      const float* head_scores, float* group_scores, const Selection& out);
// The step's selection without its attention: score_pages then aggregate_select, the scores in
// the plan's workspace (its head_scores and group_scores regions, the step's own), the lists in
// out (capacity == plan.capacity): the same selection as the two ops. For an engine that runs
// its own attention over the selection (the vLLM plugin). On CUDA the scores past a row's full
// pages are not written (the workspace's, not an output), which a plan for rows longer than it
// serves (an engine's max_model_len) would otherwise spend most of its scoring time on.
void score_select(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                  const BatchView& batch, const QueryView& q, const Selection& out);
// attention.h: sparse over sel (capacity <= plan.capacity), dense over every page.
void decode_attention_sparse(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                             const BatchView& batch, const QueryView& q, const Selection& sel,
                             const AttentionOutput& out);
void decode_attention_dense(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                            const BatchView& batch, const QueryView& q, const AttentionOutput& out);
// The whole step: score -> aggregate -> select -> sparse attention. selection_out: where to
// write the selection (capacity == plan.capacity), or nullptr to keep it in the workspace.
void decode(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
            const SummaryView& summaries, const BatchView& batch, const QueryView& q,
            const AttentionOutput& out, const Selection* selection_out);
// Speculative verification (request_rows.h): the selection `req` made once per request
// ([num_requests, num_kv_heads, req.capacity]) as each token row's list in `out`
// ([num_requests * tokens_per_request, num_kv_heads, out.capacity]). No plan, no workspace.
// The CPU checks the requests' selections (select.h's form) and every row first.
void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                  const Selection& out);
// The two-level step (super_summary.h; a plan with params.two_level): level 1 (super_score
// into plan.super_scores), the kept groups as a page list (select_groups_list into
// plan.page_map / list_lens), level-2 scoring of the listed pages only, aggregation and
// selection over list positions, positions mapped back to logical pages (ascending), then
// sparse attention. supers: the super summaries (layout == params.super); super_table:
// the slot of each complete group, max_groups_per_seq >= plan.max_groups. The selection
// equals the mask path's (select_groups, score_pages_masked, aggregate_gqa, select_pages).
// CPU: level 1 and the group choice allocate small per-group buffers (the other ops do not).
void decode_two_level(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                      const SummaryView& summaries, const SuperView& supers,
                      const SuperTableView& super_table, const BatchView& batch, const QueryView& q,
                      const AttentionOutput& out, const Selection* selection_out);
}  // namespace cpu

namespace cuda {
// Host side; queries the device (SM count, occupancy) and sets kernel attributes once, here.
DecodePlan plan_decode(const DecodeParams& params);

void summary_build(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                   const SummaryView& out, cudaStream_t stream);
void summary_build_filled(const KvCacheView& cache, const BatchView& batch, int appended,
                          const SummaryView& out, cudaStream_t stream);
void summary_build_slots(const KvCacheView& cache, const int32_t* slot_mapping, int64_t n_slots,
                         const SummaryView& out, cudaStream_t stream);
// One launch, a block per (token, KV head); slots are device data: a slot outside
// [0, num_blocks * P) is skipped (docs/bad_input.md). Each block reads the call's slot_mapping
// once to find a later token naming its slot (the last one writes) and, for a block to build,
// which token wrote each of its other rows (read from the rows, not from the cache being
// written): O(n_tokens^2 x KV heads) slot reads, made for decode steps (n_tokens = the batch;
// at most limits::kCacheWriteMaxTokens, Unsupported above).
void cache_write_slots(const KvCacheWriteView& cache, const TokenRows& rows,
                       const int32_t* slot_mapping, const SummaryView* out, cudaStream_t stream);

void score_pages(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                 const BatchView& batch, const QueryView& q, float* head_scores,
                 cudaStream_t stream);
void aggregate_gqa(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                   const float* head_scores, float* group_scores, cudaStream_t stream);
void select_pages(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                  const float* group_scores, const Selection& out, cudaStream_t stream);
void aggregate_select(const DecodePlan& plan, Workspace ws, const BatchView& batch,
                      const float* head_scores, float* group_scores, const Selection& out,
                      cudaStream_t stream);
void score_select(const DecodePlan& plan, Workspace ws, const SummaryView& summaries,
                  const BatchView& batch, const QueryView& q, const Selection& out,
                  cudaStream_t stream);
void decode_attention_sparse(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                             const BatchView& batch, const QueryView& q, const Selection& sel,
                             const AttentionOutput& out, cudaStream_t stream);
void decode_attention_dense(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                            const BatchView& batch, const QueryView& q, const AttentionOutput& out,
                            cudaStream_t stream);
void decode(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
            const SummaryView& summaries, const BatchView& batch, const QueryView& q,
            const AttentionOutput& out, const Selection* selection_out, cudaStream_t stream);
// One launch, a warp per (row, KV head); lengths, counts and pages are device data: a count
// outside [0, req.capacity] or a partial last page that does not fit gives the row count -1
// (invalid: the attention writes NaN rows), a row of length < 1 count 0 (request_rows.h).
void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                  const Selection& out, cudaStream_t stream);
// cpu::decode_two_level on the GPU: no allocation, no host synchronisation (capturable).
void decode_two_level(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                      const SummaryView& summaries, const SuperView& supers,
                      const SuperTableView& super_table, const BatchView& batch, const QueryView& q,
                      const AttentionOutput& out, const Selection* selection_out,
                      cudaStream_t stream);
// The first `stages` stages of decode_two_level (1: level 1; 2: + group choice and page
// list; 3: + level-2 scoring; 4: + aggregation, selection and the map back to pages; 5: +
// attention, the whole step), for per-stage timing (locks_bench_cuda --two-level).
void decode_two_level_stages(const DecodePlan& plan, Workspace ws, const KvCacheView& cache,
                             const SummaryView& summaries, const SuperView& supers,
                             const SuperTableView& super_table, const BatchView& batch,
                             const QueryView& q, const AttentionOutput& out,
                             const Selection* selection_out, int stages, cudaStream_t stream);
}  // namespace cuda

}  // namespace locks

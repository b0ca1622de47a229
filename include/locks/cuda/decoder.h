// The LOCKS decode step on the GPU (H100/H200, sm_90a): score pages from summaries, average
// over each GQA group, select pages under the budget, attend over the selected pages (and
// the dense FullKV baseline on the same cache). Same contracts as locks::cpu (score.h,
// select.h, attention.h); all data pointers are device pointers.
//
// The contract (locks/contract.h: cuda::plan_decode and the run calls, caller-owned
// workspace) is the API; this header keeps the older object form over it. Nothing in the
// run calls allocates or synchronises with the host, and every grid depends only on the
// plan and on batch.batch_size, so a whole step can be captured in one CUDA graph and
// replayed while seq_lens, block tables, queries and the cache change in place.
//
// Supported: supports(Backend::cuda, ...) (locks/support.h, table in locks/cuda/limits.h):
// page_size 16, head_dim 64, 128 or 256, GQA group in [1, 32]; locks::Unsupported otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "locks/attention.h"
#include "locks/contract.h"
#include "locks/decoder.h"
#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks::cuda {

struct Plan {
  CacheLayout cache;
  int num_q_heads = 32;
  int max_batch = 1;
  int max_blocks_per_seq = 1;
  DecodeConfig cfg;
  // Pages per scoring block on the tensor-core path: 0 = chosen from the plan (128, halved
  // down to 32 while the grid would fill less than half a wave; 96 or 64 where 128 leaves a
  // partial second wave; 64 over two waves at d 128 with G <= 4); 32, 64, 96 or 128 to force
  // one.
  int score_chunk_pages = 0;
  // Pages per first-stage selection block: 0 = chosen from the plan (2048 up to 16K pages a
  // sequence, 4096 above); 2048 or 4096 to force one.
  int select_chunk_pages = 0;
  // Aggregation + selection in one cluster launch: 0 = the plan's rule, -1 = never, 1-16
  // (a power of two) to force that many blocks per (sequence, KV head).
  int select_cluster = 0;
  // Selected pages per split-K attention block: 0 = the plan's rule; a multiple of 4 in
  // [4, 512] to force one (DecodeParams::attn_pages_per_split).
  int attn_pages_per_split = 0;
  // The summaries the decoder will score (geometry from cache).
  int rank = 8;
  Precision precision = Precision::quant;
  int basis_group = 0;  // dims per int4 basis scale; 0 = default_basis_group(head_dim)
};

// A convenience owner over the contract for tests and benchmarks: plans at construction,
// allocates the plan's workspace there (one cudaMalloc, freed by the destructor) and runs
// the contract's ops on it; the stage outputs live in the workspace's own regions. Serving
// code should call the contract directly with its own workspace.
class Decoder {
 public:
  explicit Decoder(const Plan& plan);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // The full LOCKS step: score -> aggregate -> select -> sparse attention.
  void run(const KvCacheView& cache, const SummaryView& summaries, const BatchView& batch,
           const QueryView& q, const AttentionOutput& out, cudaStream_t stream);
  // FullKV baseline: split-K attention over every page.
  void run_dense(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                 const AttentionOutput& out, cudaStream_t stream);

  // The stages, each usable alone (tests compare them op by op with the CPU).
  void score(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
             cudaStream_t stream);                              // -> head_scores()
  void aggregate(const BatchView& batch, cudaStream_t stream);  // -> group_scores()
  void select(const BatchView& batch, cudaStream_t stream);     // -> selection()
  // aggregate + select as the step runs them (one launch where the plan chose it).
  void aggregate_select(const BatchView& batch, cudaStream_t stream);
  // score + aggregate + select as the step runs them: the head scores are not written past each
  // row's full pages (score() writes them whole, which costs blocks past short rows).
  void score_select(const SummaryView& summaries, const BatchView& batch, const QueryView& q,
                    cudaStream_t stream);
  int select_cluster() const;  // the plan's choice (0: separate launches)
  void attend(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
              const Selection* sel, const AttentionOutput& out, cudaStream_t stream);

  // Device buffers of the last run: [max_batch, num_q_heads, max_blocks_per_seq],
  // [max_batch, num_kv_heads, max_blocks_per_seq], and the selection (capacity from
  // select_capacity). Rows past batch.batch_size are stale, and after run() (score_select)
  // so are the head scores past each row's full pages; after score() they are -inf.
  const float* head_scores() const;
  const float* group_scores() const;
  Selection selection() const;
  // Set when the plan's shapes let scoring use the tensor-core kernel (quant, r 8).
  bool tensor_core_scoring(const SummaryLayout& s) const;
  const Plan& plan() const { return plan_; }
  const DecodePlan& decode_plan() const { return dplan_; }
  float scale() const { return dplan_.params.scale; }

 private:
  Plan plan_;
  DecodePlan dplan_;
  Workspace ws_;
};

}  // namespace locks::cuda

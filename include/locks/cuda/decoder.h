// The LOCKS decode step on the GPU (H100/H200, sm_90a): score pages from summaries, average
// over each GQA group, select pages under the budget, attend over the selected pages (and
// the dense FullKV baseline on the same cache). Same contracts as locks::cpu (score.h,
// select.h, attention.h); all data pointers are device pointers.
//
// Plan once for a batch shape (the constructor allocates every workspace); run many times.
// Nothing in the run calls allocates or synchronises with the host, and every grid depends
// only on the plan and on batch.batch_size, so a whole step can be captured in one CUDA
// graph and replayed while seq_lens, block tables, queries and the cache change in place.
//
// Supported (checked, locks::Error otherwise; the table is locks/cuda/limits.h): page_size
// 16, head_dim 64, 128 or 256, cache dtype bf16 or f16 for attention (scoring and summaries
// also accept f32 caches), GQA group num_q_heads / num_kv_heads in [1, 32].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "locks/attention.h"
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
  // down to 32 while the grid would fill less than half a wave); 32, 64 or 128 to force one.
  int score_chunk_pages = 0;
  // Pages per first-stage selection block: 0 = chosen from the plan (2048 up to 16K pages a
  // sequence, 4096 above); 2048 or 4096 to force one.
  int select_chunk_pages = 0;
};

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
  void attend(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
              const Selection* sel, const AttentionOutput& out, cudaStream_t stream);

  // Device buffers of the last run: [max_batch, num_q_heads, max_blocks_per_seq],
  // [max_batch, num_kv_heads, max_blocks_per_seq], and the selection (capacity from
  // select_capacity). Rows past batch.batch_size are stale.
  const float* head_scores() const { return head_scores_; }
  const float* group_scores() const { return group_scores_; }
  Selection selection() const { return {pages_, counts_, capacity_}; }
  // Set when the plan's shapes let scoring use the tensor-core kernel (quant, r 8).
  bool tensor_core_scoring(const SummaryLayout& s) const;
  const Plan& plan() const { return plan_; }
  float scale() const { return scale_; }

 private:
  void check_batch(const BatchView& batch) const;
  Plan plan_;
  float scale_;
  int group_, capacity_, score_chunks_, select_chunks_, dense_pps_, dense_splits_, sparse_pps_,
      sparse_splits_;
  // Pages per scoring block: planned for the tensor-core path (smaller when the grid would
  // not fill the GPU) and the one the last score() used (aggregate() reads its partials).
  int tc_chunk_pages_ = 128, score_chunk_pages_ = 128;
  int select_chunk_pages_ = 4096;
  float* head_scores_ = nullptr;
  float* chunk_lse_ = nullptr;  // [max_batch, num_q_heads, score_chunks_, 2] (max, sum)
  float* group_scores_ = nullptr;
  float* head_lse_ = nullptr;  // [max_batch, num_q_heads]
  int32_t* pages_ = nullptr;
  int32_t* counts_ = nullptr;
  uint32_t* cand_key_ = nullptr;  // [max_batch, num_kv_heads, select_chunks, capacity]
  int32_t* cand_idx_ = nullptr;
  int32_t* cand_cnt_ = nullptr;  // [max_batch, num_kv_heads, select_chunks]
  float* part_o_ = nullptr;      // [max_batch, num_q_heads, max splits, head_dim]
  float* part_ml_ = nullptr;     // [max_batch, num_q_heads, max splits, 2]
};

}  // namespace locks::cuda

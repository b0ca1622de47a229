// The whole LOCKS decode step on the CPU: score pages from summaries, aggregate over each
// GQA group, select pages under the budget, attend exactly over the selected pages.
// A convenience owner over the contract (contract.h: cpu::plan_decode + the run calls) for
// callers that want the intermediate scores and one object: it keeps the plan and its
// workspace (planned at the first run, again only when the summary rank or precision change).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "locks/attention.h"
#include "locks/kv_cache.h"
#include "locks/plan.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks {

struct DecodeConfig {
  SelectConfig select;
  float scale = 0.0f;  // softmax scale; 0 means 1/sqrt(head_dim)
};

namespace cpu {
class Decoder {
 public:
  Decoder(const CacheLayout& cache, int num_q_heads, int max_batch, int max_blocks_per_seq,
          const DecodeConfig& cfg);
  // Runs score -> aggregate -> select -> sparse attention. batch.batch_size <= max_batch and
  // batch.max_blocks_per_seq <= the planned value.
  void run(const KvCacheView& cache, const SummaryView& summaries, const BatchView& batch,
           const QueryView& q, const AttentionOutput& out);
  // Results of the last run (host memory owned by the decoder); the score vectors are sized
  // [batch, heads, batch.max_blocks_per_seq] of that run, the selection [max_batch, KV heads,
  // capacity] with the run's batch in its first rows. Not thread-safe: one run at a time.
  Selection selection();
  const std::vector<float>& head_scores() const { return head_scores_; }
  const std::vector<float>& group_scores() const { return group_scores_; }

 private:
  CacheLayout cache_;
  int num_q_heads_, max_batch_, max_blocks_;
  DecodeConfig cfg_;
  int capacity_;
  std::vector<float> head_scores_, group_scores_;
  std::vector<int32_t> pages_, counts_;
  bool planned_ = false;
  DecodePlan plan_;
  std::vector<std::byte> workspace_;
};
}  // namespace cpu

}  // namespace locks

// One sequence in a paged cache, its summaries, one LOCKS decode step and the FullKV step
// beside it: the common core of `locks select` and `locks demo`. Built from the public
// locks_core API only (PagedKvCache, cpu::summary_build, cpu::Decoder, dense attention).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "locks/decoder.h"
#include "locks/kv_cache.h"
#include "locks/summary.h"

namespace locks::cli {

struct StepResult {
  int num_q_heads = 0, head_dim = 0;
  std::vector<float> out_locks, out_full;   // [num_q_heads, head_dim]
  std::vector<double> recall, cosine;       // [num_q_heads]
  std::vector<std::vector<int32_t>> pages;  // per KV head: selected logical pages, ascending
  std::vector<int64_t> attended_tokens;     // per KV head
};

// Bytes one decode step reads, all KV heads: K/V counted at bf16 (2 bytes an element)
// whatever the cache holds, summaries counted as stored.
struct StepBytes {
  double summaries = 0, selected_kv = 0, full_kv = 0;
  double locks() const { return summaries + selected_kv; }
};

class SingleSequence {
 public:
  // keys/values: float32 [tokens, num_kv_heads, head_dim]; copied into a cache of `dtype`.
  SingleSequence(const float* keys, const float* values, int64_t tokens, int num_kv_heads,
                 int head_dim, int page_size, DType dtype = DType::f32);

  // Summaries of every full page; progress on stderr under `label` (none when null).
  std::unique_ptr<SummaryStore> build_summaries(int rank, Precision precision,
                                                const char* label) const;

  // One LOCKS step (cpu::Decoder) and one dense step for q [num_q_heads, head_dim].
  StepResult step(SummaryStore& summaries, const float* q, int num_q_heads,
                  const SelectConfig& select) const;
  StepBytes bytes(const SummaryLayout& summaries, const StepResult& r) const;

  // Best wall time (ms) of `reps` LOCKS steps and of `reps` dense steps, after a warm-up.
  struct Timing {
    double locks_ms = 0, dense_ms = 0;
  };
  Timing time_steps(SummaryStore& summaries, const float* q, int num_q_heads,
                    const SelectConfig& select, int reps) const;

  int64_t tokens() const { return tokens_; }
  int64_t full_pages() const { return tokens_ / cache_.layout().page_size; }
  const PagedKvCache& cache() const { return cache_; }

 private:
  int64_t tokens_;
  PagedKvCache cache_;
  PagedKvCache::Batch batch_;
};

}  // namespace locks::cli

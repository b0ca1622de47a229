// The decode step over sub-batches (#14's overlap experiment; docs/cuda_notes.md "The step over
// sub-batches"): the batch's rows split into consecutive parts, each part its own decoder (plan
// for its size, workspace), the parts' scorings one after another on one stream and each part's
// aggregation + selection + attention on a second stream once its scoring is done, so a part's
// selection and attention run beside the next part's scoring. One code for the bench
// (`locks_bench_cuda --pipeline`) and the test that checks it (tests/cuda/test_sub_batches.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "locks/cuda/check.h"
#include "locks/cuda/decoder.h"

namespace locks::cuda_bench {

// Rows [first, first + n) of a batch, through offset views of its block table and lengths.
inline BatchView batch_rows(const BatchView& b, int first, int n) {
  BatchView v = b;
  v.block_table += int64_t(first) * b.block_table_stride;
  v.seq_lens += first;
  v.batch_size = n;
  return v;
}

class SubBatchStep {
 public:
  // One decoder a part: `plan` with max_batch = the part's size.
  SubBatchStep(const cuda::Plan& plan, const std::vector<int>& sizes)
      : sizes_(sizes), first_(sizes.size(), 0), events_(sizes.size() + 3) {
    for (size_t i = 0; i < sizes_.size(); ++i) {
      cuda::Plan sub = plan;
      sub.max_batch = sizes_[i];
      dec_.push_back(std::make_unique<cuda::Decoder>(sub));
      if (i + 1 < sizes_.size()) first_[i + 1] = first_[i] + sizes_[i];
    }
    for (cudaEvent_t& e : events_)
      LOCKS_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~SubBatchStep() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  SubBatchStep(const SubBatchStep&) = delete;
  SubBatchStep& operator=(const SubBatchStep&) = delete;

  // Enqueues the step on `st` (forked onto `lo` for the scorings and `hi` for the rest, joined
  // back): capturable in one graph. q and out: [batch, hq, head_dim] fp32, the whole batch's.
  void run(const KvCacheView& cache, const SummaryView& summaries, const BatchView& batch,
           const float* q, int hq, float* out, cudaStream_t st, cudaStream_t lo, cudaStream_t hi) {
    const size_t K = sizes_.size(), row = size_t(hq) * cache.layout.head_dim;
    LOCKS_CUDA_CHECK(cudaEventRecord(events_[K], st));  // fork
    LOCKS_CUDA_CHECK(cudaStreamWaitEvent(lo, events_[K]));
    LOCKS_CUDA_CHECK(cudaStreamWaitEvent(hi, events_[K]));
    for (size_t i = 0; i < K; ++i) {
      dec_[i]->score(summaries, part(batch, i), QueryView{q + first_[i] * row, hq}, lo);
      LOCKS_CUDA_CHECK(cudaEventRecord(events_[i], lo));
    }
    for (size_t i = 0; i < K; ++i) {
      LOCKS_CUDA_CHECK(cudaStreamWaitEvent(hi, events_[i]));
      dec_[i]->aggregate_select(part(batch, i), hi);
      const Selection sel = dec_[i]->selection();
      dec_[i]->attend(cache, part(batch, i), QueryView{q + first_[i] * row, hq}, &sel,
                      AttentionOutput{out + first_[i] * row, nullptr}, hi);
    }
    LOCKS_CUDA_CHECK(cudaEventRecord(events_[K + 1], lo));  // join
    LOCKS_CUDA_CHECK(cudaEventRecord(events_[K + 2], hi));
    LOCKS_CUDA_CHECK(cudaStreamWaitEvent(st, events_[K + 1]));
    LOCKS_CUDA_CHECK(cudaStreamWaitEvent(st, events_[K + 2]));
  }

  // Part i's decoder (its selection: the part's rows) and first row.
  const cuda::Decoder& decoder(size_t i) const { return *dec_[i]; }
  int first(size_t i) const { return first_[i]; }

 private:
  BatchView part(const BatchView& batch, size_t i) const {
    return batch_rows(batch, first_[i], sizes_[i]);
  }
  std::vector<int> sizes_, first_;
  std::vector<std::unique_ptr<cuda::Decoder>> dec_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace locks::cuda_bench

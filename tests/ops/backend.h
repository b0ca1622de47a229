// The backend seam of the cross-backend op suite (test_backend_ops.cpp, in the spirit of
// llama.cpp's test-backend-ops): memory and the contract's ops of one backend behind one
// interface, so that the same cases run on every backend against the float64 reference.
// tests/ops/backend_cpu.cpp and tests/cuda/backend_cuda.cpp implement make_backend().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "locks/contract.h"
#include "test_compare.h"

namespace locks::test {

class OpsBackend {
 public:
  virtual ~OpsBackend() = default;
  virtual Backend kind() const = 0;
  // Empty when usable; else why not (no GPU): the suite skips.
  virtual std::string unavailable() const = 0;
  // Backend memory, zero-filled, 256-byte aligned, freed with the backend.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void put(void* dst, const void* src, size_t bytes) = 0;
  virtual void get(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(void* dst, int byte, size_t bytes) = 0;
  // Bytes of memory in use by the process (CPU: resident set; CUDA: device memory in use).
  virtual int64_t memory_in_use() = 0;
  virtual void finish() = 0;  // wait for the queued work
  // Host heap allocations (operator new) made so far by the process, or -1 when this
  // backend's binary does not count them.
  virtual int64_t host_allocations() const { return -1; }
  // The backend's arithmetic beyond float32 for this cache dtype (test_compare.h).
  virtual ArithModel arith(DType kv_dtype) const = 0;

  virtual DecodePlan plan(const DecodeParams& p) = 0;
  virtual void summary_build(const KvCacheView& c, const int32_t* ids, int64_t n,
                             const SummaryView& out) = 0;
  virtual void summary_build_filled(const KvCacheView& c, const BatchView& b, int appended,
                                    const SummaryView& out) = 0;
  virtual void summary_build_slots(const KvCacheView& c, const int32_t* slots, int64_t n,
                                   const SummaryView& out) = 0;
  virtual void cache_write_slots(const KvCacheWriteView& c, const TokenRows& rows,
                                 const int32_t* slots, const SummaryView* out) = 0;
  virtual void score_pages(const DecodePlan& p, Workspace ws, const SummaryView& s,
                           const BatchView& b, const QueryView& q, float* hs) = 0;
  virtual void aggregate_gqa(const DecodePlan& p, Workspace ws, const BatchView& b, const float* hs,
                             float* gs) = 0;
  virtual void select_pages(const DecodePlan& p, Workspace ws, const BatchView& b, const float* gs,
                            const Selection& out) = 0;
  virtual void aggregate_select(const DecodePlan& p, Workspace ws, const BatchView& b,
                                const float* hs, float* gs, const Selection& out) = 0;
  virtual void score_select(const DecodePlan& p, Workspace ws, const SummaryView& s,
                            const BatchView& b, const QueryView& q, const Selection& out) = 0;
  virtual void attention_sparse(const DecodePlan& p, Workspace ws, const KvCacheView& c,
                                const BatchView& b, const QueryView& q, const Selection& sel,
                                const AttentionOutput& out) = 0;
  virtual void attention_dense(const DecodePlan& p, Workspace ws, const KvCacheView& c,
                               const BatchView& b, const QueryView& q,
                               const AttentionOutput& out) = 0;
  virtual void decode(const DecodePlan& p, Workspace ws, const KvCacheView& c, const SummaryView& s,
                      const BatchView& b, const QueryView& q, const AttentionOutput& out,
                      const Selection* sel) = 0;
  virtual void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads,
                            int page_size, const Selection& out) = 0;
};

std::unique_ptr<OpsBackend> make_backend();

}  // namespace locks::test

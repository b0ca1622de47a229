// The CUDA backend of the op suite (tests/ops/backend.h): device memory, the default stream
// and the cuda:: contract. Unavailable (every case skips) without a CUDA device.
#include <cuda_runtime_api.h>

#include "backend.h"
#include "cuda_arith.h"
#include "locks/cuda/check.h"

namespace locks::test {
namespace {

class CudaBackend final : public OpsBackend {
 public:
  Backend kind() const override { return Backend::cuda; }
  std::string unavailable() const override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      cudaGetLastError();
      return "no CUDA device";
    }
    return {};
  }
  void* alloc(size_t bytes) override {
    void* p = nullptr;
    LOCKS_CUDA_CHECK(cudaMalloc(&p, (bytes + 255) / 256 * 256 + 256));
    LOCKS_CUDA_CHECK(cudaMemset(p, 0, (bytes + 255) / 256 * 256 + 256));
    return p;
  }
  void free(void* p) override { LOCKS_CUDA_CHECK(cudaFree(p)); }
  void put(void* dst, const void* src, size_t n) override {  // done before any stream's work
    LOCKS_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
    LOCKS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void get(void* dst, const void* src, size_t n) override {
    LOCKS_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  }
  void fill(void* dst, int byte, size_t n) override {
    LOCKS_CUDA_CHECK(cudaMemset(dst, byte, n));
    LOCKS_CUDA_CHECK(cudaDeviceSynchronize());
  }
  int64_t memory_in_use() override {
    size_t free_b = 0, total = 0;
    LOCKS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    return int64_t(total) - int64_t(free_b);
  }
  void finish() override { LOCKS_CUDA_CHECK(cudaDeviceSynchronize()); }
  ArithModel arith(DType kv) const override { return cuda_arith(kv); }

  DecodePlan plan(const DecodeParams& p) override { return cuda::plan_decode(p); }
  void summary_build(const KvCacheView& c, const int32_t* ids, int64_t n,
                     const SummaryView& out) override {
    cuda::summary_build(c, ids, n, out, nullptr);
  }
  void summary_build_filled(const KvCacheView& c, const BatchView& b, int appended,
                            const SummaryView& out) override {
    cuda::summary_build_filled(c, b, appended, out, nullptr);
  }
  void summary_build_slots(const KvCacheView& c, const int32_t* slots, int64_t n,
                           const SummaryView& out) override {
    cuda::summary_build_slots(c, slots, n, out, nullptr);
  }
  void cache_write_slots(const KvCacheWriteView& c, const TokenRows& rows, const int32_t* slots,
                         const SummaryView* out) override {
    cuda::cache_write_slots(c, rows, slots, out, nullptr);
  }
  void score_pages(const DecodePlan& p, Workspace ws, const SummaryView& s, const BatchView& b,
                   const QueryView& q, float* hs) override {
    cuda::score_pages(p, ws, s, b, q, hs, nullptr);
  }
  void aggregate_gqa(const DecodePlan& p, Workspace ws, const BatchView& b, const float* hs,
                     float* gs) override {
    cuda::aggregate_gqa(p, ws, b, hs, gs, nullptr);
  }
  void select_pages(const DecodePlan& p, Workspace ws, const BatchView& b, const float* gs,
                    const Selection& out) override {
    cuda::select_pages(p, ws, b, gs, out, nullptr);
  }
  void aggregate_select(const DecodePlan& p, Workspace ws, const BatchView& b, const float* hs,
                        float* gs, const Selection& out) override {
    cuda::aggregate_select(p, ws, b, hs, gs, out, nullptr);
  }
  void score_select(const DecodePlan& p, Workspace ws, const SummaryView& s, const BatchView& b,
                    const QueryView& q, const Selection& out) override {
    cuda::score_select(p, ws, s, b, q, out, nullptr);
  }
  void attention_sparse(const DecodePlan& p, Workspace ws, const KvCacheView& c, const BatchView& b,
                        const QueryView& q, const Selection& sel,
                        const AttentionOutput& out) override {
    cuda::decode_attention_sparse(p, ws, c, b, q, sel, out, nullptr);
  }
  void attention_dense(const DecodePlan& p, Workspace ws, const KvCacheView& c, const BatchView& b,
                       const QueryView& q, const AttentionOutput& out) override {
    cuda::decode_attention_dense(p, ws, c, b, q, out, nullptr);
  }
  void decode(const DecodePlan& p, Workspace ws, const KvCacheView& c, const SummaryView& s,
              const BatchView& b, const QueryView& q, const AttentionOutput& out,
              const Selection* sel) override {
    cuda::decode(p, ws, c, s, b, q, out, sel, nullptr);
  }
  void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                    const Selection& out) override {
    cuda::request_rows(rows, req, num_kv_heads, page_size, out, nullptr);
  }
};

}  // namespace

std::unique_ptr<OpsBackend> make_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace locks::test

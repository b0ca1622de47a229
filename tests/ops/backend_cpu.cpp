// The CPU backend of the op suite (backend.h): host memory and the cpu:: contract.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#include "backend.h"

// Every operator new of this binary is counted, so that the suite can show the CPU run
// calls allocate nothing (their memory is the caller's workspace).
namespace {
std::atomic<int64_t> g_news{0};
}  // namespace
void* operator new(size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace locks::test {
namespace {

class CpuBackend final : public OpsBackend {
 public:
  Backend kind() const override { return Backend::cpu; }
  std::string unavailable() const override { return {}; }
  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    std::memset(p, 0, (bytes + 255) / 256 * 256 + 256);
    return p;
  }
  void free(void* p) override { std::free(p); }
  void put(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void get(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void fill(void* dst, int byte, size_t n) override { std::memset(dst, byte, n); }
  int64_t memory_in_use() override {
    std::ifstream f("/proc/self/statm");
    int64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * int64_t(sysconf(_SC_PAGESIZE));
  }
  void finish() override {}
  int64_t host_allocations() const override { return g_news.load(); }
  ArithModel arith(DType) const override { return {}; }  // float32 throughout

  DecodePlan plan(const DecodeParams& p) override { return cpu::plan_decode(p); }
  void summary_build(const KvCacheView& c, const int32_t* ids, int64_t n,
                     const SummaryView& out) override {
    cpu::summary_build(c, ids, n, out);
  }
  void summary_build_filled(const KvCacheView& c, const BatchView& b, int appended,
                            const SummaryView& out) override {
    cpu::summary_build_filled(c, b, appended, out);
  }
  void summary_build_slots(const KvCacheView& c, const int32_t* slots, int64_t n,
                           const SummaryView& out) override {
    cpu::summary_build_slots(c, slots, n, out);
  }
  void cache_write_slots(const KvCacheWriteView& c, const TokenRows& rows, const int32_t* slots,
                         const SummaryView* out) override {
    cpu::cache_write_slots(c, rows, slots, out);
  }
  void score_pages(const DecodePlan& p, Workspace ws, const SummaryView& s, const BatchView& b,
                   const QueryView& q, float* hs) override {
    cpu::score_pages(p, ws, s, b, q, hs);
  }
  void aggregate_gqa(const DecodePlan& p, Workspace ws, const BatchView& b, const float* hs,
                     float* gs) override {
    cpu::aggregate_gqa(p, ws, b, hs, gs);
  }
  void select_pages(const DecodePlan& p, Workspace ws, const BatchView& b, const float* gs,
                    const Selection& out) override {
    cpu::select_pages(p, ws, b, gs, out);
  }
  void aggregate_select(const DecodePlan& p, Workspace ws, const BatchView& b, const float* hs,
                        float* gs, const Selection& out) override {
    cpu::aggregate_select(p, ws, b, hs, gs, out);
  }
  void score_select(const DecodePlan& p, Workspace ws, const SummaryView& s, const BatchView& b,
                    const QueryView& q, const Selection& out) override {
    cpu::score_select(p, ws, s, b, q, out);
  }
  void attention_sparse(const DecodePlan& p, Workspace ws, const KvCacheView& c, const BatchView& b,
                        const QueryView& q, const Selection& sel,
                        const AttentionOutput& out) override {
    cpu::decode_attention_sparse(p, ws, c, b, q, sel, out);
  }
  void attention_dense(const DecodePlan& p, Workspace ws, const KvCacheView& c, const BatchView& b,
                       const QueryView& q, const AttentionOutput& out) override {
    cpu::decode_attention_dense(p, ws, c, b, q, out);
  }
  void decode(const DecodePlan& p, Workspace ws, const KvCacheView& c, const SummaryView& s,
              const BatchView& b, const QueryView& q, const AttentionOutput& out,
              const Selection* sel) override {
    cpu::decode(p, ws, c, s, b, q, out, sel);
  }
  void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                    const Selection& out) override {
    cpu::request_rows(rows, req, num_kv_heads, page_size, out);
  }
};

}  // namespace

std::unique_ptr<OpsBackend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace locks::test

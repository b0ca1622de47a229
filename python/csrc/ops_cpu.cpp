// CPU implementations of the `locks` tensor ops: ops_impl.h over locks::cpu (contract.h).
#include <torch/library.h>

#include "ops_impl.h"

namespace locks_torch {
namespace {

// The contract's cpu:: calls; the stream argument of ops_impl.h is dropped.
struct CpuOps {
  static constexpr at::DeviceType kDevice = at::kCPU;
  static constexpr locks::Backend kBackend = locks::Backend::cpu;
  struct Guard {
    explicit Guard(const at::Device&) {}
  };
  struct Stream {};
  static Stream stream(const at::Device&) { return {}; }

  static void summary_build(const locks::KvCacheView& c, const int32_t* ids, int64_t n,
                            const locks::SummaryView& o, Stream) {
    locks::cpu::summary_build(c, ids, n, o);
  }
  static void summary_build_filled(const locks::KvCacheView& c, const locks::BatchView& b,
                                   int appended, const locks::SummaryView& o, Stream) {
    locks::cpu::summary_build_filled(c, b, appended, o);
  }
  static void summary_build_slots(const locks::KvCacheView& c, const int32_t* slots, int64_t n,
                                  const locks::SummaryView& o, Stream) {
    locks::cpu::summary_build_slots(c, slots, n, o);
  }
  static void score_pages(const locks::DecodePlan& p, locks::Workspace ws,
                          const locks::SummaryView& s, const locks::BatchView& b,
                          const locks::QueryView& q, float* head_scores, Stream) {
    locks::cpu::score_pages(p, ws, s, b, q, head_scores);
  }
  static void aggregate_gqa(const locks::DecodePlan& p, locks::Workspace ws,
                            const locks::BatchView& b, const float* hs, float* gs, Stream) {
    locks::cpu::aggregate_gqa(p, ws, b, hs, gs);
  }
  static void select_pages(const locks::DecodePlan& p, locks::Workspace ws,
                           const locks::BatchView& b, const float* gs, const locks::Selection& sel,
                           Stream) {
    locks::cpu::select_pages(p, ws, b, gs, sel);
  }
  static void decode_attention_sparse(const locks::DecodePlan& p, locks::Workspace ws,
                                      const locks::KvCacheView& c, const locks::BatchView& b,
                                      const locks::QueryView& q, const locks::Selection& sel,
                                      const locks::AttentionOutput& o, Stream) {
    locks::cpu::decode_attention_sparse(p, ws, c, b, q, sel, o);
  }
  static void decode_attention_dense(const locks::DecodePlan& p, locks::Workspace ws,
                                     const locks::KvCacheView& c, const locks::BatchView& b,
                                     const locks::QueryView& q, const locks::AttentionOutput& o,
                                     Stream) {
    locks::cpu::decode_attention_dense(p, ws, c, b, q, o);
  }
};

}  // namespace
}  // namespace locks_torch

TORCH_LIBRARY_IMPL(locks, CPU, m) { locks_torch::register_ops<locks_torch::CpuOps>(m); }

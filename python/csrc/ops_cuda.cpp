// CUDA implementations of the `locks` tensor ops: ops_impl.h over locks::cuda (contract.h).
// Every launch goes on torch's current stream of the tensors' device; nothing here
// allocates, synchronises with the host or keeps state (the plan vector and the workspace
// are the caller's), so a step built from these ops can be captured in a CUDA graph and
// replayed with new lengths, tables and queries.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "locks/cuda/length_buckets.h"
#include "ops_impl.h"
#include "ops_two_level.h"

namespace locks_torch {
namespace {

struct CudaOps {
  static constexpr at::DeviceType kDevice = at::kCUDA;
  static constexpr locks::Backend kBackend = locks::Backend::cuda;
  using Guard = c10::cuda::CUDAGuard;
  using Stream = cudaStream_t;
  static Stream stream(const at::Device& d) {
    return c10::cuda::getCurrentCUDAStream(d.index()).stream();
  }

  static void summary_build(const locks::KvCacheView& c, const int32_t* ids, int64_t n,
                            const locks::SummaryView& o, Stream st) {
    locks::cuda::summary_build(c, ids, n, o, st);
  }
  static void summary_build_filled(const locks::KvCacheView& c, const locks::BatchView& b,
                                   int appended, const locks::SummaryView& o, Stream st) {
    locks::cuda::summary_build_filled(c, b, appended, o, st);
  }
  static void summary_build_slots(const locks::KvCacheView& c, const int32_t* slots, int64_t n,
                                  const locks::SummaryView& o, Stream st) {
    locks::cuda::summary_build_slots(c, slots, n, o, st);
  }
  static void cache_write_slots(const locks::KvCacheWriteView& c, const locks::TokenRows& r,
                                const int32_t* slots, const locks::SummaryView* o, Stream st) {
    locks::cuda::cache_write_slots(c, r, slots, o, st);
  }
  static void score_select(const locks::DecodePlan& p, locks::Workspace ws,
                           const locks::SummaryView& s, const locks::BatchView& b,
                           const locks::QueryView& q, const locks::Selection& sel, Stream st) {
    locks::cuda::score_select(p, ws, s, b, q, sel, st);
  }
  static void score_select_bucketed(const std::vector<locks::DecodePlan>& plans,
                                    locks::Workspace ws, const locks::SummaryView& s,
                                    const locks::BatchView& b, const locks::QueryView& q,
                                    const locks::Selection& sel, Stream st) {
    TORCH_CHECK_VALUE(plans.size() <= size_t(locks::cuda::kMaxLengthBuckets),
                      "select_pages_bucketed: ", plans.size(), " plans, at most ",
                      locks::cuda::kMaxLengthBuckets);
    locks::cuda::LengthBuckets bk;
    bk.count = int(plans.size());
    for (size_t i = 0; i < plans.size(); ++i) {
      bk.plans[i] = plans[i];
      bk.workspace_bytes = std::max(bk.workspace_bytes, plans[i].workspace_bytes);
    }
    locks::cuda::score_select_bucketed(bk, ws, s, b, q, sel, st);
  }
  static void request_rows(const locks::RequestRows& r, const locks::Selection& req, int H, int P,
                           const locks::Selection& out, Stream st) {
    locks::cuda::request_rows(r, req, H, P, out, st);
  }
  static void decode_attention_sparse(const locks::DecodePlan& p, locks::Workspace ws,
                                      const locks::KvCacheView& c, const locks::BatchView& b,
                                      const locks::QueryView& q, const locks::Selection& sel,
                                      const locks::AttentionOutput& o, Stream st) {
    locks::cuda::decode_attention_sparse(p, ws, c, b, q, sel, o, st);
  }
  static void decode_attention_dense(const locks::DecodePlan& p, locks::Workspace ws,
                                     const locks::KvCacheView& c, const locks::BatchView& b,
                                     const locks::QueryView& q, const locks::AttentionOutput& o,
                                     Stream st) {
    locks::cuda::decode_attention_dense(p, ws, c, b, q, o, st);
  }
  static void super_build(const locks::KvCacheView& c, const int32_t* blocks, const int32_t* slots,
                          int64_t n, const locks::SuperView& o, Stream st) {
    locks::cuda::super_build(c, blocks, slots, n, o, st);
  }
  static void super_build_filled(const locks::KvCacheView& c, const locks::BatchView& b,
                                 int appended, const locks::SuperTableView& t,
                                 const locks::SuperView& o, Stream st) {
    locks::cuda::super_build_filled(c, b, appended, t, o, st);
  }
  static void decode_two_level(const locks::DecodePlan& p, locks::Workspace ws,
                               const locks::KvCacheView& c, const locks::SummaryView& s,
                               const locks::SuperView& sv, const locks::SuperTableView& t,
                               const locks::BatchView& b, const locks::QueryView& q,
                               const locks::AttentionOutput& o, const locks::Selection* sel,
                               Stream st) {
    locks::cuda::decode_two_level(p, ws, c, s, sv, t, b, q, o, sel, st);
  }
};

}  // namespace
}  // namespace locks_torch

TORCH_LIBRARY_IMPL(locks, CUDA, m) {
  locks_torch::register_ops<locks_torch::CudaOps>(m);
  locks_torch::register_two_level_ops<locks_torch::CudaOps>(m);
}

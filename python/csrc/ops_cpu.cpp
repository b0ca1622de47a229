// CPU implementations of the `locks` tensor ops: ops_impl.h over locks::cpu (contract.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "ops_impl.h"
#include "ops_two_level.h"

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
  static void cache_write_slots(const locks::KvCacheWriteView& c, const locks::TokenRows& r,
                                const int32_t* slots, const locks::SummaryView* o, Stream) {
    locks::cpu::cache_write_slots(c, r, slots, o);
  }
  static void score_select(const locks::DecodePlan& p, locks::Workspace ws,
                           const locks::SummaryView& s, const locks::BatchView& b,
                           const locks::QueryView& q, const locks::Selection& sel, Stream) {
    locks::cpu::score_select(p, ws, s, b, q, sel);
  }
  // No graphs on the CPU: one bucket, the plan itself (length_buckets of a CPU plan).
  static void score_select_bucketed(const std::vector<locks::DecodePlan>& plans,
                                    locks::Workspace ws, const locks::SummaryView& s,
                                    const locks::BatchView& b, const locks::QueryView& q,
                                    const locks::Selection& sel, Stream) {
    TORCH_CHECK_VALUE(plans.size() == 1, "select_pages_bucketed: ", plans.size(),
                      " CPU plans; a CPU plan has one bucket (length_buckets)");
    locks::cpu::score_select(plans[0], ws, s, b, q, sel);
  }
  static void request_rows(const locks::RequestRows& r, const locks::Selection& req, int H, int P,
                           const locks::Selection& out, Stream) {
    locks::cpu::request_rows(r, req, H, P, out);
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
  static void super_build(const locks::KvCacheView& c, const int32_t* blocks, const int32_t* slots,
                          int64_t n, const locks::SuperView& o, Stream) {
    locks::cpu::super_build(c, blocks, slots, n, o);
  }
  static void super_build_filled(const locks::KvCacheView& c, const locks::BatchView& b,
                                 int appended, const locks::SuperTableView& t,
                                 const locks::SuperView& o, Stream) {
    locks::cpu::super_build_filled(c, b, appended, t, o);
  }
  static void decode_two_level(const locks::DecodePlan& p, locks::Workspace ws,
                               const locks::KvCacheView& c, const locks::SummaryView& s,
                               const locks::SuperView& sv, const locks::SuperTableView& t,
                               const locks::BatchView& b, const locks::QueryView& q,
                               const locks::AttentionOutput& o, const locks::Selection* sel,
                               Stream) {
    locks::cpu::decode_two_level(p, ws, c, s, sv, t, b, q, o, sel);
  }
};

at::Tensor qweight_from_queries(const at::Tensor& q_obs, int64_t num_kv_heads, double floor) {
  require(q_obs, "q_obs", at::kFloat, 3);
  const int64_t n = q_obs.size(0);
  const int hq = to_int(q_obs.size(1), "q_obs.size(1) (num_q_heads)");
  const int d = to_int(q_obs.size(2), "q_obs.size(2) (head_dim)");
  const int hkv = to_int(num_kv_heads, "num_kv_heads");
  at::Tensor out = at::empty({num_kv_heads, d}, q_obs.options());
  translate_errors([&] {
    locks::qweight_from_queries(q_obs.data_ptr<float>(), n, hq, hkv, d, out.data_ptr<float>(),
                                floor);
  });
  return out;
}

}  // namespace
}  // namespace locks_torch

TORCH_LIBRARY_IMPL(locks, CPU, m) {
  locks_torch::register_ops<locks_torch::CpuOps>(m);
  locks_torch::register_two_level_ops<locks_torch::CpuOps>(m);
  m.impl("qweight_from_queries", &locks_torch::qweight_from_queries);
}

// plan and supports over the contract (include/locks/plan.h, support.h, contract.h).
#include "ops_plan.h"

#include <cmath>

#include "locks/contract.h"
#ifdef LOCKS_WITH_CUDA
#include "locks/cuda/length_buckets.h"
#endif
#include "locks/rules.h"
#include "torch_views.h"

namespace locks_torch {
namespace {

locks::Backend to_backend(int64_t b) {
  TORCH_CHECK_VALUE(b == 0 || b == 1, "backend: 0 (cpu) or 1 (cuda), got ", b);
  return b == 0 ? locks::Backend::cpu : locks::Backend::cuda;
}

locks::Precision to_precision(int64_t p) {
  TORCH_CHECK_VALUE(p == 0 || p == 1, "precision: 0 (fp32) or 1 (int4), got ", p);
  return p == 0 ? locks::Precision::fp32 : locks::Precision::quant;
}

locks::DecodePlan plan_decode(locks::Backend be, const locks::DecodeParams& p) {
  if (be == locks::Backend::cpu) return locks::cpu::plan_decode(p);
#ifdef LOCKS_WITH_CUDA
  return locks::cuda::plan_decode(p);
#else
  throw locks::Unsupported("plan: this build of the locks package has no CUDA operators");
#endif
}

}  // namespace

std::vector<int64_t> plan(int64_t backend, int64_t num_blocks, int64_t page_size,
                          int64_t num_kv_heads, int64_t head_dim, at::ScalarType kv_dtype,
                          int64_t rank, int64_t precision, int64_t num_q_heads, int64_t max_batch,
                          int64_t max_blocks_per_seq, int64_t budget_tokens, int64_t sink_pages,
                          int64_t recent_pages, double scale, double tau, int64_t floor_pages,
                          int64_t dense_below, int64_t group_pages, int64_t super_slots,
                          int64_t super_rank, double alpha, int64_t min_groups,
                          int64_t flat_below_groups) {
  const locks::Backend be = to_backend(backend);
  TORCH_CHECK_VALUE(num_blocks >= 1, "num_blocks = ", num_blocks, " must be >= 1");
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale >= 0, "scale = ", scale,
                    " must be finite and >= 0 (0: 1/sqrt(head_dim))");
  locks::DecodeParams p;
  p.cache.num_blocks = num_blocks;
  p.cache.page_size = to_int(page_size, "page_size", 1);
  p.cache.num_kv_heads = to_int(num_kv_heads, "num_kv_heads", 1);
  p.cache.head_dim = to_int(head_dim, "head_dim", 1);
  p.cache.dtype = to_dtype(kv_dtype, "kv_dtype");
  p.num_q_heads = to_int(num_q_heads, "num_q_heads", 1);
  p.max_batch = to_int(max_batch, "max_batch", 1);
  p.max_blocks_per_seq = to_int(max_blocks_per_seq, "max_blocks_per_seq", 1);
  p.select.budget_tokens = to_int(budget_tokens, "budget_tokens", 0);
  p.select.sink_pages = to_int(sink_pages, "sink_pages", 0);
  p.select.recent_pages = to_int(recent_pages, "recent_pages", 0);
  p.scale = static_cast<float>(scale);
  TORCH_CHECK_VALUE(tau == 0.0 || (tau > 0.0 && tau <= 1.0), "tau = ", tau,
                    " must be 0 (fixed budget) or in (0, 1]");  // NaN fails both
  p.select.tau = static_cast<float>(tau);
  // A positive tau that rounds to float 0 would silently mean the fixed budget.
  TORCH_CHECK_VALUE(locks::rules::tau_valid(p.select.tau) && (tau == 0.0) == (p.select.tau == 0.0f),
                    "tau = ", tau, " is not representable as a positive float");
  p.select.floor_pages = to_int(floor_pages, "floor_pages", 0);
  p.select.dense_below = to_int(dense_below, "dense_below", 0);
  if (group_pages != 0) {  // a two-level plan (validated by plan_decode)
    p.two_level = true;
    p.super.group_pages = to_int(group_pages, "group_pages", 1);
    TORCH_CHECK_VALUE(super_slots >= 1, "super_slots = ", super_slots,
                      " must be >= 1 with group_pages > 0");
    p.super.num_slots = super_slots;
    p.super.page_size = p.cache.page_size;
    p.super.num_kv_heads = p.cache.num_kv_heads;
    p.super.head_dim = p.cache.head_dim;
    p.super.rank = to_int(super_rank, "super_rank", 1);
    p.super.extent = true;
    p.two.alpha = alpha;  // validated by plan_decode (validate_two_level)
    p.two.min_groups = to_int(min_groups, "min_groups", 1);
    p.two.flat_below_groups = to_int(flat_below_groups, "flat_below_groups", 0);
  }
  const int r = to_int(rank, "rank", 1);
  const locks::Precision prec = to_precision(precision);
  std::vector<int64_t> out;
  translate_errors([&] {
    // An unsupported shape is NotImplementedError with the capability query's reason, the
    // same answer as locks.supports (the layout checks below would call it invalid).
    if (p.num_q_heads % p.cache.num_kv_heads == 0) {
      locks::DecodeShape shape;
      shape.head_dim = p.cache.head_dim;
      shape.page_size = p.cache.page_size;
      shape.group = p.num_q_heads / p.cache.num_kv_heads;
      shape.kv_dtype = p.cache.dtype;
      shape.rank = r;
      shape.precision = prec;
      locks::require_supported(be, shape);
    }
    p.summary = locks::summary_layout_for(p.cache, r, prec);
    out = plan_decode(be, p).to_ints();
  });
  return out;
}

std::vector<int64_t> length_buckets(at::IntArrayRef plan, int64_t max_buckets, int64_t min_pages) {
  locks::DecodePlan p;
  translate_errors([&] { p = locks::DecodePlan::from_ints(plan.data(), plan.size()); });
  const int n = to_int(max_buckets, "max_buckets", 1), least = to_int(min_pages, "min_pages", 1);
  if (p.backend == locks::Backend::cpu) return plan.vec();
  std::vector<int64_t> out;
#ifdef LOCKS_WITH_CUDA
  translate_errors([&] {
    const locks::cuda::LengthBuckets b = locks::cuda::plan_length_buckets(p.params, n, least);
    for (int i = 0; i < b.count; ++i) {
      const std::vector<int64_t> v = b.plans[i].to_ints();
      out.insert(out.end(), v.begin(), v.end());
    }
  });
#else
  (void)n, (void)least;
  throw locks::Unsupported("length_buckets: this build of the locks package has no CUDA operators");
#endif
  return out;
}

std::string supports(int64_t backend, int64_t head_dim, int64_t page_size, int64_t group,
                     at::ScalarType kv_dtype, int64_t rank, int64_t precision) {
  locks::DecodeShape s;
  s.head_dim = to_int(head_dim, "head_dim");
  s.page_size = to_int(page_size, "page_size");
  s.group = to_int(group, "group");
  s.kv_dtype = to_dtype(kv_dtype, "kv_dtype");
  s.rank = to_int(rank, "rank");
  s.precision = to_precision(precision);
  const locks::Support r = locks::supports(to_backend(backend), s);
  return r.ok ? std::string() : (r.reason.empty() ? std::string("unsupported") : r.reason);
}

}  // namespace locks_torch

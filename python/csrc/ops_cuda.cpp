// CUDA implementations of the `locks` operators: bindings over locks_cuda's host API
// (include/locks/cuda/decoder.h, summary_builder.h). Every launch goes on torch's current
// stream; nothing here synchronises with the host or allocates once a shape has been seen,
// so a decode step built from these ops can be captured in a CUDA graph (run it once eagerly
// first: that plans the decoder for the shape, which allocates its workspace).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "locks/cuda/decoder.h"
#include "locks/cuda/summary_builder.h"
#include "torch_views.h"

namespace locks_torch {
namespace {

// Planned decoders / builders, one per (device, shapes, config): planning allocates device
// workspace, which must not happen inside a graph capture or on every call.
using DecoderKey =
    std::tuple<int, int64_t, int, int, int, int, int, int, int, int, int, int, float>;
using BuilderKey = std::tuple<int, int64_t, int, int, int, int, int, int>;
std::mutex g_mu;
std::map<DecoderKey, std::unique_ptr<locks::cuda::Decoder>> g_decoders;
std::map<BuilderKey, std::unique_ptr<locks::cuda::SummaryBuilder>> g_builders;

locks::cuda::Decoder& decoder(const locks::CacheLayout& L, int num_q_heads, int batch,
                              int max_blocks, int budget, int sink, int recent, float scale,
                              int device) {
  const DecoderKey key{
      device,      L.num_blocks, L.page_size, L.num_kv_heads, L.head_dim, static_cast<int>(L.dtype),
      num_q_heads, batch,        max_blocks,  budget,         sink,       recent,
      scale};
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = g_decoders[key];
  if (!slot) {
    locks::cuda::Plan plan;
    plan.cache = L;
    plan.num_q_heads = num_q_heads;
    plan.max_batch = batch;
    plan.max_blocks_per_seq = max_blocks;
    plan.cfg.select.budget_tokens = budget;
    plan.cfg.select.sink_pages = sink;
    plan.cfg.select.recent_pages = recent;
    plan.cfg.scale = scale;
    slot = std::make_unique<locks::cuda::Decoder>(plan);
  }
  return *slot;
}

locks::cuda::SummaryBuilder& builder(const locks::CacheLayout& L, const locks::SummaryLayout& S,
                                     int device) {
  // The precision is part of the plan: an fp32 builder must not serve quant summaries.
  const BuilderKey key{device,      L.num_blocks,
                       L.page_size, L.num_kv_heads,
                       L.head_dim,  static_cast<int>(L.dtype),
                       S.rank,      static_cast<int>(S.precision)};
  std::lock_guard<std::mutex> lock(g_mu);
  auto& slot = g_builders[key];
  if (!slot)
    slot = std::make_unique<locks::cuda::SummaryBuilder>(L, S, locks::cuda::Solver::warp_jacobi,
                                                         std::max<int64_t>(1, L.num_blocks));
  return *slot;
}

cudaStream_t stream_for(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

using ViewFn = std::function<locks::SummaryView(const locks::CacheLayout&, const at::Device&)>;

void build(const at::Tensor& k_cache, const at::Tensor& block_ids, const ViewFn& view) {
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const locks::CacheLayout layout = cache_layout(k_cache, at::Tensor());
  const at::Device dev = k_cache.device();
  require(block_ids, "block_ids", at::kInt, 1, dev);
  const locks::SummaryView s = view(layout, dev);
  if (block_ids.numel() == 0) return;
  const locks::KvCacheView cache{k_cache.data_ptr(), nullptr, layout};
  translate_errors([&] {
    builder(layout, s.layout, dev.index())
        .build(cache, block_ids.data_ptr<int32_t>(), block_ids.numel(), s, stream_for(k_cache));
  });
}

void update(const at::Tensor& k_cache, const at::Tensor& block_table, const at::Tensor& seq_lens,
            const ViewFn& view) {
  const c10::cuda::CUDAGuard guard(k_cache.device());
  const locks::CacheLayout layout = cache_layout(k_cache, at::Tensor());
  const at::Device dev = k_cache.device();
  const locks::BatchView batch = batch_view(block_table, seq_lens, dev);
  const locks::SummaryView s = view(layout, dev);
  const locks::KvCacheView cache{k_cache.data_ptr(), nullptr, layout};
  translate_errors([&] {
    builder(layout, s.layout, dev.index()).build_filled(cache, batch, 1, s, stream_for(k_cache));
  });
}

void select(const at::Tensor& q, const locks::SummaryView& s, const at::Tensor& block_table,
            const at::Tensor& seq_lens, int64_t budget_tokens, int64_t sink_pages,
            int64_t recent_pages, double scale, const at::Tensor& pages, const at::Tensor& counts) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Device dev = q.device();
  locks::CacheLayout layout = layout_of_summaries(s.layout.num_blocks, s.layout.num_kv_heads,
                                                  s.layout.head_dim, s.layout.page_size);
  layout.dtype = locks::DType::bf16;  // scoring reads summaries only; the plan needs a dtype
  const locks::BatchView batch = batch_view(block_table, seq_lens, dev);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim, dev);
  const locks::Selection sel =
      selection_view(pages, counts, batch.batch_size, layout.num_kv_heads, dev);
  translate_errors([&] {
    auto& d = decoder(layout, qv.num_q_heads, batch.batch_size, batch.max_blocks_per_seq,
                      static_cast<int>(budget_tokens), static_cast<int>(sink_pages),
                      static_cast<int>(recent_pages), static_cast<float>(scale), dev.index());
    const cudaStream_t st = stream_for(q);
    d.score(s, batch, qv, st);
    d.aggregate(batch, st);
    d.select(batch, st);
    const locks::Selection mine = d.selection();
    LOCKS_REQUIRE(mine.capacity == sel.capacity, "pages: capacity ", sel.capacity,
                  " differs from the budget's ", mine.capacity, " (locks.ops.select_capacity)");
    const size_t n = static_cast<size_t>(batch.batch_size) * layout.num_kv_heads;
    C10_CUDA_CHECK(cudaMemcpyAsync(sel.pages, mine.pages, n * sel.capacity * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, st));
    C10_CUDA_CHECK(cudaMemcpyAsync(sel.counts, mine.counts, n * sizeof(int32_t),
                                   cudaMemcpyDeviceToDevice, st));
  });
}

ViewFn fp32_view(at::Tensor& mu, at::Tensor& basis, at::Tensor& coeff) {
  return [&](const locks::CacheLayout& l, const at::Device& d) {
    return summary_view(mu, basis, coeff, l, d);
  };
}

ViewFn quant_view(at::Tensor& mu_q, at::Tensor& mu_scale, at::Tensor& basis_q,
                  at::Tensor& basis_scale, at::Tensor& coeff_q, at::Tensor& coeff_scale) {
  return [&](const locks::CacheLayout& l, const at::Device& d) {
    return summary_view_quant(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale, l, d);
  };
}

void summary_build_cuda(const at::Tensor& k_cache, const at::Tensor& block_ids, at::Tensor& mu,
                        at::Tensor& basis, at::Tensor& coeff) {
  build(k_cache, block_ids, fp32_view(mu, basis, coeff));
}

void summary_build_quant_cuda(const at::Tensor& k_cache, const at::Tensor& block_ids,
                              at::Tensor& mu_q, at::Tensor& mu_scale, at::Tensor& basis_q,
                              at::Tensor& basis_scale, at::Tensor& coeff_q,
                              at::Tensor& coeff_scale) {
  build(k_cache, block_ids, quant_view(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale));
}

void summary_update_cuda(const at::Tensor& k_cache, const at::Tensor& block_table,
                         const at::Tensor& seq_lens, at::Tensor& mu, at::Tensor& basis,
                         at::Tensor& coeff) {
  update(k_cache, block_table, seq_lens, fp32_view(mu, basis, coeff));
}

void summary_update_quant_cuda(const at::Tensor& k_cache, const at::Tensor& block_table,
                               const at::Tensor& seq_lens, at::Tensor& mu_q, at::Tensor& mu_scale,
                               at::Tensor& basis_q, at::Tensor& basis_scale, at::Tensor& coeff_q,
                               at::Tensor& coeff_scale) {
  update(k_cache, block_table, seq_lens,
         quant_view(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale));
}

void select_pages_cuda(const at::Tensor& q, const at::Tensor& mu, const at::Tensor& basis,
                       const at::Tensor& coeff, const at::Tensor& block_table,
                       const at::Tensor& seq_lens, int64_t budget_tokens, int64_t sink_pages,
                       int64_t recent_pages, double scale, at::Tensor& pages, at::Tensor& counts) {
  TORCH_CHECK_VALUE(mu.dim() == 3 && coeff.dim() == 4,
                    "mu/coeff: expected [num_blocks, H, d] and [num_blocks, H, P, r]");
  const auto l = layout_of_summaries(mu.size(0), mu.size(1), mu.size(2), coeff.size(2));
  select(q, summary_view(mu, basis, coeff, l, q.device()), block_table, seq_lens, budget_tokens,
         sink_pages, recent_pages, scale, pages, counts);
}

void select_pages_quant_cuda(const at::Tensor& q, const at::Tensor& mu_q,
                             const at::Tensor& mu_scale, const at::Tensor& basis_q,
                             const at::Tensor& basis_scale, const at::Tensor& coeff_q,
                             const at::Tensor& coeff_scale, const at::Tensor& block_table,
                             const at::Tensor& seq_lens, int64_t budget_tokens, int64_t sink_pages,
                             int64_t recent_pages, double scale, at::Tensor& pages,
                             at::Tensor& counts) {
  TORCH_CHECK_VALUE(mu_q.dim() == 3 && coeff_q.dim() == 4,
                    "mu_q/coeff_q: expected [num_blocks, H, d] and [num_blocks, H, P, r]");
  const auto l = layout_of_summaries(mu_q.size(0), mu_q.size(1), mu_q.size(2), coeff_q.size(2));
  select(
      q,
      summary_view_quant(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale, l, q.device()),
      block_table, seq_lens, budget_tokens, sink_pages, recent_pages, scale, pages, counts);
}

void sparse_decode_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_table, const at::Tensor& seq_lens,
                        const at::Tensor& pages, const at::Tensor& counts, double scale,
                        at::Tensor& out, at::Tensor& lse) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Device dev = q.device();
  const locks::CacheLayout layout = cache_layout(k_cache, v_cache);
  const locks::BatchView batch = batch_view(block_table, seq_lens, dev);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim, dev);
  const locks::Selection sel =
      selection_view(pages, counts, batch.batch_size, layout.num_kv_heads, dev);
  const locks::AttentionOutput o =
      output_view(out, lse, qv, batch.batch_size, layout.head_dim, dev);
  const locks::KvCacheView cache{k_cache.data_ptr(), v_cache.data_ptr(), layout};
  translate_errors([&] {
    // A budget giving exactly this capacity plans the same sparse split as select_pages did.
    auto& d =
        decoder(layout, qv.num_q_heads, batch.batch_size, batch.max_blocks_per_seq,
                sel.capacity * layout.page_size, 0, 0, static_cast<float>(scale), dev.index());
    d.attend(cache, batch, qv, &sel, o, stream_for(q));
  });
}

void dense_decode_cuda(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_table, const at::Tensor& seq_lens, double scale,
                       at::Tensor& out, at::Tensor& lse) {
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Device dev = q.device();
  const locks::CacheLayout layout = cache_layout(k_cache, v_cache);
  const locks::BatchView batch = batch_view(block_table, seq_lens, dev);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim, dev);
  const locks::AttentionOutput o =
      output_view(out, lse, qv, batch.batch_size, layout.head_dim, dev);
  const locks::KvCacheView cache{k_cache.data_ptr(), v_cache.data_ptr(), layout};
  translate_errors([&] {
    auto& d = decoder(layout, qv.num_q_heads, batch.batch_size, batch.max_blocks_per_seq,
                      batch.max_blocks_per_seq * layout.page_size, 0, 0, static_cast<float>(scale),
                      dev.index());
    d.run_dense(cache, batch, qv, o, stream_for(q));
  });
}

}  // namespace
}  // namespace locks_torch

TORCH_LIBRARY_IMPL(locks, CUDA, m) {
  m.impl("summary_build", &locks_torch::summary_build_cuda);
  m.impl("summary_update", &locks_torch::summary_update_cuda);
  m.impl("select_pages", &locks_torch::select_pages_cuda);
  m.impl("summary_build_quant", &locks_torch::summary_build_quant_cuda);
  m.impl("summary_update_quant", &locks_torch::summary_update_quant_cuda);
  m.impl("select_pages_quant", &locks_torch::select_pages_quant_cuda);
  m.impl("sparse_decode", &locks_torch::sparse_decode_cuda);
  m.impl("dense_decode", &locks_torch::dense_decode_cuda);
}

// CPU implementations of the `locks` operators: thin wrappers over locks_core (cpu::).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <functional>
#include <vector>

#include "locks/attention.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "torch_views.h"

namespace locks_torch {
namespace {

const at::Device kCpu(at::kCPU);

void build(const at::Tensor& k_cache, const at::Tensor& block_ids,
           const std::function<locks::SummaryView(const locks::CacheLayout&)>& view) {
  const locks::CacheLayout layout = cache_layout(k_cache, at::Tensor());
  TORCH_CHECK_VALUE(k_cache.device() == kCpu, "k_cache: expected a CPU tensor");
  require(block_ids, "block_ids", at::kInt, 1, kCpu);
  const locks::SummaryView s = view(layout);
  if (block_ids.numel() == 0) return;
  const locks::KvCacheView cache{k_cache.data_ptr(), nullptr, layout};
  translate_errors([&] {
    locks::cpu::summary_build(cache, block_ids.data_ptr<int32_t>(), block_ids.numel(), s);
  });
}

void update(const at::Tensor& k_cache, const at::Tensor& block_table, const at::Tensor& seq_lens,
            const std::function<locks::SummaryView(const locks::CacheLayout&)>& view) {
  const locks::CacheLayout layout = cache_layout(k_cache, at::Tensor());
  TORCH_CHECK_VALUE(k_cache.device() == kCpu, "k_cache: expected a CPU tensor");
  const locks::BatchView batch = batch_view(block_table, seq_lens, kCpu);
  const locks::SummaryView s = view(layout);
  translate_errors([&] { locks::validate_batch(layout, batch); });
  std::vector<int32_t> filled;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t len = batch.seq_lens[b];
    if (len % layout.page_size == 0)
      filled.push_back(
          batch.block_table[b * batch.block_table_stride + len / layout.page_size - 1]);
  }
  if (filled.empty()) return;
  const locks::KvCacheView cache{k_cache.data_ptr(), nullptr, layout};
  translate_errors([&] {
    locks::cpu::summary_build(cache, filled.data(), static_cast<int64_t>(filled.size()), s);
  });
}

void select(const at::Tensor& q, const locks::SummaryView& s, const at::Tensor& block_table,
            const at::Tensor& seq_lens, int64_t budget_tokens, int64_t sink_pages,
            int64_t recent_pages, double scale, const at::Tensor& pages, const at::Tensor& counts) {
  const locks::CacheLayout layout = layout_of_summaries(s.layout.num_blocks, s.layout.num_kv_heads,
                                                        s.layout.head_dim, s.layout.page_size);
  const locks::BatchView batch = batch_view(block_table, seq_lens, kCpu);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim, kCpu);
  const locks::Selection sel =
      selection_view(pages, counts, batch.batch_size, layout.num_kv_heads, kCpu);
  locks::SelectConfig cfg;
  cfg.budget_tokens = static_cast<int>(budget_tokens);
  cfg.sink_pages = static_cast<int>(sink_pages);
  cfg.recent_pages = static_cast<int>(recent_pages);
  translate_errors([&] {
    locks::validate_layout(layout);
    locks::validate_batch(layout, batch);
    const size_t per_seq = static_cast<size_t>(batch.max_blocks_per_seq);
    std::vector<float> head_scores(per_seq * batch.batch_size * qv.num_q_heads);
    std::vector<float> group_scores(per_seq * batch.batch_size * layout.num_kv_heads);
    locks::cpu::score_pages(s, batch, qv, static_cast<float>(scale), head_scores.data());
    locks::cpu::aggregate_gqa(head_scores.data(), batch, qv.num_q_heads, layout.num_kv_heads,
                              group_scores.data());
    locks::cpu::select_pages(group_scores.data(), batch, layout.num_kv_heads, layout.page_size, cfg,
                             sel);
  });
}

void summary_build_cpu(const at::Tensor& k_cache, const at::Tensor& block_ids, at::Tensor& mu,
                       at::Tensor& basis, at::Tensor& coeff) {
  build(k_cache, block_ids,
        [&](const locks::CacheLayout& l) { return summary_view(mu, basis, coeff, l, kCpu); });
}

void summary_build_quant_cpu(const at::Tensor& k_cache, const at::Tensor& block_ids,
                             at::Tensor& mu_q, at::Tensor& mu_scale, at::Tensor& basis_q,
                             at::Tensor& basis_scale, at::Tensor& coeff_q,
                             at::Tensor& coeff_scale) {
  build(k_cache, block_ids, [&](const locks::CacheLayout& l) {
    return summary_view_quant(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale, l, kCpu);
  });
}

void summary_update_cpu(const at::Tensor& k_cache, const at::Tensor& block_table,
                        const at::Tensor& seq_lens, at::Tensor& mu, at::Tensor& basis,
                        at::Tensor& coeff) {
  update(k_cache, block_table, seq_lens,
         [&](const locks::CacheLayout& l) { return summary_view(mu, basis, coeff, l, kCpu); });
}

void summary_update_quant_cpu(const at::Tensor& k_cache, const at::Tensor& block_table,
                              const at::Tensor& seq_lens, at::Tensor& mu_q, at::Tensor& mu_scale,
                              at::Tensor& basis_q, at::Tensor& basis_scale, at::Tensor& coeff_q,
                              at::Tensor& coeff_scale) {
  update(k_cache, block_table, seq_lens, [&](const locks::CacheLayout& l) {
    return summary_view_quant(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale, l, kCpu);
  });
}

void select_pages_cpu(const at::Tensor& q, const at::Tensor& mu, const at::Tensor& basis,
                      const at::Tensor& coeff, const at::Tensor& block_table,
                      const at::Tensor& seq_lens, int64_t budget_tokens, int64_t sink_pages,
                      int64_t recent_pages, double scale, at::Tensor& pages, at::Tensor& counts) {
  TORCH_CHECK_VALUE(mu.dim() == 3 && coeff.dim() == 4,
                    "mu/coeff: expected [num_blocks, H, d] and [num_blocks, H, P, r]");
  const auto l = layout_of_summaries(mu.size(0), mu.size(1), mu.size(2), coeff.size(2));
  select(q, summary_view(mu, basis, coeff, l, kCpu), block_table, seq_lens, budget_tokens,
         sink_pages, recent_pages, scale, pages, counts);
}

void select_pages_quant_cpu(const at::Tensor& q, const at::Tensor& mu_q, const at::Tensor& mu_scale,
                            const at::Tensor& basis_q, const at::Tensor& basis_scale,
                            const at::Tensor& coeff_q, const at::Tensor& coeff_scale,
                            const at::Tensor& block_table, const at::Tensor& seq_lens,
                            int64_t budget_tokens, int64_t sink_pages, int64_t recent_pages,
                            double scale, at::Tensor& pages, at::Tensor& counts) {
  TORCH_CHECK_VALUE(mu_q.dim() == 3 && coeff_q.dim() == 4,
                    "mu_q/coeff_q: expected [num_blocks, H, d] and [num_blocks, H, P, r]");
  const auto l = layout_of_summaries(mu_q.size(0), mu_q.size(1), mu_q.size(2), coeff_q.size(2));
  select(q, summary_view_quant(mu_q, mu_scale, basis_q, basis_scale, coeff_q, coeff_scale, l, kCpu),
         block_table, seq_lens, budget_tokens, sink_pages, recent_pages, scale, pages, counts);
}

void sparse_decode_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const at::Tensor& block_table, const at::Tensor& seq_lens,
                       const at::Tensor& pages, const at::Tensor& counts, double scale,
                       at::Tensor& out, at::Tensor& lse) {
  const locks::CacheLayout layout = cache_layout(k_cache, v_cache);
  TORCH_CHECK_VALUE(k_cache.device() == kCpu, "k_cache: expected a CPU tensor");
  const locks::BatchView batch = batch_view(block_table, seq_lens, kCpu);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim, kCpu);
  const locks::Selection sel =
      selection_view(pages, counts, batch.batch_size, layout.num_kv_heads, kCpu);
  const locks::AttentionOutput o =
      output_view(out, lse, qv, batch.batch_size, layout.head_dim, kCpu);
  const locks::KvCacheView cache{k_cache.data_ptr(), v_cache.data_ptr(), layout};
  translate_errors([&] {
    locks::cpu::decode_attention_sparse(cache, batch, qv, static_cast<float>(scale), sel, o);
  });
}

void dense_decode_cpu(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_table, const at::Tensor& seq_lens, double scale,
                      at::Tensor& out, at::Tensor& lse) {
  const locks::CacheLayout layout = cache_layout(k_cache, v_cache);
  TORCH_CHECK_VALUE(k_cache.device() == kCpu, "k_cache: expected a CPU tensor");
  const locks::BatchView batch = batch_view(block_table, seq_lens, kCpu);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim, kCpu);
  const locks::AttentionOutput o =
      output_view(out, lse, qv, batch.batch_size, layout.head_dim, kCpu);
  const locks::KvCacheView cache{k_cache.data_ptr(), v_cache.data_ptr(), layout};
  translate_errors(
      [&] { locks::cpu::decode_attention_dense(cache, batch, qv, static_cast<float>(scale), o); });
}

}  // namespace
}  // namespace locks_torch

TORCH_LIBRARY_IMPL(locks, CPU, m) {
  m.impl("summary_build", &locks_torch::summary_build_cpu);
  m.impl("summary_update", &locks_torch::summary_update_cpu);
  m.impl("select_pages", &locks_torch::select_pages_cpu);
  m.impl("summary_build_quant", &locks_torch::summary_build_quant_cpu);
  m.impl("summary_update_quant", &locks_torch::summary_update_quant_cpu);
  m.impl("select_pages_quant", &locks_torch::select_pages_quant_cpu);
  m.impl("sparse_decode", &locks_torch::sparse_decode_cpu);
  m.impl("dense_decode", &locks_torch::dense_decode_cpu);
}

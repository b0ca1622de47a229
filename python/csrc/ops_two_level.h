// The two-level (super-page) tensor ops of ops_schema.cpp, written once for both backends
// like ops_impl.h: super_build (bulk), super_update (the group each sequence's last token
// completed) and decode_two_level (the whole step, the selection optionally written out).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>

#include "locks/contract.h"
#include "ops_impl.h"
#include "torch_super_views.h"

namespace locks_torch {

template <class B>
void super_build(const at::Tensor& k_cache, const at::Tensor& group_blocks, const at::Tensor& slots,
                 at::TensorList supers) {
  const at::Device dev = call_device<B>(k_cache, "k_cache");
  same_device(dev, {{&k_cache, "k_cache"}, {&group_blocks, "group_blocks"}, {&slots, "slots"}});
  same_device(dev, supers, "supers");
  typename B::Guard guard(dev);
  const locks::KvCacheView cache = cache_view(k_cache, nullptr);
  const locks::SuperView s = super_view(supers, cache.layout);
  require(slots, "slots", at::kInt, 1);
  require(group_blocks, "group_blocks", at::kInt, 2);
  TORCH_CHECK_VALUE(
      group_blocks.size(0) == slots.size(0) && group_blocks.size(1) == s.layout.group_pages,
      "group_blocks: expected [", slots.size(0), " (slots), ", s.layout.group_pages,
      " (group_pages)], got ", group_blocks.sizes());
  if (slots.numel() == 0) return;
  translate_errors([&] {
    B::super_build(cache, group_blocks.data_ptr<int32_t>(), slots.data_ptr<int32_t>(),
                   slots.numel(), s, B::stream(dev));
  });
}

template <class B>
void super_update(const at::Tensor& k_cache, const at::Tensor& block_table,
                  const at::Tensor& seq_lens, const at::Tensor& super_table,
                  at::TensorList supers) {
  const at::Device dev = call_device<B>(k_cache, "k_cache");
  same_device(dev, {{&k_cache, "k_cache"},
                    {&block_table, "block_table"},
                    {&seq_lens, "seq_lens"},
                    {&super_table, "super_table"}});
  same_device(dev, supers, "supers");
  typename B::Guard guard(dev);
  const locks::KvCacheView cache = cache_view(k_cache, nullptr);
  const locks::SuperView s = super_view(supers, cache.layout);
  const locks::BatchView batch = batch_view(block_table, seq_lens);
  const locks::SuperTableView table = super_table_view(super_table);
  TORCH_CHECK_VALUE(super_table.size(0) == batch.batch_size, "super_table: ", super_table.size(0),
                    " rows for a batch of ", batch.batch_size);
  translate_errors([&] { B::super_build_filled(cache, batch, 1, table, s, B::stream(dev)); });
}

template <class B>
void decode_two_level(const at::Tensor& workspace, at::IntArrayRef plan_ints, const at::Tensor& q,
                      const at::Tensor& k_cache, const at::Tensor& v_cache,
                      at::TensorList summaries, at::TensorList supers,
                      const at::Tensor& super_table, const at::Tensor& block_table,
                      const at::Tensor& seq_lens, const at::Tensor& out, const at::Tensor& lse,
                      const std::optional<at::Tensor>& pages,
                      const std::optional<at::Tensor>& counts) {
  const at::Device dev = call_device<B>(q, "q");
  const at::Tensor none;
  same_device(dev, {{&workspace, "workspace"},
                    {&q, "q"},
                    {&k_cache, "k_cache"},
                    {&v_cache, "v_cache"},
                    {&super_table, "super_table"},
                    {&block_table, "block_table"},
                    {&seq_lens, "seq_lens"},
                    {&out, "out"},
                    {&lse, "lse"},
                    {pages ? &*pages : &none, "pages"},
                    {counts ? &*counts : &none, "counts"}});
  same_device(dev, summaries, "summaries");
  same_device(dev, supers, "supers");
  TORCH_CHECK_VALUE(pages.has_value() == counts.has_value(),
                    "pages and counts: give both (the selection written out) or neither");
  typename B::Guard guard(dev);
  const locks::DecodePlan plan = plan_of(plan_ints, B::kBackend);
  TORCH_CHECK_VALUE(plan.params.two_level,
                    "plan: not a two-level plan (make it with group_pages > 0)");
  const locks::Workspace ws = workspace_view(workspace, plan);
  const locks::KvCacheView cache = cache_view(k_cache, &v_cache);
  const locks::SummaryView s = summary_view(summaries, &cache.layout);
  const locks::SuperView sv = super_view(supers, cache.layout);
  const locks::SuperTableView table = super_table_view(super_table);
  const locks::BatchView batch = batch_view(block_table, seq_lens);
  TORCH_CHECK_VALUE(super_table.size(0) == batch.batch_size, "super_table: ", super_table.size(0),
                    " rows for a batch of ", batch.batch_size);
  const locks::QueryView qv = query_view(q, batch.batch_size, cache.layout.head_dim);
  const locks::AttentionOutput o =
      output_view(out, lse, qv, batch.batch_size, cache.layout.head_dim);
  std::optional<locks::Selection> sel;
  if (pages) sel = selection_view(*pages, *counts, batch.batch_size, cache.layout.num_kv_heads);
  translate_errors([&] {
    B::decode_two_level(plan, ws, cache, s, sv, table, batch, qv, o, sel ? &*sel : nullptr,
                        B::stream(dev));
  });
}

template <class B>
void register_two_level_ops(torch::Library& m) {
  m.impl("super_build", &super_build<B>);
  m.impl("super_update", &super_update<B>);
  m.impl("decode_two_level", &decode_two_level<B>);
}

}  // namespace locks_torch

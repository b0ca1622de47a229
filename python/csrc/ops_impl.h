// The tensor ops of ops_schema.cpp, written once for both backends: B (ops_cpu.cpp,
// ops_cuda.cpp) supplies the device type, a device guard, the stream and the contract's
// functions (include/locks/contract.h). Each op checks its tensors (torch_views.h), builds
// the views and makes one or a few contract calls; nothing is kept between calls.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "locks/contract.h"
#include "torch_views.h"

namespace locks_torch {

template <class B>
at::Device call_device(const at::Tensor& first, const char* name) {
  TORCH_CHECK_VALUE(first.defined(), name, ": tensor is undefined");
  TORCH_CHECK_VALUE(!first.is_meta(), name,
                    ": is on the meta device (no data); pass real tensors (tracing uses the "
                    "fake implementations)");
  TORCH_CHECK_VALUE(first.device().type() == B::kDevice, name, ": is on ", first.device(),
                    " but another argument is on ", at::Device(B::kDevice), " (mixed devices)");
  return first.device();
}

// A region of the plan inside the caller's workspace.
template <typename T>
T* region(const locks::Workspace& ws, const locks::WorkspaceRegion& r, const char* what) {
  TORCH_CHECK(r.bytes > 0 && static_cast<size_t>(r.offset + r.bytes) <= ws.bytes,
              "plan: no workspace region for ", what);
  return reinterpret_cast<T*>(static_cast<char*>(ws.data) + r.offset);
}

template <class B>
void summary_build(const at::Tensor& k_cache, const at::Tensor& block_ids,
                   at::TensorList summaries) {
  const at::Device dev = call_device<B>(k_cache, "k_cache");
  same_device(dev, {{&k_cache, "k_cache"}, {&block_ids, "block_ids"}});
  same_device(dev, summaries, "summaries");
  typename B::Guard guard(dev);
  const locks::KvCacheView cache = cache_view(k_cache, nullptr);
  require(block_ids, "block_ids", at::kInt, 1);
  const locks::SummaryView s = summary_view(summaries, &cache.layout);
  if (block_ids.numel() == 0) return;
  translate_errors([&] {
    B::summary_build(cache, block_ids.data_ptr<int32_t>(), block_ids.numel(), s, B::stream(dev));
  });
}

template <class B>
void summary_update(const at::Tensor& k_cache, const at::Tensor& block_table,
                    const at::Tensor& seq_lens, const std::optional<at::Tensor>& slot_mapping,
                    at::TensorList summaries) {
  const at::Device dev = call_device<B>(k_cache, "k_cache");
  const at::Tensor none;
  same_device(dev, {{&k_cache, "k_cache"},
                    {&block_table, "block_table"},
                    {&seq_lens, "seq_lens"},
                    {slot_mapping ? &*slot_mapping : &none, "slot_mapping"}});
  same_device(dev, summaries, "summaries");
  typename B::Guard guard(dev);
  const locks::KvCacheView cache = cache_view(k_cache, nullptr);
  const locks::BatchView batch = batch_view(block_table, seq_lens);
  const locks::SummaryView s = summary_view(summaries, &cache.layout);
  if (slot_mapping) {
    require(*slot_mapping, "slot_mapping", at::kInt, 1);
    if (slot_mapping->numel() == 0) return;
    translate_errors([&] {
      B::summary_build_slots(cache, slot_mapping->data_ptr<int32_t>(), slot_mapping->numel(), s,
                             B::stream(dev));
    });
    return;
  }
  translate_errors([&] { B::summary_build_filled(cache, batch, 1, s, B::stream(dev)); });
}

// The cache write of a step with the summary update of the blocks it completes (cache_write.h):
// summaries empty = the write alone.
template <class B>
void cache_write(const at::Tensor& key, const at::Tensor& value, const at::Tensor& k_cache,
                 const at::Tensor& v_cache, const at::Tensor& slot_mapping,
                 at::TensorList summaries) {
  const at::Device dev = call_device<B>(k_cache, "k_cache");
  same_device(dev, {{&key, "key"},
                    {&value, "value"},
                    {&k_cache, "k_cache"},
                    {&v_cache, "v_cache"},
                    {&slot_mapping, "slot_mapping"}});
  same_device(dev, summaries, "summaries");
  typename B::Guard guard(dev);
  const locks::KvCacheView c = cache_view(k_cache, &v_cache);
  require(slot_mapping, "slot_mapping", at::kInt, 1);
  const locks::TokenRows rows = token_rows(key, value, c.layout, slot_mapping.numel());
  std::optional<locks::SummaryView> s;
  if (!summaries.empty()) s = summary_view(summaries, &c.layout);
  const locks::KvCacheWriteView w{k_cache.data_ptr(), v_cache.data_ptr(), c.layout, c.block_stride};
  translate_errors([&] {
    B::cache_write_slots(w, rows, slot_mapping.data_ptr<int32_t>(), s ? &*s : nullptr,
                         B::stream(dev));
  });
}

// The views of a selection op (select_pages, select_pages_bucketed), its tensors checked.
struct SelectViews {
  locks::SummaryView s;
  locks::BatchView batch;
  locks::QueryView q;
  locks::Selection sel;
};
template <class B>
at::Device select_device(const at::Tensor& workspace, const at::Tensor& q, at::TensorList summaries,
                         const at::Tensor& block_table, const at::Tensor& seq_lens,
                         const at::Tensor& pages, const at::Tensor& counts) {
  const at::Device dev = call_device<B>(q, "q");
  same_device(dev, {{&workspace, "workspace"},
                    {&q, "q"},
                    {&block_table, "block_table"},
                    {&seq_lens, "seq_lens"},
                    {&pages, "pages"},
                    {&counts, "counts"}});
  same_device(dev, summaries, "summaries");
  return dev;
}
inline SelectViews select_views(const at::Tensor& q, at::TensorList summaries,
                                const at::Tensor& block_table, const at::Tensor& seq_lens,
                                const at::Tensor& pages, const at::Tensor& counts) {
  SelectViews v;
  v.s = summary_view(summaries, nullptr);
  v.batch = batch_view(block_table, seq_lens);
  v.q = query_view(q, v.batch.batch_size, v.s.layout.head_dim);
  v.sel = selection_view(pages, counts, v.batch.batch_size, v.s.layout.num_kv_heads);
  return v;
}

template <class B>
void select_pages(const at::Tensor& workspace, at::IntArrayRef plan_ints, const at::Tensor& q,
                  at::TensorList summaries, const at::Tensor& block_table,
                  const at::Tensor& seq_lens, const at::Tensor& pages, const at::Tensor& counts) {
  const at::Device dev =
      select_device<B>(workspace, q, summaries, block_table, seq_lens, pages, counts);
  typename B::Guard guard(dev);
  const locks::DecodePlan plan = plan_of(plan_ints, B::kBackend);
  const locks::Workspace ws = workspace_view(workspace, plan);
  const SelectViews v = select_views(q, summaries, block_table, seq_lens, pages, counts);
  // The scores live in the plan's workspace regions (contract.h, score_select).
  translate_errors([&] { B::score_select(plan, ws, v.s, v.batch, v.q, v.sel, B::stream(dev)); });
}

// select_pages over length buckets: plans = length_buckets' vectors, concatenated (B decides
// what runs: the CUDA backend records the bucket choice under capture, the CPU runs the last).
template <class B>
void select_pages_bucketed(const at::Tensor& workspace, at::IntArrayRef plans_ints,
                           const at::Tensor& q, at::TensorList summaries,
                           const at::Tensor& block_table, const at::Tensor& seq_lens,
                           const at::Tensor& pages, const at::Tensor& counts) {
  const at::Device dev =
      select_device<B>(workspace, q, summaries, block_table, seq_lens, pages, counts);
  typename B::Guard guard(dev);
  constexpr size_t k = locks::DecodePlan::kNumInts;
  TORCH_CHECK_VALUE(!plans_ints.empty() && plans_ints.size() % k == 0, "plans: ", plans_ints.size(),
                    " ints, not a whole number of ", k, "-int plan vectors");
  std::vector<locks::DecodePlan> plans;
  for (size_t i = 0; i < plans_ints.size(); i += k)
    plans.push_back(plan_of(plans_ints.slice(i, k), B::kBackend));
  const locks::DecodePlan* largest = &plans[0];
  for (const locks::DecodePlan& p : plans)
    if (p.workspace_bytes > largest->workspace_bytes) largest = &p;
  const locks::Workspace ws = workspace_view(workspace, *largest);
  const SelectViews v = select_views(q, summaries, block_table, seq_lens, pages, counts);
  translate_errors(
      [&] { B::score_select_bucketed(plans, ws, v.s, v.batch, v.q, v.sel, B::stream(dev)); });
}

// A request's selection as each of its token rows' (request_rows.h): views, then one call.
template <class B>
void request_rows(const at::Tensor& req_pages, const at::Tensor& req_counts,
                  const at::Tensor& req_seq_lens, const at::Tensor& seq_lens,
                  int64_t tokens_per_request, int64_t page_size, const at::Tensor& pages,
                  const at::Tensor& counts) {
  const at::Device dev = call_device<B>(req_pages, "req_pages");
  same_device(dev, {{&req_pages, "req_pages"},
                    {&req_counts, "req_counts"},
                    {&req_seq_lens, "req_seq_lens"},
                    {&seq_lens, "seq_lens"},
                    {&pages, "pages"},
                    {&counts, "counts"}});
  typename B::Guard guard(dev);
  require(req_seq_lens, "req_seq_lens", at::kInt, 1);
  require(seq_lens, "seq_lens", at::kInt, 1);
  require(req_pages, "req_pages", at::kInt, 3);
  const int S = to_int(req_seq_lens.size(0), "req_seq_lens.size(0) (requests)");
  const int T = to_int(tokens_per_request, "tokens_per_request");
  const int H = to_int(req_pages.size(1), "req_pages.size(1) (num_kv_heads)");
  TORCH_CHECK_VALUE(T >= 1 && seq_lens.size(0) == int64_t(S) * T, "seq_lens: ", seq_lens.size(0),
                    " rows, expected ", S, " requests x ", tokens_per_request, " tokens");
  const locks::Selection req = selection_view(req_pages, req_counts, S, H);
  const locks::Selection out = selection_view(pages, counts, int(seq_lens.size(0)), H);
  const locks::RequestRows rows{req_seq_lens.data_ptr<int32_t>(), seq_lens.data_ptr<int32_t>(), S,
                                T};
  translate_errors(
      [&] { B::request_rows(rows, req, H, to_int(page_size, "page_size"), out, B::stream(dev)); });
}

template <class B>
void decode_attention(const at::Tensor& workspace, at::IntArrayRef plan_ints, const at::Tensor& q,
                      const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& block_table, const at::Tensor& seq_lens,
                      const std::optional<at::Tensor>& pages,
                      const std::optional<at::Tensor>& counts, const at::Tensor& out,
                      const at::Tensor& lse) {
  const at::Device dev = call_device<B>(q, "q");
  const at::Tensor none;
  same_device(dev, {{&workspace, "workspace"},
                    {&q, "q"},
                    {&k_cache, "k_cache"},
                    {&v_cache, "v_cache"},
                    {&block_table, "block_table"},
                    {&seq_lens, "seq_lens"},
                    {pages ? &*pages : &none, "pages"},
                    {counts ? &*counts : &none, "counts"},
                    {&out, "out"},
                    {&lse, "lse"}});
  TORCH_CHECK_VALUE(pages.has_value() == counts.has_value(),
                    "pages and counts: give both (sparse) or neither (dense)");
  typename B::Guard guard(dev);
  const locks::DecodePlan plan = plan_of(plan_ints, B::kBackend);
  const locks::Workspace ws = workspace_view(workspace, plan);
  const locks::KvCacheView cache = cache_view(k_cache, &v_cache);
  const locks::CacheLayout& layout = cache.layout;
  const locks::BatchView batch = batch_view(block_table, seq_lens);
  const locks::QueryView qv = query_view(q, batch.batch_size, layout.head_dim);
  const locks::AttentionOutput o = output_view(out, lse, qv, batch.batch_size, layout.head_dim);
  if (!pages) {
    translate_errors(
        [&] { B::decode_attention_dense(plan, ws, cache, batch, qv, o, B::stream(dev)); });
    return;
  }
  const locks::Selection sel =
      selection_view(*pages, *counts, batch.batch_size, layout.num_kv_heads);
  translate_errors(
      [&] { B::decode_attention_sparse(plan, ws, cache, batch, qv, sel, o, B::stream(dev)); });
}

// The tensor ops of backend B, for TORCH_LIBRARY_IMPL.
template <class B>
void register_ops(torch::Library& m) {
  m.impl("summary_build", &summary_build<B>);
  m.impl("summary_update", &summary_update<B>);
  m.impl("cache_write", &cache_write<B>);
  m.impl("select_pages", &select_pages<B>);
  m.impl("select_pages_bucketed", &select_pages_bucketed<B>);
  m.impl("request_rows", &request_rows<B>);
  m.impl("decode_attention", &decode_attention<B>);
}

}  // namespace locks_torch

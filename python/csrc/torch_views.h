// Torch tensors -> locks views (include/locks/*.h): the checks a torch caller needs at the
// boundary (one device for every tensor, never meta; dtype, contiguity, shapes; int64
// arguments that fit an int), done once here for every op and both backends. The core
// re-checks values (lengths, block ids, finite inputs) and throws locks::Error, which
// translate_errors maps to ValueError / NotImplementedError / RuntimeError.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "locks/attention.h"
#include "locks/cache_write.h"
#include "locks/error.h"
#include "locks/kv_cache.h"
#include "locks/plan.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks_torch {

// Checked int64 -> int (torch carries every int as int64; silent narrowing turned
// budget 2^32 + 16 into 16).
inline int to_int(int64_t v, const char* name, int64_t lo = std::numeric_limits<int>::min()) {
  TORCH_CHECK_VALUE(v >= lo && v <= std::numeric_limits<int>::max(), name, " = ", v,
                    " is out of range [", lo, ", ", std::numeric_limits<int>::max(), "]");
  return static_cast<int>(v);
}

// Every tensor of a call on `device` (the one the dispatcher chose), none on meta: a meta
// tensor has no data, and a mixed call would hand device pointers to host code or back.
struct Named {
  const at::Tensor* t;
  const char* name;
};
inline void same_device(const at::Device& device, std::initializer_list<Named> ts) {
  for (const Named& n : ts) {
    if (!n.t->defined()) continue;
    TORCH_CHECK_VALUE(!n.t->is_meta(), n.name,
                      ": is on the meta device (no data); pass real tensors (tracing uses the "
                      "fake implementations)");
    TORCH_CHECK_VALUE(n.t->device() == device, n.name, ": is on ", n.t->device(),
                      " but the call runs on ", device, " (mixed devices)");
  }
}
inline void same_device(const at::Device& device, at::TensorList ts, const char* name) {
  for (const at::Tensor& t : ts) same_device(device, {{&t, name}});
}

inline locks::DType to_dtype(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat:
      return locks::DType::f32;
    case at::kHalf:
      return locks::DType::f16;
    case at::kBFloat16:
      return locks::DType::bf16;
    default:
      TORCH_CHECK_VALUE(false, name, ": dtype must be float32, float16 or bfloat16, got ", t);
  }
}

inline void require(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim) {
  TORCH_CHECK_VALUE(t.defined(), name, ": tensor is undefined");
  TORCH_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, ": expected dtype ", dtype, ", got ",
                    t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous");
}

// k_cache / v_cache: [num_blocks, page_size, num_kv_heads, head_dim], each block's
// [page_size, num_kv_heads, head_dim] contiguous, blocks stride(0) >= page_size * num_kv_heads
// * head_dim elements apart (dense, or e.g. K = kv[:, 0] of a [N, 2, P, H, d] cache: vLLM's V1
// model runner); v (when given) with k's shape, dtype and block stride. The core checks the
// rest (validate_cache: layout, K/V disjoint; CUDA: 16-byte aligned blocks).
inline void require_blocks(const at::Tensor& t, const char* name) {
  int64_t want = 1;  // the inner three dims contiguous (a size-1 dim's stride is free)
  for (int i = 3; i >= 1; --i) {
    TORCH_CHECK_VALUE(t.size(i) == 1 || t.stride(i) == want, name,
                      ": each block [page_size, num_kv_heads, head_dim] must be contiguous "
                      "(strides ",
                      t.strides(), " for shape ", t.sizes(),
                      "); only the block dimension 0 may "
                      "be strided");
    want *= t.size(i);
  }
  TORCH_CHECK_VALUE(t.size(0) <= 1 || t.stride(0) >= want, name, ": block stride ", t.stride(0),
                    " (stride of dim 0) is below one block's ", want,
                    " elements (page_size * num_kv_heads * head_dim): blocks would overlap");
}
inline locks::KvCacheView cache_view(const at::Tensor& k, const at::Tensor* v) {
  TORCH_CHECK_VALUE(k.dim() == 4,
                    "k_cache: expected [num_blocks, page_size, num_kv_heads, head_dim], got ",
                    k.sizes());
  require_blocks(k, "k_cache");
  locks::KvCacheView c;
  locks::CacheLayout& l = c.layout;
  l.num_blocks = k.size(0);
  l.page_size = to_int(k.size(1), "k_cache.size(1) (page_size)");
  l.num_kv_heads = to_int(k.size(2), "k_cache.size(2) (num_kv_heads)");
  l.head_dim = to_int(k.size(3), "k_cache.size(3) (head_dim)");
  l.dtype = to_dtype(k.scalar_type(), "k_cache");
  c.block_stride = k.size(0) > 1 ? k.stride(0) : 0;
  c.k = k.data_ptr();
  if (v) {
    TORCH_CHECK_VALUE(v->sizes() == k.sizes(), "v_cache: shape ", v->sizes(),
                      " differs from k_cache ", k.sizes());
    TORCH_CHECK_VALUE(v->scalar_type() == k.scalar_type(), "v_cache: dtype ", v->scalar_type(),
                      " differs from k_cache ", k.scalar_type());
    require_blocks(*v, "v_cache");
    TORCH_CHECK_VALUE(v->size(0) <= 1 || v->stride(0) == k.stride(0), "v_cache: block stride ",
                      v->stride(0), " differs from k_cache's ", k.stride(0),
                      " (K and V share one block stride)");
    c.v = v->data_ptr();
  }
  return c;
}

// key / value [n, num_kv_heads, head_dim] in the cache's dtype with the head dim contiguous
// (views into a fused QKV projection are fine): the rows of a cache write (cache_write.h).
inline locks::TokenRows token_rows(const at::Tensor& key, const at::Tensor& value,
                                   const locks::CacheLayout& l, int64_t n) {
  const at::ScalarType want = key.scalar_type();
  for (const auto& [t, name] :
       {std::pair<const at::Tensor*, const char*>{&key, "key"}, {&value, "value"}}) {
    TORCH_CHECK_VALUE(t->dim() == 3 && t->size(0) == n && t->size(1) == l.num_kv_heads &&
                          t->size(2) == l.head_dim,
                      name, ": expected [", n, ", ", l.num_kv_heads, ", ", l.head_dim,
                      "] (slot_mapping's tokens, the cache's KV heads and head_dim), got ",
                      t->sizes());
    TORCH_CHECK_VALUE(to_dtype(t->scalar_type(), name) == l.dtype && t->scalar_type() == want, name,
                      ": dtype ", t->scalar_type(), " differs from the cache's");
    TORCH_CHECK_VALUE(t->stride(2) == 1, name,
                      ": the head dim must be contiguous (stride 1), got stride ", t->stride(2));
  }
  locks::TokenRows r;
  r.n_tokens = n;
  r.k = key.data_ptr();
  r.v = value.data_ptr();
  r.k_token_stride = key.stride(0), r.k_head_stride = key.stride(1);
  r.v_token_stride = value.stride(0), r.v_head_stride = value.stride(1);
  return r;
}

// block_table [batch, max_blocks_per_seq] int32, seq_lens [batch] int32.
inline locks::BatchView batch_view(const at::Tensor& block_table, const at::Tensor& seq_lens) {
  require(block_table, "block_table", at::kInt, 2);
  require(seq_lens, "seq_lens", at::kInt, 1);
  TORCH_CHECK_VALUE(seq_lens.size(0) == block_table.size(0), "seq_lens: length ", seq_lens.size(0),
                    " differs from block_table rows ", block_table.size(0));
  TORCH_CHECK_VALUE(block_table.size(0) >= 1, "block_table: batch size 0 (nothing to decode)");
  locks::BatchView b;
  b.block_table = block_table.data_ptr<int32_t>();
  b.block_table_stride = block_table.size(1);
  b.seq_lens = seq_lens.data_ptr<int32_t>();
  b.batch_size = to_int(block_table.size(0), "block_table.size(0) (batch)");
  b.max_blocks_per_seq = to_int(block_table.size(1), "block_table.size(1) (max_blocks_per_seq)");
  return b;
}

// The summaries list; its precision is read from the dtypes (summary.h layouts):
//   fp32: [mu f32 [N, H, d], basis f32 [N, H, r, d], coeff f32 [N, H, P, r]]
//   int4: [mu_q i8 [N, H, d], mu_scale f32 [N, H], basis_q u8 [N, H, r, d/2],
//          basis_scale f32 [N, H, r, d/g], coeff_q i8 [N, H, P, r], coeff_scale f32 [N, H, r]]
//   (g = basis_group, dims per int4 basis scale, read from basis_scale's last dim; fp32
//   summaries carry the default, locks::default_basis_group, like the plan's layout)
// Either list may end with the query weights qweight f32 [H, d] of query-weighted summaries
// (summary.h): 4 or 7 tensors.
// The geometry must match `cache` where one is given (num_blocks, P, H, d); scoring reads
// summaries only and takes it from them.
inline locks::SummaryView summary_view(at::TensorList all, const locks::CacheLayout* cache) {
  const bool weighted = all.size() == 4 || all.size() == 7;
  const at::TensorList s = weighted ? all.slice(0, all.size() - 1) : all;
  const bool quant = s.size() == 6;
  TORCH_CHECK_VALUE(s.size() == 3 || quant,
                    "summaries: expected 3 tensors (fp32: mu, basis, coeff) or 6 (int4: mu_q, "
                    "mu_scale, basis_q, basis_scale, coeff_q, coeff_scale), each optionally "
                    "followed by the query weights [num_kv_heads, head_dim]; got ",
                    all.size());
  static const char* const kFp32[] = {"summaries[0] (mu)", "summaries[1] (basis)",
                                      "summaries[2] (coeff)"};
  static const char* const kQuant[] = {"summaries[0] (mu_q)",    "summaries[1] (mu_scale)",
                                       "summaries[2] (basis_q)", "summaries[3] (basis_scale)",
                                       "summaries[4] (coeff_q)", "summaries[5] (coeff_scale)"};
  const at::Tensor& mu = s[0];
  const at::Tensor& basis = s[quant ? 2 : 1];
  const at::Tensor& coeff = s[quant ? 4 : 2];
  const char* const* names = quant ? kQuant : kFp32;
  require(mu, names[0], quant ? at::kChar : at::kFloat, 3);
  require(basis, names[quant ? 2 : 1], quant ? at::kByte : at::kFloat, 4);
  require(coeff, names[quant ? 4 : 2], quant ? at::kChar : at::kFloat, 4);
  locks::SummaryLayout l;
  l.num_blocks = mu.size(0);
  l.num_kv_heads = to_int(mu.size(1), "summaries: num_kv_heads");
  l.head_dim = to_int(mu.size(2), "summaries: head_dim");
  l.rank = to_int(basis.size(2), "summaries: rank");
  l.page_size = to_int(coeff.size(2), "summaries: page_size");
  l.precision = quant ? locks::Precision::quant : locks::Precision::fp32;
  l.basis_group = locks::default_basis_group(l.head_dim);
  if (quant) {
    require(s[3], names[3], at::kFloat, 4);
    const int64_t groups = s[3].size(3);
    TORCH_CHECK_VALUE(groups >= 1 && l.head_dim % groups == 0 && (l.head_dim / groups) % 2 == 0,
                      names[3], ": the last dim (", groups,
                      " scales a basis row) must split head_dim ", l.head_dim,
                      " into groups of an even number of dims (basis_scale [N, H, r, d / "
                      "basis_group])");
    l.basis_group = to_int(l.head_dim / groups, "summaries: basis_group");
  }
  if (cache) {
    TORCH_CHECK_VALUE(l.num_blocks == cache->num_blocks && l.num_kv_heads == cache->num_kv_heads &&
                          l.head_dim == cache->head_dim && l.page_size == cache->page_size,
                      "summaries: ", names[0], " ", mu.sizes(), " / ", names[quant ? 4 : 2], " ",
                      coeff.sizes(), " do not match the cache (num_blocks ", cache->num_blocks,
                      ", page_size ", cache->page_size, ", num_kv_heads ", cache->num_kv_heads,
                      ", head_dim ", cache->head_dim, ")");
  }
  const int64_t n = l.num_blocks, h = l.num_kv_heads, d = l.head_dim, r = l.rank, p = l.page_size;
  auto shape = [&](const at::Tensor& t, const char* name, std::initializer_list<int64_t> want) {
    TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(want), name, ": expected shape ",
                      at::IntArrayRef(want), ", got ", t.sizes());
  };
  shape(basis, names[quant ? 2 : 1], {n, h, r, quant ? d / 2 : d});
  shape(coeff, names[quant ? 4 : 2], {n, h, p, r});
  locks::SummaryView v;
  v.layout = l;
  if (weighted) {
    const at::Tensor& w = all.back();
    require(w, "summaries[-1] (qweight)", at::kFloat, 2);
    shape(w, "summaries[-1] (qweight)", {h, d});
    v.qweight = w.data_ptr<float>();
    // Values are checked by the CPU library on every call (locks::validate_qweight); device
    // weights where they are made (the drop-in calibrates them on the host).
  }
  if (!quant) {
    v.mu = mu.data_ptr<float>();
    v.basis = basis.data_ptr<float>();
    v.coeff = coeff.data_ptr<float>();
    return v;
  }
  require(s[1], names[1], at::kFloat, 2);
  require(s[5], names[5], at::kFloat, 3);
  shape(s[1], names[1], {n, h});
  shape(s[3], names[3], {n, h, r, d / l.basis_group});
  shape(s[5], names[5], {n, h, r});
  v.mu_q = mu.data_ptr<int8_t>();
  v.mu_scale = s[1].data_ptr<float>();
  v.basis_q = basis.data_ptr<uint8_t>();
  v.basis_scale = s[3].data_ptr<float>();
  v.coeff_q = coeff.data_ptr<int8_t>();
  v.coeff_scale = s[5].data_ptr<float>();
  return v;
}

// q: [batch, num_q_heads, head_dim], float32 or the model's float16 / bfloat16 (read as
// float by the ops: no conversion copy); each sequence's [num_q_heads, head_dim] contiguous,
// sequences any stride(0) >= num_q_heads * head_dim apart (a view of a fused QKV output).
inline locks::QueryView query_view(const at::Tensor& q, int batch, int head_dim) {
  TORCH_CHECK_VALUE(q.defined(), "q: tensor is undefined");
  const locks::DType t = to_dtype(q.scalar_type(), "q");
  TORCH_CHECK_VALUE(q.dim() == 3, "q: expected 3 dimensions, got shape ", q.sizes());
  TORCH_CHECK_VALUE(q.size(0) == batch && q.size(2) == head_dim, "q: expected [", batch,
                    ", num_q_heads, ", head_dim, "], got ", q.sizes());
  const int hq = to_int(q.size(1), "q.size(1) (num_q_heads)");
  const int64_t row = int64_t(hq) * head_dim;
  // A one-sequence batch has no stride to speak of (torch may report any value).
  const int64_t stride = batch <= 1 ? row : q.stride(0);
  TORCH_CHECK_VALUE(
      (q.stride(2) == 1 || head_dim == 1) && (q.stride(1) == head_dim || hq == 1) && stride >= row,
      "q: each sequence's [num_q_heads, head_dim] must be contiguous and rows at "
      "least num_q_heads * head_dim apart, got strides ",
      q.strides());
  return {q.data_ptr(), hq, t, stride};
}

// pages [batch, num_kv_heads, capacity] int32, counts [batch, num_kv_heads] int32.
inline locks::Selection selection_view(const at::Tensor& pages, const at::Tensor& counts, int batch,
                                       int num_kv_heads) {
  require(pages, "pages", at::kInt, 3);
  require(counts, "counts", at::kInt, 2);
  TORCH_CHECK_VALUE(pages.size(0) == batch && pages.size(1) == num_kv_heads, "pages: expected [",
                    batch, ", ", num_kv_heads, ", capacity], got ", pages.sizes());
  TORCH_CHECK_VALUE(counts.size(0) == batch && counts.size(1) == num_kv_heads, "counts: expected [",
                    batch, ", ", num_kv_heads, "], got ", counts.sizes());
  return {pages.data_ptr<int32_t>(), counts.data_ptr<int32_t>(),
          to_int(pages.size(2), "pages.size(2) (capacity)")};
}

// out [batch, q_heads, d], float32 or float16 / bfloat16 (each value rounded once from the
// fp32 result), and lse [batch, q_heads] float32.
inline locks::AttentionOutput output_view(const at::Tensor& out, const at::Tensor& lse,
                                          const locks::QueryView& q, int batch, int head_dim) {
  TORCH_CHECK_VALUE(out.defined(), "out: tensor is undefined");
  const locks::DType t = to_dtype(out.scalar_type(), "out");
  require(out, "out", out.scalar_type(), 3);
  require(lse, "lse", at::kFloat, 2);
  TORCH_CHECK_VALUE(out.size(0) == batch && out.size(1) == q.num_q_heads && out.size(2) == head_dim,
                    "out: expected [", batch, ", ", q.num_q_heads, ", ", head_dim, "], got ",
                    out.sizes());
  TORCH_CHECK_VALUE(lse.size(0) == batch && lse.size(1) == q.num_q_heads, "lse: expected [", batch,
                    ", ", q.num_q_heads, "], got ", lse.sizes());
  return {out.data_ptr(), lse.data_ptr<float>(), t};
}

// The plan vector (locks::DecodePlan::to_ints), checked by from_ints.
template <typename F>
void translate_errors(F&& f);
inline locks::DecodePlan plan_of(at::IntArrayRef v, locks::Backend backend) {
  locks::DecodePlan p;
  translate_errors([&] { p = locks::DecodePlan::from_ints(v.data(), v.size()); });
  TORCH_CHECK_VALUE(p.backend == backend, "plan: made for the ", locks::backend_name(p.backend),
                    " backend, but the tensors are on the ", locks::backend_name(backend),
                    " backend");
  return p;
}

// The caller's workspace: a 1-D uint8 tensor of at least workspace_bytes(plan) bytes. The
// contract wants 256-byte alignment; torch's CPU allocator gives 64, so the view starts at
// the first 256-byte boundary inside the tensor (locks.workspace_bytes adds 256 for that).
// The same tensor gives the same view every call, so regions persist between calls.
inline locks::Workspace workspace_view(const at::Tensor& ws, const locks::DecodePlan& plan) {
  require(ws, "workspace", at::kByte, 1);
  const auto base = reinterpret_cast<uintptr_t>(ws.data_ptr());
  const uintptr_t skip = (256 - base % 256) % 256;
  const auto have = static_cast<uint64_t>(ws.numel());
  TORCH_CHECK_VALUE(have >= skip && have - skip >= plan.workspace_bytes, "workspace: ", ws.numel(),
                    " bytes, the plan needs ", plan.workspace_bytes, " after ", skip,
                    " bytes of alignment (allocate locks.workspace_bytes(...) bytes)");
  return {reinterpret_cast<void*>(base + skip), static_cast<size_t>(have - skip)};
}

// Run f, mapping the core's errors to Python's: InvalidArgument -> ValueError, Unsupported ->
// NotImplementedError, CudaError (and any other locks::Error) -> RuntimeError.
template <typename F>
void translate_errors(F&& f) {
  try {
    f();
  } catch (const locks::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const locks::Unsupported& e) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, e.what());
  } catch (const locks::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace locks_torch

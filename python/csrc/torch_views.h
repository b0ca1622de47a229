// Torch tensors -> locks views (include/locks/*.h), with the checks a torch caller needs
// (device, dtype, contiguity, shapes). The core re-checks values (lengths, block ids,
// finite queries) and throws locks::Error; ops translate that into a Python ValueError.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "locks/error.h"
#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"

namespace locks_torch {

inline locks::DType to_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return locks::DType::f32;
    case at::kHalf:
      return locks::DType::f16;
    case at::kBFloat16:
      return locks::DType::bf16;
    default:
      TORCH_CHECK_VALUE(false, name, ": dtype must be float32, float16 or bfloat16, got ",
                        t.scalar_type());
  }
}

inline void require(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dim,
                    const at::Device& device) {
  TORCH_CHECK_VALUE(t.defined(), name, ": tensor is undefined");
  TORCH_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.scalar_type() == dtype, name, ": expected dtype ", dtype, ", got ",
                    t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == device, name, ": expected device ", device, ", got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous");
}

// k_cache / v_cache: [num_blocks, page_size, num_kv_heads, head_dim].
inline locks::CacheLayout cache_layout(const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK_VALUE(k.dim() == 4,
                    "k_cache: expected [num_blocks, page_size, num_kv_heads, head_dim], got ",
                    k.sizes());
  TORCH_CHECK_VALUE(k.is_contiguous(), "k_cache: must be contiguous");
  locks::CacheLayout l;
  l.num_blocks = k.size(0);
  l.page_size = static_cast<int>(k.size(1));
  l.num_kv_heads = static_cast<int>(k.size(2));
  l.head_dim = static_cast<int>(k.size(3));
  l.dtype = to_dtype(k, "k_cache");
  if (v.defined()) {
    TORCH_CHECK_VALUE(v.sizes() == k.sizes(), "v_cache: shape ", v.sizes(),
                      " differs from k_cache ", k.sizes());
    TORCH_CHECK_VALUE(v.scalar_type() == k.scalar_type(), "v_cache: dtype differs from k_cache");
    TORCH_CHECK_VALUE(v.device() == k.device(), "v_cache: device differs from k_cache");
    TORCH_CHECK_VALUE(v.is_contiguous(), "v_cache: must be contiguous");
  }
  return l;
}

// block_table [batch, max_blocks_per_seq] int32, seq_lens [batch] int32.
inline locks::BatchView batch_view(const at::Tensor& block_table, const at::Tensor& seq_lens,
                                   const at::Device& device) {
  require(block_table, "block_table", at::kInt, 2, device);
  require(seq_lens, "seq_lens", at::kInt, 1, device);
  TORCH_CHECK_VALUE(seq_lens.size(0) == block_table.size(0), "seq_lens: length ", seq_lens.size(0),
                    " differs from block_table rows ", block_table.size(0));
  locks::BatchView b;
  b.block_table = block_table.data_ptr<int32_t>();
  b.block_table_stride = block_table.size(1);
  b.seq_lens = seq_lens.data_ptr<int32_t>();
  b.batch_size = static_cast<int>(block_table.size(0));
  b.max_blocks_per_seq = static_cast<int>(block_table.size(1));
  return b;
}

// fp32 summaries: mu [num_blocks, H, d], basis [num_blocks, H, r, d], coeff [num_blocks, H, P, r].
inline locks::SummaryView summary_view(const at::Tensor& mu, const at::Tensor& basis,
                                       const at::Tensor& coeff, const locks::CacheLayout& cache,
                                       const at::Device& device) {
  require(mu, "mu", at::kFloat, 3, device);
  require(basis, "basis", at::kFloat, 4, device);
  require(coeff, "coeff", at::kFloat, 4, device);
  locks::SummaryLayout s;
  s.num_blocks = mu.size(0);
  s.num_kv_heads = static_cast<int>(mu.size(1));
  s.head_dim = static_cast<int>(mu.size(2));
  s.rank = static_cast<int>(basis.size(2));
  s.page_size = static_cast<int>(coeff.size(2));
  s.precision = locks::Precision::fp32;
  TORCH_CHECK_VALUE(s.num_blocks == cache.num_blocks && s.num_kv_heads == cache.num_kv_heads &&
                        s.head_dim == cache.head_dim && s.page_size == cache.page_size,
                    "summaries: mu ", mu.sizes(), " / coeff ", coeff.sizes(),
                    " do not match the cache (num_blocks ", cache.num_blocks, ", page_size ",
                    cache.page_size, ", num_kv_heads ", cache.num_kv_heads, ", head_dim ",
                    cache.head_dim, ")");
  TORCH_CHECK_VALUE(basis.size(0) == s.num_blocks && basis.size(1) == s.num_kv_heads &&
                        basis.size(3) == s.head_dim,
                    "basis: expected [", s.num_blocks, ", ", s.num_kv_heads, ", rank, ", s.head_dim,
                    "], got ", basis.sizes());
  TORCH_CHECK_VALUE(
      coeff.size(0) == s.num_blocks && coeff.size(1) == s.num_kv_heads && coeff.size(3) == s.rank,
      "coeff: expected [", s.num_blocks, ", ", s.num_kv_heads, ", ", s.page_size, ", ", s.rank,
      "], got ", coeff.sizes());
  locks::SummaryView v;
  v.layout = s;
  v.mu = mu.data_ptr<float>();
  v.basis = basis.data_ptr<float>();
  v.coeff = coeff.data_ptr<float>();
  return v;
}

// quant summaries (int8 centroid, int4 basis two a byte, int8 coefficients, fp32 scales):
// mu_q [N, H, d] i8, mu_scale [N, H], basis_q [N, H, r, d/2] u8, basis_scale [N, H, r],
// coeff_q [N, H, P, r] i8, coeff_scale [N, H, r].
inline locks::SummaryView summary_view_quant(
    const at::Tensor& mu_q, const at::Tensor& mu_scale, const at::Tensor& basis_q,
    const at::Tensor& basis_scale, const at::Tensor& coeff_q, const at::Tensor& coeff_scale,
    const locks::CacheLayout& cache, const at::Device& device) {
  require(mu_q, "mu_q", at::kChar, 3, device);
  require(mu_scale, "mu_scale", at::kFloat, 2, device);
  require(basis_q, "basis_q", at::kByte, 4, device);
  require(basis_scale, "basis_scale", at::kFloat, 3, device);
  require(coeff_q, "coeff_q", at::kChar, 4, device);
  require(coeff_scale, "coeff_scale", at::kFloat, 3, device);
  locks::SummaryLayout s;
  s.num_blocks = mu_q.size(0);
  s.num_kv_heads = static_cast<int>(mu_q.size(1));
  s.head_dim = static_cast<int>(mu_q.size(2));
  s.rank = static_cast<int>(basis_q.size(2));
  s.page_size = static_cast<int>(coeff_q.size(2));
  s.precision = locks::Precision::quant;
  TORCH_CHECK_VALUE(s.num_blocks == cache.num_blocks && s.num_kv_heads == cache.num_kv_heads &&
                        s.head_dim == cache.head_dim && s.page_size == cache.page_size,
                    "summaries: mu_q ", mu_q.sizes(), " / coeff_q ", coeff_q.sizes(),
                    " do not match the cache (num_blocks ", cache.num_blocks, ", page_size ",
                    cache.page_size, ", num_kv_heads ", cache.num_kv_heads, ", head_dim ",
                    cache.head_dim, ")");
  const std::vector<int64_t> nh{s.num_blocks, s.num_kv_heads},
      nhr{s.num_blocks, s.num_kv_heads, s.rank};
  TORCH_CHECK_VALUE(mu_scale.sizes() == at::IntArrayRef(nh), "mu_scale: expected ",
                    at::IntArrayRef(nh), ", got ", mu_scale.sizes());
  TORCH_CHECK_VALUE(basis_q.size(0) == s.num_blocks && basis_q.size(1) == s.num_kv_heads &&
                        basis_q.size(3) == s.head_dim / 2,
                    "basis_q: expected [", s.num_blocks, ", ", s.num_kv_heads, ", rank, ",
                    s.head_dim / 2, "], got ", basis_q.sizes());
  TORCH_CHECK_VALUE(basis_scale.sizes() == at::IntArrayRef(nhr), "basis_scale: expected ",
                    at::IntArrayRef(nhr), ", got ", basis_scale.sizes());
  TORCH_CHECK_VALUE(coeff_q.size(0) == s.num_blocks && coeff_q.size(1) == s.num_kv_heads &&
                        coeff_q.size(3) == s.rank,
                    "coeff_q: expected [", s.num_blocks, ", ", s.num_kv_heads, ", ", s.page_size,
                    ", ", s.rank, "], got ", coeff_q.sizes());
  TORCH_CHECK_VALUE(coeff_scale.sizes() == at::IntArrayRef(nhr), "coeff_scale: expected ",
                    at::IntArrayRef(nhr), ", got ", coeff_scale.sizes());
  locks::SummaryView v;
  v.layout = s;
  v.mu_q = mu_q.data_ptr<int8_t>();
  v.mu_scale = mu_scale.data_ptr<float>();
  v.basis_q = basis_q.data_ptr<uint8_t>();
  v.basis_scale = basis_scale.data_ptr<float>();
  v.coeff_q = coeff_q.data_ptr<int8_t>();
  v.coeff_scale = coeff_scale.data_ptr<float>();
  return v;
}

// The cache shape that summaries describe (scoring reads summaries only, never K).
inline locks::CacheLayout layout_of_summaries(int64_t num_blocks, int64_t heads, int64_t head_dim,
                                              int64_t page_size) {
  locks::CacheLayout l;
  l.num_blocks = num_blocks;
  l.num_kv_heads = static_cast<int>(heads);
  l.head_dim = static_cast<int>(head_dim);
  l.page_size = static_cast<int>(page_size);
  return l;
}

// q: [batch, num_q_heads, head_dim] fp32.
inline locks::QueryView query_view(const at::Tensor& q, int batch, int head_dim,
                                   const at::Device& device) {
  require(q, "q", at::kFloat, 3, device);
  TORCH_CHECK_VALUE(q.size(0) == batch && q.size(2) == head_dim, "q: expected [", batch,
                    ", num_q_heads, ", head_dim, "], got ", q.sizes());
  return {q.data_ptr<float>(), static_cast<int>(q.size(1))};
}

// pages [batch, num_kv_heads, capacity] int32, counts [batch, num_kv_heads] int32.
inline locks::Selection selection_view(const at::Tensor& pages, const at::Tensor& counts, int batch,
                                       int num_kv_heads, const at::Device& device) {
  require(pages, "pages", at::kInt, 3, device);
  require(counts, "counts", at::kInt, 2, device);
  TORCH_CHECK_VALUE(pages.size(0) == batch && pages.size(1) == num_kv_heads, "pages: expected [",
                    batch, ", ", num_kv_heads, ", capacity], got ", pages.sizes());
  TORCH_CHECK_VALUE(counts.size(0) == batch && counts.size(1) == num_kv_heads, "counts: expected [",
                    batch, ", ", num_kv_heads, "], got ", counts.sizes());
  return {pages.data_ptr<int32_t>(), counts.data_ptr<int32_t>(), static_cast<int>(pages.size(2))};
}

// The attention outputs: out [batch, q_heads, d] and lse [batch, q_heads], float32 on dev.
inline locks::AttentionOutput output_view(at::Tensor& out, at::Tensor& lse,
                                          const locks::QueryView& q, int batch, int head_dim,
                                          const at::Device& dev) {
  require(out, "out", at::kFloat, 3, dev);
  require(lse, "lse", at::kFloat, 2, dev);
  TORCH_CHECK_VALUE(out.size(0) == batch && out.size(1) == q.num_q_heads && out.size(2) == head_dim,
                    "out: expected [", batch, ", ", q.num_q_heads, ", ", head_dim, "], got ",
                    out.sizes());
  TORCH_CHECK_VALUE(lse.size(0) == batch && lse.size(1) == q.num_q_heads, "lse: expected [", batch,
                    ", ", q.num_q_heads, "], got ", lse.sizes());
  return {out.data_ptr<float>(), lse.data_ptr<float>()};
}

// Run f, turning locks::Error (bad input caught by the core) into a Python ValueError.
template <typename F>
void translate_errors(F&& f) {
  try {
    f();
  } catch (const locks::Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

}  // namespace locks_torch

// Argument checks shared by the CPU entry points.
#include <cmath>

#include "internal/check.h"
#include "locks/error.h"

namespace locks::detail {

void check_batch_shape(const BatchView& batch, int page_size, const char* where) {
  if (batch.batch_size < 1) fail(where, "batch is empty (batch_size ", batch.batch_size, ")");
  if (batch.seq_lens == nullptr) fail(where, "batch.seq_lens is null");
  if (batch.max_blocks_per_seq < 1)
    fail(where, "batch.max_blocks_per_seq must be >= 1, got ", batch.max_blocks_per_seq);
  const int64_t max_len = int64_t(batch.max_blocks_per_seq) * page_size;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int32_t len = batch.seq_lens[b];
    if (len < 1 || len > max_len)
      fail(where, "seq_lens[", b, "] = ", len, " outside [1, ", max_len,
           "] (an empty sequence has nothing to attend)");
  }
}

void check_batch_blocks(const BatchView& batch, int64_t num_blocks, int page_size,
                        const char* where) {
  check_batch_shape(batch, page_size, where);
  if (batch.block_table == nullptr) fail(where, "batch.block_table is null");
  if (batch.block_table_stride < batch.max_blocks_per_seq)
    fail(where, "batch.block_table_stride ", batch.block_table_stride, " < max_blocks_per_seq ",
         batch.max_blocks_per_seq);
  for (int b = 0; b < batch.batch_size; ++b) {
    const int n = num_pages(batch.seq_lens[b], page_size);
    const int32_t* row = batch.block_table + int64_t(b) * batch.block_table_stride;
    for (int j = 0; j < n; ++j) {
      if (row[j] < 0 || row[j] >= num_blocks)
        fail(where, "block_table[", b, "][", j, "] = ", row[j], " outside [0, ", num_blocks, ")");
    }
  }
}

void check_query(const QueryView& q, int batch_size, int num_kv_heads, int head_dim,
                 const char* where) {
  if (q.q == nullptr) fail(where, "q is null");
  if (!dtype_known(q.dtype)) fail(where, "q: unknown dtype code ", static_cast<int>(q.dtype));
  if (q.num_q_heads < 1 || num_kv_heads < 1 || q.num_q_heads % num_kv_heads != 0)
    fail(where, "num_q_heads ", q.num_q_heads, " is not a positive multiple of num_kv_heads ",
         num_kv_heads);
  const int64_t row = int64_t(q.num_q_heads) * head_dim;
  if (q.stride != 0 && q.stride < row)
    fail(where, "q.stride ", q.stride, " is below one sequence's num_q_heads * head_dim = ", row);
  for (int64_t b = 0; b < batch_size; ++b)
    for (int64_t i = 0; i < row; ++i) {
      if (!std::isfinite(load_as_float(q.q, q.dtype, q.offset(b, 0, head_dim) + i)))
        fail(where, "q has a non-finite element at [", b, "] + ", i);
    }
}

void check_scale(float scale, const char* where) {
  if (!(scale > 0.0f) || !std::isfinite(scale))
    fail(where, "scale must be positive and finite, got ", scale);
}

void check_selection(const Selection& sel, const BatchView& batch, int num_kv_heads, int page_size,
                     const char* where) {
  if (sel.pages == nullptr || sel.counts == nullptr) fail(where, "selection arrays are null");
  if (sel.capacity < 1) fail(where, "selection capacity must be >= 1, got ", sel.capacity);
  for (int b = 0; b < batch.batch_size; ++b) {
    const int n = num_pages(batch.seq_lens[b], page_size);
    for (int g = 0; g < num_kv_heads; ++g) {
      const int64_t bg = int64_t(b) * num_kv_heads + g;
      const int32_t count = sel.counts[bg];
      if (count < 1 || count > sel.capacity)
        fail(where, "selection count[", b, "][", g, "] = ", count, " outside [1, ", sel.capacity,
             "]");
      const int32_t* pages = sel.pages + bg * sel.capacity;
      for (int i = 0; i < count; ++i) {
        if (pages[i] < 0 || pages[i] >= n)
          fail(where, "selected page ", pages[i], " of sequence ", b, " outside [0, ", n, ")");
        if (i > 0 && pages[i] <= pages[i - 1])
          fail(where, "selected pages of sequence ", b, ", KV head ", g,
               " are not strictly ascending");
      }
    }
  }
}

void check_summary_arrays(const SummaryView& out, const char* where) {
  if (out.layout.precision == Precision::fp32) {
    if (!(out.mu && out.basis && out.coeff)) fail(where, "fp32 summary arrays are null");
  } else if (!(out.mu_q && out.mu_scale && out.basis_q && out.basis_scale && out.coeff_q &&
               out.coeff_scale)) {
    fail(where, "quant summary arrays are null");
  }
}

}  // namespace locks::detail

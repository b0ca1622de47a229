// The `locks` operator library: schemas only (implementations per device in ops_cpu.cpp and
// ops_cuda.cpp; fake/meta functions for torch.compile in python/locks/ops.py).
// Every op writes into caller-provided out tensors (the `(a!)` annotations) and returns
// nothing, so a decode step allocates nothing per call and can be captured in a CUDA graph.
#include <torch/library.h>

TORCH_LIBRARY(locks, m) {
  // Summaries (fp32 mode) of the given physical blocks, every KV head.
  m.def(
      "summary_build(Tensor k_cache, Tensor block_ids, Tensor(a!) mu, Tensor(b!) basis, "
      "Tensor(c!) coeff) -> ()");
  // Decode-time update: for each sequence whose length is a multiple of the page size
  // (its last page just filled), rebuild that page's summary. Reads lengths on the device.
  m.def(
      "summary_update(Tensor k_cache, Tensor block_table, Tensor seq_lens, Tensor(a!) mu, "
      "Tensor(b!) basis, Tensor(c!) coeff) -> ()");
  // Score every full page from its summary, share-average over each GQA group, select
  // pages under the budget (select.h's rules).
  m.def(
      "select_pages(Tensor q, Tensor mu, Tensor basis, Tensor coeff, Tensor block_table, "
      "Tensor seq_lens, int budget_tokens, int sink_pages, int recent_pages, float scale, "
      "Tensor(a!) pages, Tensor(b!) counts) -> ()");
  // The same three in the quant storage (int8 centroid, int4 basis, int8 coefficients).
  m.def(
      "summary_build_quant(Tensor k_cache, Tensor block_ids, Tensor(a!) mu_q, Tensor(b!) mu_scale, "
      "Tensor(c!) basis_q, Tensor(d!) basis_scale, Tensor(e!) coeff_q, Tensor(f!) coeff_scale) -> "
      "()");
  m.def(
      "summary_update_quant(Tensor k_cache, Tensor block_table, Tensor seq_lens, Tensor(a!) mu_q, "
      "Tensor(b!) mu_scale, Tensor(c!) basis_q, Tensor(d!) basis_scale, Tensor(e!) coeff_q, "
      "Tensor(f!) coeff_scale) -> ()");
  m.def(
      "select_pages_quant(Tensor q, Tensor mu_q, Tensor mu_scale, Tensor basis_q, Tensor "
      "basis_scale, "
      "Tensor coeff_q, Tensor coeff_scale, Tensor block_table, Tensor seq_lens, int budget_tokens, "
      "int sink_pages, int recent_pages, float scale, Tensor(a!) pages, Tensor(b!) counts) -> ()");
  // Exact attention over the selected pages only.
  m.def(
      "sparse_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, "
      "Tensor seq_lens, Tensor pages, Tensor counts, float scale, Tensor(a!) out, "
      "Tensor(b!) lse) -> ()");
  // Exact attention over every page (FullKV on the paged cache).
  m.def(
      "dense_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, "
      "Tensor seq_lens, float scale, Tensor(a!) out, Tensor(b!) lse) -> ()");
}

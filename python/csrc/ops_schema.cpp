// The `locks` operator library: the schemas of SPEC.md's torch-level contract, and the two
// host-only ops (plan, supports) that take no tensors and so run on any dispatch key.
// Tensor ops are implemented per device in ops_cpu.cpp / ops_cuda.cpp (one template,
// ops_impl.h); their fake implementations for torch.compile are in python/locks/ops.py.
// Every tensor op writes into caller-provided tensors (the `(a!)` annotations) and returns
// nothing, and scratch memory is the caller's workspace sized by the plan: a decode step
// allocates nothing per call and can be captured in a CUDA graph. There is no state in this
// library: a plan is an int[] the caller keeps (locks::DecodePlan::to_ints).
#include <torch/library.h>

#include "ops_plan.h"

TORCH_LIBRARY(locks, m) {
  // Host side, once per batch shape: validate the parameters, choose the backend's kernels
  // and size the workspace. backend 0 = cpu, 1 = cuda (the current CUDA device);
  // precision 0 = fp32 summaries, 1 = int4. Element 0 = workspace bytes, 1 = capacity.
  // tau: 0 = fixed budget, (0, 1] = adaptive (include/locks/select.h), floor_pages its floor;
  // dense_below: sequences shorter than this many tokens attend every page (0 = off).
  // group_pages > 0: a two-level plan (include/locks/super_summary.h: S pages a super-page,
  // super_slots super summaries stored, rank super_rank, extent layout, alpha, min_groups,
  // flat_below_groups; the other TwoLevelConfig fields at their defaults) for decode_two_level.
  m.def(
      "plan(int backend, int num_blocks, int page_size, int num_kv_heads, int head_dim, "
      "ScalarType kv_dtype, int rank, int precision, int num_q_heads, int max_batch, "
      "int max_blocks_per_seq, int budget_tokens, int sink_pages, int recent_pages, "
      "float scale, float tau=0.0, int floor_pages=1, int dense_below=0, int group_pages=0, "
      "int super_slots=0, int super_rank=8, float alpha=40.0, int min_groups=32, "
      "int flat_below_groups=8) -> int[]",
      &locks_torch::plan);
  // The length buckets of a plan (include/locks/cuda/length_buckets.h): the plan vectors of
  // the same step for max_blocks_per_seq M, M / 2, ... (ascending, at most max_buckets, none
  // below min_pages pages a row, the given plan last), concatenated. A CPU plan is its own one
  // bucket (no graphs there).
  m.def("length_buckets(int[] plan, int max_buckets, int min_pages) -> int[]",
        &locks_torch::length_buckets);
  // Capability query (include/locks/support.h): "" when supported, else the reason.
  m.def(
      "supports(int backend, int head_dim, int page_size, int group, ScalarType kv_dtype, "
      "int rank, int precision) -> str",
      &locks_torch::supports);
  // Summaries of the given full physical blocks, every KV head. summaries: 3 fp32 tensors or
  // 6 int4 ones (precision read from the dtypes; layouts in include/locks/summary.h).
  m.def("summary_build(Tensor k_cache, Tensor block_ids, Tensor(a!)[] summaries) -> ()");
  // Decode-time update, on the device (no host sync): with slot_mapping (the slots written
  // this step, slot = block * P + offset, -1 = padding) rebuild every block whose last slot
  // was written; without it, the page that the last token of each sequence completed
  // (seq_lens after the append).
  m.def(
      "summary_update(Tensor k_cache, Tensor block_table, Tensor seq_lens, Tensor? slot_mapping, "
      "Tensor(a!)[] summaries) -> ()");
  // A step's cache write and summary update in one op (include/locks/cache_write.h): token i's
  // K/V rows ([n, H, d], the cache's dtype) into slot slot_mapping[i] (-1 = padding; the last
  // of several tokens naming a slot stays), then, with summaries, every block whose last slot
  // was named rebuilt from the cache after the writes. One CUDA launch, graph-safe.
  m.def(
      "cache_write(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor slot_mapping, Tensor(c!)[] summaries) -> ()");
  // Score every full page from its summary, share-average over each GQA group, select pages
  // under the plan's budget. pages [B, H, plan capacity], counts [B, H].
  m.def(
      "select_pages(Tensor(a!) workspace, int[] plan, Tensor q, Tensor[] summaries, "
      "Tensor block_table, Tensor seq_lens, Tensor(b!) pages, Tensor(c!) counts) -> ()");
  // select_pages over length buckets (include/locks/cuda/length_buckets.h): plans = the plan
  // vectors of length_buckets, concatenated. Under CUDA graph capture the op records a choice,
  // at each replay, of the smallest bucket holding the batch's longest row (a SWITCH node);
  // otherwise, and on the CPU, the last (full) plan's. The same selection as select_pages with
  // the last plan, in any case.
  m.def(
      "select_pages_bucketed(Tensor(a!) workspace, int[] plans, Tensor q, Tensor[] summaries, "
      "Tensor block_table, Tensor seq_lens, Tensor(b!) pages, Tensor(c!) counts) -> ()");
  // Speculative verification with one selection a request (include/locks/request_rows.h):
  // req_pages [S, H, C] / req_counts [S, H], selected at req_seq_lens [S], become the lists of
  // the S x tokens_per_request token rows of lengths seq_lens into pages [S T, H, C' >= C] /
  // counts [S T, H]: each row keeps the request's pages up to its own last page, and that page.
  m.def(
      "request_rows(Tensor req_pages, Tensor req_counts, Tensor req_seq_lens, Tensor seq_lens, "
      "int tokens_per_request, int page_size, Tensor(a!) pages, Tensor(b!) counts) -> ()");
  // Query weights of query-weighted summaries (include/locks/summary.h) from observed queries
  // q_obs f32 [n, num_q_heads, head_dim] (CPU tensor; host work, once per layer): f32
  // [num_kv_heads, head_dim]. The summaries list then ends with them.
  m.def("qweight_from_queries(Tensor q_obs, int num_kv_heads, float floor) -> Tensor");
  // Exact attention over the selected pages, or over every page when pages is None (dense).
  m.def(
      "decode_attention(Tensor(a!) workspace, int[] plan, Tensor q, Tensor k_cache, "
      "Tensor v_cache, Tensor block_table, Tensor seq_lens, Tensor? pages, Tensor? counts, "
      "Tensor(b!) out, Tensor(c!) lse) -> ()");
  // Two-level LOCKS (include/locks/super_summary.h). supers: 8 tensors (centroid layout) or 11
  // (extent layout; torch_super_views.h). super_build: the groups group_blocks [n, S] into
  // slots [n]; super_update: the group each sequence's last token completed (seq_lens after
  // the append), into its slot of super_table [batch, max_groups] (device, no host sync).
  m.def(
      "super_build(Tensor k_cache, Tensor group_blocks, Tensor slots, Tensor(a!)[] supers) -> ()");
  m.def(
      "super_update(Tensor k_cache, Tensor block_table, Tensor seq_lens, Tensor super_table, "
      "Tensor(a!)[] supers) -> ()");
  // The whole two-level step with a two-level plan: level 1 over the super summaries, the
  // page summaries of the kept groups, selection, exact attention; the selection is written
  // to pages / counts when given (capacity = the plan's).
  m.def(
      "decode_two_level(Tensor(a!) workspace, int[] plan, Tensor q, Tensor k_cache, "
      "Tensor v_cache, Tensor[] summaries, Tensor[] supers, Tensor super_table, "
      "Tensor block_table, Tensor seq_lens, Tensor(b!) out, Tensor(c!) lse, "
      "Tensor(d!)? pages=None, Tensor(e!)? counts=None) -> ()");
}

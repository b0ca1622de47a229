// cuda::Decoder (locks/cuda/decoder.h): the contract's plan and ops over one workspace
// allocated at construction.
#include "kernels.cuh"
#include "locks/contract.h"
#include "locks/cuda/check.h"
#include "locks/cuda/decoder.h"

namespace locks::cuda {
namespace {
template <typename T>
T* region(const Workspace& ws, const WorkspaceRegion& r) {
  return reinterpret_cast<T*>(static_cast<char*>(ws.data) + r.offset);
}
}  // namespace

Decoder::Decoder(const Plan& plan) : plan_(plan) {
  DecodeParams p;
  p.cache = plan.cache;
  p.summary.num_blocks = plan.cache.num_blocks;
  p.summary.page_size = plan.cache.page_size;
  p.summary.num_kv_heads = plan.cache.num_kv_heads;
  p.summary.head_dim = plan.cache.head_dim;
  p.summary.rank = plan.rank;
  p.summary.precision = plan.precision;
  p.summary.basis_group =
      plan.basis_group == 0 ? default_basis_group(plan.cache.head_dim) : plan.basis_group;
  p.num_q_heads = plan.num_q_heads;
  p.max_batch = plan.max_batch;
  p.max_blocks_per_seq = plan.max_blocks_per_seq;
  p.select = plan.cfg.select;
  p.scale = plan.cfg.scale;
  p.score_chunk_pages = plan.score_chunk_pages;
  p.select_chunk_pages = plan.select_chunk_pages;
  p.select_cluster = plan.select_cluster;
  p.attn_pages_per_split = plan.attn_pages_per_split;
  dplan_ = plan_decode(p);
  ws_.bytes = dplan_.workspace_bytes;
  LOCKS_CUDA_CHECK(cudaMalloc(&ws_.data, std::max<size_t>(ws_.bytes, 256)));
}

Decoder::~Decoder() { cudaFree(ws_.data); }

void Decoder::run(const KvCacheView& cache, const SummaryView& summaries, const BatchView& batch,
                  const QueryView& q, const AttentionOutput& out, cudaStream_t st) {
  decode(dplan_, ws_, cache, summaries, batch, q, out, nullptr, st);
}

void Decoder::run_dense(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                        const AttentionOutput& out, cudaStream_t st) {
  decode_attention_dense(dplan_, ws_, cache, batch, q, out, st);
}

void Decoder::score(const SummaryView& s, const BatchView& batch, const QueryView& q,
                    cudaStream_t st) {
  score_pages(dplan_, ws_, s, batch, q, region<float>(ws_, dplan_.head_scores), st);
}

void Decoder::aggregate(const BatchView& batch, cudaStream_t st) {
  aggregate_gqa(dplan_, ws_, batch, head_scores(), region<float>(ws_, dplan_.group_scores), st);
}

void Decoder::select(const BatchView& batch, cudaStream_t st) {
  select_pages(dplan_, ws_, batch, group_scores(), selection(), st);
}

void Decoder::aggregate_select(const BatchView& batch, cudaStream_t st) {
  cuda::aggregate_select(dplan_, ws_, batch, head_scores(), region<float>(ws_, dplan_.group_scores),
                         selection(), st);
}

void Decoder::score_select(const SummaryView& s, const BatchView& batch, const QueryView& q,
                           cudaStream_t st) {
  cuda::score_select(dplan_, ws_, s, batch, q, selection(), st);
}

int Decoder::select_cluster() const { return dplan_.select_cluster; }

void Decoder::attend(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                     const Selection* sel, const AttentionOutput& out, cudaStream_t st) {
  if (sel)
    decode_attention_sparse(dplan_, ws_, cache, batch, q, *sel, out, st);
  else
    decode_attention_dense(dplan_, ws_, cache, batch, q, out, st);
}

const float* Decoder::head_scores() const { return region<float>(ws_, dplan_.head_scores); }
const float* Decoder::group_scores() const { return region<float>(ws_, dplan_.group_scores); }
Selection Decoder::selection() const {
  return {region<int32_t>(ws_, dplan_.pages), region<int32_t>(ws_, dplan_.counts), dplan_.capacity};
}

bool Decoder::tensor_core_scoring(const SummaryLayout& s) const {
  return detail::score_uses_tensor_cores(s, dplan_.group);
}

}  // namespace locks::cuda

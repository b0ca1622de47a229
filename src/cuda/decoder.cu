// cuda::Decoder: plan (validate shapes, allocate every workspace once) and the run calls.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "kernels.cuh"
#include "locks/cuda/decoder.h"
#include "locks/cuda/limits.h"
#include "locks/error.h"

namespace locks::cuda {
namespace {
using detail::ceil_div;

constexpr int kDensePagesPerSplit = 16;  // at least 256 tokens, 128 KB of bf16 K+V per KV head
constexpr int kMaxDenseSplits = 512;     // longer contexts get longer splits (merge stays cheap)
constexpr int kSparsePagesPerSplit = 4;  // at least one page per warp

template <typename T>
T* dev_alloc(size_t n) {
  T* p = nullptr;
  LOCKS_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

Decoder::Decoder(const Plan& plan) : plan_(plan) {
  const CacheLayout& L = plan.cache;
  validate_layout(L);
  LOCKS_REQUIRE(L.page_size == limits::kPageSize, "the CUDA decoder needs page_size 16, got ",
                L.page_size);
  LOCKS_REQUIRE(limits::head_dim_supported(L.head_dim),
                "the CUDA decoder needs head_dim 64, 128 or 256, got ", L.head_dim);
  LOCKS_REQUIRE(plan.num_q_heads >= 1 && plan.num_q_heads % L.num_kv_heads == 0, "num_q_heads ",
                plan.num_q_heads, " is not a multiple of num_kv_heads ", L.num_kv_heads);
  group_ = plan.num_q_heads / L.num_kv_heads;
  LOCKS_REQUIRE(limits::group_supported(group_), "GQA group ", group_, " > ", limits::kMaxGroup,
                " is not supported by the CUDA decoder");
  LOCKS_REQUIRE(plan.max_batch >= 1 && plan.max_batch <= 65535,
                "max_batch must be in [1, 65535], got ", plan.max_batch);
  // The kernels index (block, KV head) pairs in 32 bits.
  LOCKS_REQUIRE(int64_t(L.num_blocks) * L.num_kv_heads < (int64_t(1) << 31), "num_blocks ",
                L.num_blocks, " x num_kv_heads ", L.num_kv_heads, " exceeds 2^31");
  LOCKS_REQUIRE(plan.max_blocks_per_seq >= 1, "max_blocks_per_seq must be >= 1, got ",
                plan.max_blocks_per_seq);
  LOCKS_REQUIRE(plan.cfg.scale >= 0.0f && std::isfinite(plan.cfg.scale), "bad scale ",
                plan.cfg.scale);
  scale_ = plan.cfg.scale > 0.0f ? plan.cfg.scale : 1.0f / std::sqrt(float(L.head_dim));
  capacity_ = select_capacity(plan.cfg.select, L.page_size, plan.max_blocks_per_seq);
  const int M = plan.max_blocks_per_seq, B = plan.max_batch, Hq = plan.num_q_heads,
            Hkv = L.num_kv_heads;
  score_chunks_ = ceil_div(M, detail::kScoreChunkMin);  // room for the smallest chunks
  LOCKS_REQUIRE(plan.select_chunk_pages == 0 || plan.select_chunk_pages == 2048 ||
                    plan.select_chunk_pages == 4096,
                "select_chunk_pages must be 0 (auto), 2048 or 4096, got ", plan.select_chunk_pages);
  select_chunk_pages_ =
      plan.select_chunk_pages ? plan.select_chunk_pages : detail::select_chunk_pages(M);
  select_chunks_ = ceil_div(M, select_chunk_pages_);
  int dev = 0, sms = 132;
  LOCKS_CUDA_CHECK(cudaGetDevice(&dev));
  LOCKS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  detail::prepare_score_kernels();
  detail::prepare_attention_kernels();
  LOCKS_REQUIRE(plan.score_chunk_pages == 0 || plan.score_chunk_pages == 32 ||
                    plan.score_chunk_pages == 64 || plan.score_chunk_pages == 128,
                "score_chunk_pages must be 0 (auto), 32, 64 or 128, got ", plan.score_chunk_pages);
  tc_chunk_pages_ = plan.score_chunk_pages
                        ? plan.score_chunk_pages
                        : detail::score_chunk_pages(L.head_dim, group_, int64_t(B) * Hkv, M, sms);
  // Sparse splits: the whole batch in one wave of the attention kernel (its blocks per SM
  // from the occupancy calculator: 3 at d 128 (64 KB of stages), 5 at d 64 for G <= 8 and
  // 4 for G 16), 4 to 32 pages each.
  // A split is a few pages per warp, so a second, partial wave would cost a whole block
  // time (v11: "about 4 blocks per SM" made 512 blocks for 396 slots at 128K batch 8).
  const int64_t slots = int64_t(detail::attention_blocks_per_sm(L.dtype, L.head_dim, group_)) * sms;
  const int64_t per_row = std::max<int64_t>(
      1, slots / (int64_t(B) * Hkv * detail::attention_head_slices(L.head_dim, group_)));
  sparse_pps_ =
      int(std::clamp<int64_t>((capacity_ + per_row - 1) / per_row, kSparsePagesPerSplit, 32));
  sparse_pps_ = (sparse_pps_ + 3) / 4 * 4;
  sparse_splits_ = ceil_div(capacity_, sparse_pps_);
  // Dense splits: about 16 blocks per SM over the planned batch (long splits amortise each
  // block start), 16 to 128 pages each, at most kMaxDenseSplits per sequence.
  const int64_t dense_work = int64_t(M) * B * Hkv;
  dense_pps_ = int(std::clamp<int64_t>(dense_work / (16 * sms), kDensePagesPerSplit, 128));
  dense_pps_ = std::max(dense_pps_ / 4 * 4, ceil_div(M, kMaxDenseSplits));
  dense_splits_ = ceil_div(M, dense_pps_);
  const int splits = std::max(dense_splits_, sparse_splits_);
  head_scores_ = dev_alloc<float>(size_t(B) * Hq * M);
  chunk_lse_ = dev_alloc<float>(size_t(B) * Hq * score_chunks_ * 2);
  group_scores_ = dev_alloc<float>(size_t(B) * Hkv * M);
  head_lse_ = dev_alloc<float>(size_t(B) * Hq);
  pages_ = dev_alloc<int32_t>(size_t(B) * Hkv * capacity_);
  counts_ = dev_alloc<int32_t>(size_t(B) * Hkv);
  cand_key_ = dev_alloc<uint32_t>(size_t(B) * Hkv * select_chunks_ * capacity_);
  cand_idx_ = dev_alloc<int32_t>(size_t(B) * Hkv * select_chunks_ * capacity_);
  cand_cnt_ = dev_alloc<int32_t>(size_t(B) * Hkv * select_chunks_);
  part_o_ = dev_alloc<float>(size_t(B) * Hq * splits * L.head_dim);
  part_ml_ = dev_alloc<float>(size_t(B) * Hq * splits * 2);
}

Decoder::~Decoder() {
  for (void* p : {(void*)head_scores_, (void*)chunk_lse_, (void*)group_scores_, (void*)head_lse_,
                  (void*)pages_, (void*)counts_, (void*)cand_key_, (void*)cand_idx_,
                  (void*)cand_cnt_, (void*)part_o_, (void*)part_ml_})
    cudaFree(p);
}

void Decoder::check_batch(const BatchView& batch) const {
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.batch_size <= plan_.max_batch, "batch_size ",
                batch.batch_size, " outside [1, max_batch = ", plan_.max_batch, "]");
  LOCKS_REQUIRE(
      batch.max_blocks_per_seq >= 1 && batch.max_blocks_per_seq <= plan_.max_blocks_per_seq,
      "batch.max_blocks_per_seq ", batch.max_blocks_per_seq, " outside [1, planned ",
      plan_.max_blocks_per_seq, "]");
  LOCKS_REQUIRE(batch.block_table_stride >= batch.max_blocks_per_seq, "block_table_stride ",
                batch.block_table_stride, " < max_blocks_per_seq ", batch.max_blocks_per_seq);
  LOCKS_REQUIRE(batch.block_table != nullptr && batch.seq_lens != nullptr, "batch arrays are null");
}

bool Decoder::tensor_core_scoring(const SummaryLayout& s) const {
  return detail::score_uses_tensor_cores(s, group_);
}

void Decoder::score(const SummaryView& s, const BatchView& batch, const QueryView& q,
                    cudaStream_t st) {
  check_batch(batch);
  const SummaryLayout& L = s.layout;
  validate_summary_layout(L);
  LOCKS_REQUIRE(L.num_blocks == plan_.cache.num_blocks && L.page_size == plan_.cache.page_size &&
                    L.num_kv_heads == plan_.cache.num_kv_heads &&
                    L.head_dim == plan_.cache.head_dim,
                "summary layout does not match the planned cache");
  LOCKS_REQUIRE(q.q != nullptr && q.num_q_heads == plan_.num_q_heads, "query is null or has ",
                q.num_q_heads, " heads (planned ", plan_.num_q_heads, ")");
  if (L.precision == Precision::fp32) {
    LOCKS_REQUIRE(s.mu && s.basis && s.coeff, "fp32 summary arrays are null");
  } else {
    LOCKS_REQUIRE(s.mu_q && s.mu_scale && s.basis_q && s.basis_scale && s.coeff_q && s.coeff_scale,
                  "quant summary arrays are null");
    LOCKS_REQUIRE(aligned16(s.mu_q) && aligned16(s.basis_q) && aligned16(s.coeff_q),
                  "quant summary code arrays must be 16-byte aligned");
  }
  score_chunk_pages_ = tensor_core_scoring(L) ? tc_chunk_pages_ : detail::kScoreChunk;
  detail::launch_score(s, batch, q.q, plan_.num_q_heads, scale_, head_scores_, chunk_lse_,
                       score_chunks_, score_chunk_pages_, st);
}

void Decoder::aggregate(const BatchView& batch, cudaStream_t st) {
  check_batch(batch);
  detail::launch_aggregate(head_scores_, chunk_lse_, score_chunks_, score_chunk_pages_, batch,
                           plan_.num_q_heads, plan_.cache.num_kv_heads, head_lse_, group_scores_,
                           st);
}

void Decoder::select(const BatchView& batch, cudaStream_t st) {
  check_batch(batch);
  detail::launch_select(group_scores_, batch, plan_.cache.num_kv_heads, plan_.cfg.select,
                        plan_.cache.page_size, selection(), cand_key_, cand_idx_, cand_cnt_,
                        select_chunks_, select_chunk_pages_, st);
}

void Decoder::attend(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                     const Selection* sel, const AttentionOutput& out, cudaStream_t st) {
  check_batch(batch);
  const CacheLayout& L = cache.layout;
  const CacheLayout& P = plan_.cache;
  LOCKS_REQUIRE(L.num_blocks == P.num_blocks && L.page_size == P.page_size &&
                    L.num_kv_heads == P.num_kv_heads && L.head_dim == P.head_dim &&
                    L.dtype == P.dtype,
                "cache layout differs from the planned one");
  LOCKS_REQUIRE(limits::attention_dtype_supported(L.dtype),
                "CUDA attention needs a bf16 or f16 cache, got ", dtype_name(L.dtype));
  LOCKS_REQUIRE(cache.k && cache.v && aligned16(cache.k) && aligned16(cache.v),
                "cache K/V are null or not 16-byte aligned");
  LOCKS_REQUIRE(q.q != nullptr && q.num_q_heads == plan_.num_q_heads, "query is null or has ",
                q.num_q_heads, " heads (planned ", plan_.num_q_heads, ")");
  LOCKS_REQUIRE(out.out != nullptr, "output is null");
  if (sel) {
    LOCKS_REQUIRE(sel->pages && sel->counts && sel->capacity >= 1 && sel->capacity <= capacity_,
                  "selection is null or its capacity ", sel->capacity, " exceeds the plan's ",
                  capacity_);
  }
  const int pps = sel ? sparse_pps_ : dense_pps_;
  detail::launch_attention(cache, batch, q.q, plan_.num_q_heads, scale_, sel, pps,
                           std::max(dense_splits_, sparse_splits_), part_o_, part_ml_, out.out,
                           out.lse, st);
}

void Decoder::run(const KvCacheView& cache, const SummaryView& summaries, const BatchView& batch,
                  const QueryView& q, const AttentionOutput& out, cudaStream_t st) {
  score(summaries, batch, q, st);
  aggregate(batch, st);
  select(batch, st);
  const Selection sel = selection();
  attend(cache, batch, q, &sel, out, st);
}

void Decoder::run_dense(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                        const AttentionOutput& out, cudaStream_t st) {
  attend(cache, batch, q, nullptr, out, st);
}

}  // namespace locks::cuda

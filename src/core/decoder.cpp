// cpu::Decoder: score -> aggregate -> select -> sparse attention over the contract
// (contract.h), with a workspace it owns.
#include "locks/decoder.h"

#include <cmath>

#include "locks/contract.h"
#include "locks/error.h"

namespace locks::cpu {

Decoder::Decoder(const CacheLayout& cache, int num_q_heads, int max_batch, int max_blocks_per_seq,
                 const DecodeConfig& cfg)
    : cache_(cache),
      num_q_heads_(num_q_heads),
      max_batch_(max_batch),
      max_blocks_(max_blocks_per_seq),
      cfg_(cfg) {
  validate_layout(cache_);
  LOCKS_REQUIRE(num_q_heads >= 1 && num_q_heads % cache_.num_kv_heads == 0, "num_q_heads ",
                num_q_heads, " is not a positive multiple of num_kv_heads ", cache_.num_kv_heads);
  LOCKS_REQUIRE(max_batch >= 1, "max_batch must be >= 1, got ", max_batch);
  LOCKS_REQUIRE(max_blocks_per_seq >= 1, "max_blocks_per_seq must be >= 1, got ",
                max_blocks_per_seq);
  LOCKS_REQUIRE(cfg.scale >= 0.0f && std::isfinite(cfg.scale),
                "scale must be 0 (meaning 1/sqrt(head_dim)) or positive and finite, got ",
                cfg.scale);
  if (cfg_.scale == 0.0f) cfg_.scale = 1.0f / std::sqrt(float(cache_.head_dim));
  capacity_ = select_capacity(cfg_.select, cache_.page_size, max_blocks_);
  const size_t mb = size_t(max_batch_), M = size_t(max_blocks_);
  // Reserved once; run() resizes within this capacity to the batch's exact shape.
  head_scores_.reserve(mb * size_t(num_q_heads_) * M);
  group_scores_.reserve(mb * size_t(cache_.num_kv_heads) * M);
  pages_.assign(mb * size_t(cache_.num_kv_heads) * size_t(capacity_), -1);
  counts_.assign(mb * size_t(cache_.num_kv_heads), 0);
}

void Decoder::run(const KvCacheView& cache, const SummaryView& summaries, const BatchView& batch,
                  const QueryView& q, const AttentionOutput& out) {
  const CacheLayout& L = cache.layout;
  LOCKS_REQUIRE(L.num_blocks == cache_.num_blocks && L.page_size == cache_.page_size &&
                    L.num_kv_heads == cache_.num_kv_heads && L.head_dim == cache_.head_dim &&
                    L.dtype == cache_.dtype,
                "cache layout differs from the planned one");
  const SummaryLayout& S = summaries.layout;
  LOCKS_REQUIRE(S.num_blocks == L.num_blocks && S.page_size == L.page_size &&
                    S.num_kv_heads == L.num_kv_heads && S.head_dim == L.head_dim,
                "summary layout does not match the cache");
  LOCKS_REQUIRE(batch.batch_size >= 1 && batch.batch_size <= max_batch_, "batch_size ",
                batch.batch_size, " outside [1, ", max_batch_, "]");
  LOCKS_REQUIRE(batch.max_blocks_per_seq >= 1 && batch.max_blocks_per_seq <= max_blocks_,
                "batch.max_blocks_per_seq ", batch.max_blocks_per_seq, " outside [1, ", max_blocks_,
                "]");
  LOCKS_REQUIRE(q.num_q_heads == num_q_heads_, "num_q_heads ", q.num_q_heads,
                " differs from the planned ", num_q_heads_);
  const size_t B = size_t(batch.batch_size), M = size_t(batch.max_blocks_per_seq);
  head_scores_.resize(B * size_t(num_q_heads_) * M);  // within the reserved capacity
  group_scores_.resize(B * size_t(cache_.num_kv_heads) * M);
  // The contract's plan for this summary layout (planned again only when rank or precision
  // change; the workspace grows at most then).
  if (!planned_ || plan_.params.summary.rank != S.rank ||
      plan_.params.summary.precision != S.precision) {
    DecodeParams p;
    p.cache = cache_;
    p.summary = S;
    p.num_q_heads = num_q_heads_;
    p.max_batch = max_batch_;
    p.max_blocks_per_seq = max_blocks_;
    p.select = cfg_.select;
    p.scale = cfg_.scale;
    plan_ = plan_decode(p);
    planned_ = true;
    workspace_.resize(plan_.workspace_bytes + 256);
  }
  const auto a = reinterpret_cast<uintptr_t>(workspace_.data());
  const Workspace ws{workspace_.data() + ((256 - a % 256) % 256), plan_.workspace_bytes};
  score_pages(plan_, ws, summaries, batch, q, head_scores_.data());
  aggregate_gqa(plan_, ws, batch, head_scores_.data(), group_scores_.data());
  const Selection sel = selection();
  select_pages(plan_, ws, batch, group_scores_.data(), sel);
  decode_attention_sparse(plan_, ws, cache, batch, q, sel, out);
}

Selection Decoder::selection() { return {pages_.data(), counts_.data(), capacity_}; }

}  // namespace locks::cpu

// Lays a captured layer out as a paged cache with one block table shared by every query.
#include "locks/eval/layer_setup.h"

#include <cmath>
#include <cstring>

#include "locks/error.h"

namespace locks::eval {

LayerSetup::LayerSetup(const float* k, const float* v, int64_t tokens, int kv_heads, int head_dim,
                       const float* q, int steps, int q_heads, int page_size, const float* q_obs,
                       int obs_steps) {
  LOCKS_REQUIRE(k && v && q, "k, v and q must be non-null");
  LOCKS_REQUIRE(tokens >= 1 && steps >= 1, "tokens and steps must be >= 1");
  LOCKS_REQUIRE(kv_heads >= 1 && q_heads >= 1 && q_heads % kv_heads == 0, "q_heads (", q_heads,
                ") must be a positive multiple of kv_heads (", kv_heads, ")");
  LOCKS_REQUIRE(obs_steps >= 0 && (obs_steps == 0 || q_obs), "bad observation window");
  const int64_t pages = (tokens + page_size - 1) / page_size;
  LOCKS_REQUIRE(pages <= INT32_MAX, "too many pages");
  CacheLayout layout;
  layout.num_blocks = pages;
  layout.page_size = page_size;
  layout.num_kv_heads = kv_heads;
  layout.head_dim = head_dim;
  layout.dtype = DType::f32;
  validate_layout(layout);

  // Block j holds tokens [jP, jP+P): with blocks in order, the cache is the token-major
  // array itself, padded with zeros to whole pages.
  const int64_t row = int64_t(kv_heads) * head_dim;
  k_.assign(pages * page_size * row, 0.0f);
  v_.assign(pages * page_size * row, 0.0f);
  std::memcpy(k_.data(), k, sizeof(float) * tokens * row);
  std::memcpy(v_.data(), v, sizeof(float) * tokens * row);
  q_.assign(q, q + int64_t(steps) * q_heads * head_dim);
  if (obs_steps > 0) q_obs_.assign(q_obs, q_obs + int64_t(obs_steps) * q_heads * head_dim);

  block_table_.resize(size_t(steps) * pages);
  for (int s = 0; s < steps; ++s)
    for (int64_t j = 0; j < pages; ++j) block_table_[s * pages + j] = static_cast<int32_t>(j);
  seq_lens_.assign(steps, static_cast<int32_t>(tokens));
  LOCKS_REQUIRE(tokens <= INT32_MAX, "too many tokens");

  ctx_.cache = {k_.data(), v_.data(), layout};
  ctx_.batch.block_table = block_table_.data();
  ctx_.batch.block_table_stride = pages;
  ctx_.batch.seq_lens = seq_lens_.data();
  ctx_.batch.batch_size = steps;
  ctx_.batch.max_blocks_per_seq = static_cast<int>(pages);
  ctx_.q = {q_.data(), q_heads};
  ctx_.tokens = tokens;
  ctx_.num_pages = static_cast<int>(pages);
  ctx_.num_full_pages = static_cast<int>(tokens / page_size);
  ctx_.steps = steps;
  ctx_.kv_heads = kv_heads;
  ctx_.q_heads = q_heads;
  ctx_.head_dim = head_dim;
  ctx_.page_size = page_size;
  ctx_.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  ctx_.q_obs = obs_steps > 0 ? q_obs_.data() : nullptr;
  ctx_.obs_steps = obs_steps;
}

}  // namespace locks::eval

// One captured layer laid out for the harness: the keys and values become a paged cache of
// ceil(tokens / P) blocks (block j = tokens [jP, jP + P), the tail zero-padded and outside
// seq_len), and the S decode queries become a batch of S sequences that share one block
// table, each of length `tokens` (the prefix setting: every query attends to every key).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "locks/kv_cache.h"
#include "locks/score.h"

namespace locks::eval {

// What every selector sees of a layer.
struct LayerContext {
  KvCacheView cache;  // float32, [num_pages, P, kv_heads, head_dim]
  BatchView batch;    // S rows, identical block tables 0..num_pages-1, seq_len = tokens
  QueryView q;        // [S, q_heads, head_dim]
  int64_t tokens = 0;
  int num_pages = 0;  // ceil(tokens / P)
  int num_full_pages = 0;
  int steps = 0;
  int kv_heads = 0, q_heads = 0, head_dim = 0, page_size = 0;
  float scale = 0.0f;            // softmax scale, 1/sqrt(head_dim)
  const float* q_obs = nullptr;  // optional [obs_steps, q_heads, head_dim]
  int obs_steps = 0;

  int group() const { return q_heads / kv_heads; }
  // Key i (token index) of KV head h, head_dim floats.
  const float* key(int64_t token, int h) const {
    return static_cast<const float*>(cache.k) + (token * kv_heads + h) * int64_t(head_dim);
  }
  const float* query(int step, int qh) const {
    return static_cast<const float*>(q.q) + (int64_t(step) * q_heads + qh) * head_dim;  // fp32
  }
  int tokens_in_page(int j) const {
    return static_cast<int>(std::min<int64_t>(page_size, tokens - int64_t(j) * page_size));
  }
};

// Owns the buffers behind a LayerContext.
class LayerSetup {
 public:
  // k, v: [tokens, kv_heads, head_dim]; q: [steps, q_heads, head_dim]; q_obs optional.
  LayerSetup(const float* k, const float* v, int64_t tokens, int kv_heads, int head_dim,
             const float* q, int steps, int q_heads, int page_size, const float* q_obs = nullptr,
             int obs_steps = 0);
  const LayerContext& context() const { return ctx_; }

 private:
  std::vector<float> k_, v_, q_, q_obs_;
  std::vector<int32_t> block_table_, seq_lens_;
  LayerContext ctx_;
};

}  // namespace locks::eval

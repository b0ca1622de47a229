// Helpers of the harness tests: small layers from the synthetic generators or plain noise.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "locks/eval/layer_setup.h"
#include "locks/synthetic.h"

namespace locks::eval::test {

struct SmallLayer {
  std::vector<float> k, v, q, q_obs;
  std::unique_ptr<LayerSetup> setup;
  const LayerContext& ctx() const { return setup->context(); }
};

inline SmallLayer synth_layer(SynthKind kind, int64_t tokens, int kv_heads, int q_heads,
                              int head_dim, int steps, int obs = 4, uint64_t seed = 7) {
  SynthConfig c;
  c.kind = kind;
  c.tokens = tokens;
  c.num_kv_heads = kv_heads;
  c.num_q_heads = q_heads;
  c.head_dim = head_dim;
  c.page_size = 16;
  c.steps = steps + obs;
  c.seed = seed;
  SynthData s = synth_generate(c);
  SmallLayer l;
  l.k = std::move(s.keys);
  l.v = std::move(s.values);
  const size_t qn = size_t(steps) * q_heads * head_dim;
  l.q.assign(s.queries.begin(), s.queries.begin() + qn);
  l.q_obs.assign(s.queries.begin() + qn, s.queries.end());
  l.setup =
      std::make_unique<LayerSetup>(l.k.data(), l.v.data(), tokens, kv_heads, head_dim, l.q.data(),
                                   steps, q_heads, 16, obs ? l.q_obs.data() : nullptr, obs);
  return l;
}

// Keys with a per-token random scale, so that page masses differ clearly.
inline SmallLayer noise_layer(int64_t tokens, int kv_heads, int q_heads, int head_dim, int steps,
                              int page_size = 16, uint64_t seed = 3) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  SmallLayer l;
  l.k.resize(size_t(tokens) * kv_heads * head_dim);
  l.v.resize(l.k.size());
  l.q.resize(size_t(steps) * q_heads * head_dim);
  for (auto& x : l.k) x = n(g);
  for (auto& x : l.v) x = n(g);
  for (auto& x : l.q) x = 1.5f * n(g);
  l.q_obs = l.q;
  l.setup =
      std::make_unique<LayerSetup>(l.k.data(), l.v.data(), tokens, kv_heads, head_dim, l.q.data(),
                                   steps, q_heads, page_size, l.q_obs.data(), steps);
  return l;
}

}  // namespace locks::eval::test

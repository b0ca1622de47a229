// Synthetic KV data that tests the method's claims (see docs/ for what each shows).
// Every generator is deterministic in its seed and returns float32 arrays:
// keys/values [tokens, num_kv_heads, head_dim], queries [steps, num_q_heads, head_dim].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace locks {

enum class SynthKind : int {
  gaussian = 0,     // (a) i.i.d. N(0,1) K, V, q, as in the seed's demo
  local_lowrank,    // (b) each page in its own random low-rank subspace; a few relevant pages
  blind_spot,       // (c) relevant pages whose key structure lies outside the dominant global subspace
  needles,          // (d) peaked attention: a few needle tokens carry most of the mass
};
const char* synth_name(SynthKind k);
SynthKind synth_from_name(const std::string& name);  // throws locks::Error on unknown

struct SynthConfig {
  SynthKind kind = SynthKind::gaussian;
  int64_t tokens = 65536;
  int num_kv_heads = 1;
  int num_q_heads = 1;
  int head_dim = 128;
  int page_size = 16;
  int steps = 1;          // decode queries
  uint64_t seed = 0;
};

struct SynthData {
  SynthConfig cfg;
  std::vector<float> keys, values, queries;
  std::vector<int64_t> relevant_pages;  // pages planted as relevant (empty for gaussian)
};

SynthData synth_generate(const SynthConfig& cfg);

}  // namespace locks

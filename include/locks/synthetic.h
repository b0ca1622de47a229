// Synthetic KV data that tests the method's claims (see docs/ for what each shows).
// Every generator is deterministic in its seed and returns float32 arrays:
// keys/values [tokens, num_kv_heads, head_dim], queries [steps, num_q_heads, head_dim].
// Randomness: std::mt19937_64 and our own Box-Muller (std::normal_distribution differs
// between standard libraries), separate streams for keys, values, queries and structure.
// Values are always i.i.d. N(0, 1). docs/synthetic.md says what each kind tests.
//
// Structured kinds (all but gaussian) give each KV head h a unit direction u_h; every query
// of h's group is q = sqrt(d) u_h + 0.5 N(0, I), so a key's logit q.k/sqrt(d) is about u_h.k.
// They plant round(4 * tokens / 65536) (at least 1) relevant pages, the same pages for every
// head, chosen among the full pages other than the first and the last full page.
//   gaussian:      K, V, q i.i.d. N(0, 1), like the seed's demo (nearly uniform attention).
//   local_lowrank: page j, head h: keys = mu_j + B_j z + 0.1 N(0, I), mu_j ~ N(0, I), B_j a
//                  random orthonormal d x r_j basis (r_j uniform in 4..6), z ~ N(0, 2^2).
//                  Relevant pages: u_h.mu_j = 9 and B_j's first column is u_h (spread 1.5),
//                  so ~90%+ of the attention mass falls on them.
//   blind_spot:    head h has a dominant subspace W_h of rank d/2; every centroid is W_h a,
//                  a ~ N(0, 2^2 I); bulk pages deviate inside W_h (rank 4..6, std 2); noise
//                  0.3 N(0, I). u_h is orthogonal to W_h; relevant pages add 9 u_h to the
//                  centroid and deviate in a rank 4..6 subspace orthogonal to W_h containing
//                  u_h. A shared basis of the top R <= d/2 directions of all keys misses them.
//   needles:       K i.i.d. N(0, 1); one needle token per relevant page (random slot) with
//                  u_h.k = 13: single tokens carry most of the mass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace locks {

enum class SynthKind : int {
  gaussian = 0,   // (a) i.i.d. N(0,1) K, V, q, as in the seed's demo
  local_lowrank,  // (b) each page in its own random low-rank subspace; a few relevant pages
  blind_spot,  // (c) relevant pages whose key structure lies outside the dominant global subspace
  needles,     // (d) peaked attention: a few needle tokens carry most of the mass
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
  int steps = 1;  // decode queries
  uint64_t seed = 0;
};

struct SynthData {
  SynthConfig cfg;
  std::vector<float> keys, values, queries;
  std::vector<int64_t> relevant_pages;  // pages planted as relevant (empty for gaussian)
};

SynthData synth_generate(const SynthConfig& cfg);

}  // namespace locks

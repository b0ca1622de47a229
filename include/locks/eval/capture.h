// KV captures: the on-disk input of `locks eval` (format in docs/capture_format.md).
// A capture is a directory holding meta.json and, per captured layer L,
//   layer{L}_k.npy [tokens, kv_heads, head_dim]   keys (as attention sees them)
//   layer{L}_v.npy [tokens, kv_heads, head_dim]   values
//   layer{L}_q.npy [steps, q_heads, head_dim]     decode queries; each attends to all keys
// and optionally layer{L}_k_prerope.npy (same shape as k) and layer{L}_qobs.npy
// [obs_steps, q_heads, head_dim] (the last prefill queries: SnapKV's observation window).
// Arrays are float32 or float16 (the one named by meta.json), little-endian, C order.
// Every inconsistency is a locks::Error naming the file and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace locks::eval {

struct CaptureMeta {
  std::string model;
  int num_layers = 0;
  std::vector<int> layers;  // the captured layer indices (num_layers of them, distinct)
  int kv_heads = 0;
  int q_heads = 0;  // a multiple of kv_heads (query head h reads KV head h / (q_heads/kv_heads))
  int head_dim = 0;
  std::string positional_encoding;  // "rope" or "none" (free text allowed, e.g. "alibi")
  std::string keys;                 // "pre_rope" or "post_rope"
  int64_t tokens = 0;
  int64_t steps = 0;
  std::string dtype;       // "float32" or "float16"
  std::string extra_json;  // any other top-level fields, re-serialised (e.g. "synthetic")
};

struct LayerCapture {
  int layer = 0;
  std::vector<float> k, v;       // [tokens, kv_heads, head_dim]
  std::vector<float> q;          // [steps, q_heads, head_dim]
  std::vector<float> k_prerope;  // optional, empty when absent
  std::vector<float> q_obs;      // optional [obs_steps, q_heads, head_dim], empty when absent
  int64_t obs_steps = 0;
};

// Throws unless the fields are usable (see docs/capture_format.md for the rules).
void validate_capture_meta(const CaptureMeta& meta);
// Parses and validates dir/meta.json.
CaptureMeta read_capture_meta(const std::string& dir);
// Checks that every listed layer's k, v and q files exist (cheap; run before a long
// evaluation so that a missing file is reported at once, not after the first layers).
void check_capture_files(const std::string& dir, const CaptureMeta& meta);
// Loads one layer (must be listed in meta.layers), checking every shape, the dtype and that
// all values are finite.
LayerCapture load_capture_layer(const std::string& dir, const CaptureMeta& meta, int layer);

// Throws unless every attention logit q.k * scale and every page score stays far inside the
// float32 range: max_q |q| * max_t |k_t| * scale must be at most kMaxLogitBound. Beyond it the
// float32 dot products of scoring and attention overflow to inf and inf - inf = NaN (finite
// but huge inputs, e.g. 1e30, would otherwise fail deep inside an op or give NaN outputs).
// q: rows of head_dim floats, nq rows; k likewise. `what` prefixes the message.
inline constexpr double kMaxLogitBound = 1e36;
void check_logit_range(const float* q, int64_t nq, const float* k, int64_t nk, int head_dim,
                       double scale, const std::string& what);

// Writers (float32 arrays). The directory must exist.
void write_capture_meta(const std::string& dir, const CaptureMeta& meta);
void write_capture_layer(const std::string& dir, const CaptureMeta& meta, const LayerCapture& l);

}  // namespace locks::eval

// Reading, validating and writing KV captures (format: docs/capture_format.md).
#include "locks/eval/capture.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "locks/error.h"
#include "locks/io/files.h"
#include "locks/kv_cache.h"
#include "locks/npy.h"

namespace locks::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const kKnownFields[] = {
    "model", "num_layers", "layers", "kv_heads", "q_heads", "head_dim", "positional_encoding",
    "keys",  "tokens",     "steps",  "dtype"};

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

std::string layer_file(const std::string& dir, int layer, const char* what) {
  return (fs::path(dir) / ("layer" + std::to_string(layer) + "_" + what + ".npy")).string();
}

// Loads one array, checking it exists, its dtype and its shape.
std::vector<float> load_checked(const std::string& path, const std::vector<int64_t>& shape,
                                const std::string& dtype) {
  LOCKS_REQUIRE(fs::exists(path), "capture file missing: ", path);
  NpyArray a = npy_load(path);
  LOCKS_REQUIRE(a.source_dtype == dtype, path, ": dtype ", a.source_dtype, " but meta.json says \"",
                dtype, "\"");
  LOCKS_REQUIRE(a.shape == shape, path, ": shape ", shape_str(a.shape), ", expected ",
                shape_str(shape), " (from meta.json)");
  for (size_t i = 0; i < a.data.size(); ++i) {
    LOCKS_REQUIRE(std::isfinite(a.data[i]), path, ": non-finite value at flat index ", i);
  }
  return std::move(a.data);
}

// Limits of what read_capture_meta accepts: a meta.json is a few hundred bytes; nesting
// and size are bounded so that a hostile file cannot exhaust the stack or the memory.
constexpr int kMaxJsonDepth = 64;
constexpr int64_t kMaxMetaBytes = int64_t(16) << 20;
constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// A value for an error message, cut short.
std::string brief(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

const json& field(const json& j, const char* key) {
  LOCKS_REQUIRE(j.contains(key), "meta.json: missing field \"", key, "\"");
  return j.at(key);
}

// The one checked conversion of a JSON number to an integer: a JSON integer (not a float
// such as 1.9 or 1e300, not a boolean) within [lo, hi], else a locks::Error naming the field.
int64_t checked_int(const json& v, const std::string& what, int64_t lo, int64_t hi) {
  if (!v.is_number_integer())  // false for booleans, floats, strings, ...
    detail::fail("read_capture_meta", "meta.json: ", what, " must be an integer, got ", brief(v));
  bool in_range = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(hi);
    x = in_range ? static_cast<int64_t>(u) : 0;
    in_range = in_range && x >= lo;
  } else {
    x = v.get<int64_t>();
    in_range = x >= lo && x <= hi;
  }
  if (!in_range)
    detail::fail("read_capture_meta", "meta.json: ", what, " = ", brief(v), " is out of range [",
                 lo, ", ", hi, "]");
  return x;
}

int64_t get_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  return checked_int(field(j, key), std::string("field \"") + key + "\"", lo, hi);
}

std::string get_string(const json& j, const char* key) {
  const json& v = field(j, key);
  if (!v.is_string())
    detail::fail("read_capture_meta", "meta.json: field \"", key, "\" must be a string, got ",
                 brief(v));
  return v.get<std::string>();
}

// Parses text, refusing nesting deeper than kMaxJsonDepth before any deep value is built
// (the parser itself is iterative; copying or printing a deep value would recurse).
json parse_bounded(const std::string& text, const std::string& path) {
  bool too_deep = false;
  json j;
  try {
    j = json::parse(text, [&](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) too_deep = true;
      return !too_deep;  // once too deep, keep nothing more
    });
  } catch (const json::exception& e) {
    detail::fail("read_capture_meta", path, ": not valid JSON (", e.what(), ")");
  }
  if (too_deep)
    detail::fail("read_capture_meta", path, ": JSON nested more than ", kMaxJsonDepth,
                 " levels deep");
  return j;
}

}  // namespace

void validate_capture_meta(const CaptureMeta& m) {
  LOCKS_REQUIRE(m.num_layers >= 1, "meta.json: num_layers must be >= 1, got ", m.num_layers);
  LOCKS_REQUIRE(static_cast<int>(m.layers.size()) == m.num_layers, "meta.json: layers lists ",
                m.layers.size(), " entries but num_layers is ", m.num_layers);
  std::set<int> seen;
  for (int l : m.layers) {
    LOCKS_REQUIRE(l >= 0, "meta.json: negative layer index ", l);
    LOCKS_REQUIRE(seen.insert(l).second, "meta.json: layer ", l, " listed twice");
  }
  LOCKS_REQUIRE(m.kv_heads >= 1, "meta.json: kv_heads must be >= 1, got ", m.kv_heads);
  LOCKS_REQUIRE(m.q_heads >= 1 && m.q_heads % m.kv_heads == 0,
                "meta.json: q_heads must be a positive multiple of kv_heads (", m.kv_heads,
                "), got ", m.q_heads);
  LOCKS_REQUIRE(head_dim_valid(m.head_dim), "meta.json: head_dim must be even and in [",
                kMinHeadDim, ", ", kMaxHeadDim, "], got ", m.head_dim);
  LOCKS_REQUIRE(!m.positional_encoding.empty(),
                "meta.json: positional_encoding must be a non-empty string (\"rope\", \"none\")");
  LOCKS_REQUIRE(m.keys == "pre_rope" || m.keys == "post_rope",
                "meta.json: keys must be \"pre_rope\" or \"post_rope\", got \"", m.keys, "\"");
  LOCKS_REQUIRE(m.tokens >= 1, "meta.json: tokens must be >= 1, got ", m.tokens);
  LOCKS_REQUIRE(m.steps >= 1, "meta.json: steps must be >= 1, got ", m.steps);
  LOCKS_REQUIRE(m.dtype == "float32" || m.dtype == "float16",
                "meta.json: dtype must be \"float32\" or \"float16\", got \"", m.dtype, "\"");
}

CaptureMeta read_capture_meta(const std::string& dir) {
  LOCKS_REQUIRE(fs::is_directory(dir), "capture directory not found: ", dir);
  const std::string path = (fs::path(dir) / "meta.json").string();
  LOCKS_REQUIRE(fs::exists(path), "capture has no meta.json: ", path);
  const json j = parse_bounded(io::read_text_file(path, "read_capture_meta", kMaxMetaBytes), path);
  LOCKS_REQUIRE(j.is_object(), path, ": top level must be a JSON object");
  CaptureMeta m;
  m.model = get_string(j, "model");
  m.num_layers = static_cast<int>(get_int(j, "num_layers", 1, 1 << 20));
  const json& layers = field(j, "layers");
  if (!layers.is_array())
    detail::fail("read_capture_meta",
                 "meta.json: field \"layers\" must be a list of integers, got ", brief(layers));
  LOCKS_REQUIRE(layers.size() <= (size_t(1) << 20), "meta.json: field \"layers\" lists ",
                layers.size(), " entries (more than 2^20)");
  for (size_t i = 0; i < layers.size(); ++i)
    m.layers.push_back(
        static_cast<int>(checked_int(layers[i], "layers[" + std::to_string(i) + "]", 0, 1 << 20)));
  m.kv_heads = static_cast<int>(get_int(j, "kv_heads", 1, 1 << 16));
  m.q_heads = static_cast<int>(get_int(j, "q_heads", 1, 1 << 16));
  m.head_dim = static_cast<int>(get_int(j, "head_dim", 1, 1 << 16));
  m.positional_encoding = get_string(j, "positional_encoding");
  m.keys = get_string(j, "keys");
  m.tokens = get_int(j, "tokens", 1, kMaxInt32);  // sequence lengths are int32 in the core
  m.steps = get_int(j, "steps", 1, kMaxInt32);
  m.dtype = get_string(j, "dtype");
  json extra = json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool known = false;
    for (const char* k : kKnownFields) known = known || it.key() == k;
    if (!known) extra[it.key()] = it.value();
  }
  m.extra_json = extra.dump();
  validate_capture_meta(m);
  return m;
}

void check_logit_range(const float* q, int64_t nq, const float* k, int64_t nk, int head_dim,
                       double scale, const std::string& what) {
  auto max_norm = [&](const float* x, int64_t rows) {
    double best = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int i = 0; i < head_dim; ++i) s += double(x[r * head_dim + i]) * x[r * head_dim + i];
      best = std::max(best, s);
    }
    return std::sqrt(best);
  };
  const double qn = max_norm(q, nq), kn = max_norm(k, nk), bound = qn * kn * scale;
  if (!(bound <= kMaxLogitBound)) {
    std::ostringstream os;
    os << what << ": values too large for float32 scores: max |q| * max |k| * scale = " << bound
       << " exceeds " << kMaxLogitBound << " (max |q| = " << qn << ", max |k| = " << kn
       << "); the dot products would overflow";
    throw Error(os.str());
  }
}

void check_capture_files(const std::string& dir, const CaptureMeta& m) {
  for (int layer : m.layers)
    for (const char* what : {"k", "v", "q"}) {
      const std::string path = layer_file(dir, layer, what);
      LOCKS_REQUIRE(fs::exists(path), "capture file missing: ", path, " (layer ", layer,
                    " is listed in meta.json)");
    }
}

LayerCapture load_capture_layer(const std::string& dir, const CaptureMeta& m, int layer) {
  validate_capture_meta(m);
  bool listed = false;
  for (int l : m.layers) listed = listed || l == layer;
  LOCKS_REQUIRE(listed, "layer ", layer, " is not listed in meta.json's layers");
  const std::vector<int64_t> kv_shape{m.tokens, m.kv_heads, m.head_dim};
  LayerCapture c;
  c.layer = layer;
  c.k = load_checked(layer_file(dir, layer, "k"), kv_shape, m.dtype);
  c.v = load_checked(layer_file(dir, layer, "v"), kv_shape, m.dtype);
  c.q = load_checked(layer_file(dir, layer, "q"), {m.steps, m.q_heads, m.head_dim}, m.dtype);
  const double scale = 1.0 / std::sqrt(double(m.head_dim));
  check_logit_range(c.q.data(), m.steps * m.q_heads, c.k.data(), m.tokens * m.kv_heads, m.head_dim,
                    scale, "layer " + std::to_string(layer));
  const std::string pre = layer_file(dir, layer, "k_prerope");
  if (fs::exists(pre)) c.k_prerope = load_checked(pre, kv_shape, m.dtype);
  const std::string obs = layer_file(dir, layer, "qobs");
  if (fs::exists(obs)) {
    NpyArray a = npy_load(obs);
    LOCKS_REQUIRE(a.shape.size() == 3 && a.shape[0] >= 1 && a.shape[1] == m.q_heads &&
                      a.shape[2] == m.head_dim,
                  obs, ": shape ", shape_str(a.shape), ", expected [obs_steps, ", m.q_heads, ", ",
                  m.head_dim, "]");
    c.obs_steps = a.shape[0];
    c.q_obs = load_checked(obs, a.shape, m.dtype);
  }
  return c;
}

void write_capture_meta(const std::string& dir, const CaptureMeta& m) {
  validate_capture_meta(m);
  LOCKS_REQUIRE(fs::is_directory(dir), "output directory does not exist: ", dir);
  json j = json::object();
  if (!m.extra_json.empty()) {
    json extra = json::parse(m.extra_json);
    LOCKS_REQUIRE(extra.is_object(), "extra_json must be a JSON object");
    j = extra;
  }
  j["model"] = m.model;
  j["num_layers"] = m.num_layers;
  j["layers"] = m.layers;
  j["kv_heads"] = m.kv_heads;
  j["q_heads"] = m.q_heads;
  j["head_dim"] = m.head_dim;
  j["positional_encoding"] = m.positional_encoding;
  j["keys"] = m.keys;
  j["tokens"] = m.tokens;
  j["steps"] = m.steps;
  j["dtype"] = m.dtype;
  io::write_text_file((fs::path(dir) / "meta.json").string(), j.dump(2) + "\n",
                      "write_capture_meta");
}

void write_capture_layer(const std::string& dir, const CaptureMeta& m, const LayerCapture& c) {
  validate_capture_meta(m);
  LOCKS_REQUIRE(m.dtype == "float32", "write_capture_layer writes float32 captures only");
  const size_t kv = size_t(m.tokens) * m.kv_heads * m.head_dim;
  LOCKS_REQUIRE(c.k.size() == kv && c.v.size() == kv, "layer ", c.layer,
                ": k and v must hold tokens * kv_heads * head_dim = ", kv, " floats");
  LOCKS_REQUIRE(c.q.size() == size_t(m.steps) * m.q_heads * m.head_dim, "layer ", c.layer,
                ": q must hold steps * q_heads * head_dim floats");
  npy_save(layer_file(dir, c.layer, "k"), c.k.data(), {m.tokens, m.kv_heads, m.head_dim});
  npy_save(layer_file(dir, c.layer, "v"), c.v.data(), {m.tokens, m.kv_heads, m.head_dim});
  npy_save(layer_file(dir, c.layer, "q"), c.q.data(), {m.steps, m.q_heads, m.head_dim});
  if (!c.k_prerope.empty()) {
    LOCKS_REQUIRE(c.k_prerope.size() == kv, "layer ", c.layer, ": k_prerope has the wrong size");
    npy_save(layer_file(dir, c.layer, "k_prerope"), c.k_prerope.data(),
             {m.tokens, m.kv_heads, m.head_dim});
  }
  if (!c.q_obs.empty()) {
    LOCKS_REQUIRE(c.q_obs.size() == size_t(c.obs_steps) * m.q_heads * m.head_dim, "layer ", c.layer,
                  ": q_obs must hold obs_steps * q_heads * head_dim floats");
    npy_save(layer_file(dir, c.layer, "qobs"), c.q_obs.data(),
             {c.obs_steps, m.q_heads, m.head_dim});
  }
}

}  // namespace locks::eval

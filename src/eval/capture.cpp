// Reading, validating and writing KV captures (format: docs/capture_format.md).
#include "locks/eval/capture.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "locks/error.h"
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

template <typename T>
T get_field(const json& j, const char* key, const char* type_name) {
  LOCKS_REQUIRE(j.contains(key), "meta.json: missing field \"", key, "\"");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    detail::fail("read_capture_meta", "meta.json: field \"", key, "\" must be ", type_name,
                 ", got ", j.at(key).dump());
  }
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
  LOCKS_REQUIRE(m.head_dim == 32 || m.head_dim == 64 || m.head_dim == 96 || m.head_dim == 128 ||
                    m.head_dim == 256,
                "meta.json: head_dim must be one of 32, 64, 96, 128, 256, got ", m.head_dim);
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
  std::ifstream in(path);
  LOCKS_REQUIRE(in.good(), "cannot open ", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    detail::fail("read_capture_meta", path, ": not valid JSON (", e.what(), ")");
  }
  LOCKS_REQUIRE(j.is_object(), path, ": top level must be a JSON object");
  CaptureMeta m;
  m.model = get_field<std::string>(j, "model", "a string");
  m.num_layers = get_field<int>(j, "num_layers", "an integer");
  m.layers = get_field<std::vector<int>>(j, "layers", "a list of integers");
  m.kv_heads = get_field<int>(j, "kv_heads", "an integer");
  m.q_heads = get_field<int>(j, "q_heads", "an integer");
  m.head_dim = get_field<int>(j, "head_dim", "an integer");
  m.positional_encoding = get_field<std::string>(j, "positional_encoding", "a string");
  m.keys = get_field<std::string>(j, "keys", "a string");
  m.tokens = get_field<int64_t>(j, "tokens", "an integer");
  m.steps = get_field<int64_t>(j, "steps", "an integer");
  m.dtype = get_field<std::string>(j, "dtype", "a string");
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
  std::ofstream out((fs::path(dir) / "meta.json").string());
  LOCKS_REQUIRE(out.good(), "cannot write meta.json in ", dir);
  out << j.dump(2) << "\n";
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

// libFuzzer harness of the capture reader. Input: meta.json text, a 0 byte, then the bytes of
// the first listed layer's K file; V and Q are written valid for the parsed meta (when small),
// so the fuzzer reaches the shape, dtype, finiteness and range checks of load_capture_layer.
// Anything but a locks::Error or success is a finding.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <vector>

#include "fuzz_util.h"
#include "locks/error.h"
#include "locks/eval/capture.h"
#include "locks/npy.h"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path dir = locks::fuzz::scratch() / "capture";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const uint8_t* zero = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t meta_len = zero ? size_t(zero - data) : size;
  locks::fuzz::write_bytes(dir / "meta.json", data, meta_len);
  try {
    const locks::eval::CaptureMeta m = locks::eval::read_capture_meta(dir.string());
    const int layer = m.layers.at(0);  // validate_capture_meta: num_layers >= 1 entries
    const std::string stem = (dir / ("layer" + std::to_string(layer) + "_")).string();
    const uint8_t* k = zero ? zero + 1 : data + size;
    locks::fuzz::write_bytes(stem + "k.npy", k, size_t(data + size - k));
    const int64_t kv = m.tokens * m.kv_heads * m.head_dim, q = m.steps * m.q_heads * m.head_dim;
    if (kv <= (1 << 16) && q <= (1 << 16)) {
      std::vector<float> zeros(size_t(std::max(kv, q)), 0.0f);
      locks::npy_save(stem + "v.npy", zeros.data(), {m.tokens, m.kv_heads, m.head_dim});
      locks::npy_save(stem + "q.npy", zeros.data(), {m.steps, m.q_heads, m.head_dim});
    }
    locks::eval::check_capture_files(dir.string(), m);
    const locks::eval::LayerCapture c = locks::eval::load_capture_layer(dir.string(), m, layer);
    if (c.k.size() != size_t(kv) || c.v.size() != size_t(kv)) std::abort();
  } catch (const locks::Error&) {
  }
  return 0;
}

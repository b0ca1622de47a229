// Reading and writing NumPy .npy files (format versions 1.0-3.0, little-endian,
// C order). Our own small parser: the packaged reader (xtensor's xnpy) neither reads
// float16 nor reports truncated or malformed files; this one checks every header field
// and the payload size, and throws locks::Error naming the file and the problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace locks {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;   // converted to float32, C order
  std::string source_dtype;  // "float32" or "float16" (what the file held)
  int64_t size() const;
};

// Accepts float32 and float16 ('<f4', '<f2', '|f2'); anything else is an error.
NpyArray npy_load(const std::string& path);
void npy_save(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void npy_save_i32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);

}  // namespace locks

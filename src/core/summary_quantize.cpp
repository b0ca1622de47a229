// summary_quantize / summary_dequantize: symmetric round-to-nearest quantization of one
// (block, head) summary (int8 centroid, int4 basis with one scale per basis_group dims of a
// row, int8 coefficients; float scales).
// Codes are rint(x / scale) (ties to even, like CUDA's __float2int_rn), clamped to the
// code range; a zero range gives scale 0 and codes 0.
#include <algorithm>
#include <cmath>

#include "locks/error.h"
#include "locks/summary.h"

namespace locks {
namespace {

float max_abs(const float* x, int64_t n, int64_t stride) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i * stride]);
    if (!std::isfinite(a)) return a;  // NaN/Inf: reported by the caller
    m = std::max(m, a);
  }
  return m;
}

int code(float x, float scale, int limit) {
  if (scale == 0.0f) return 0;
  const float c = std::rint(x / scale);
  return static_cast<int>(std::clamp(c, float(-limit), float(limit)));
}

void check_args(int head_dim, int page_size, int rank, int basis_group) {
  LOCKS_REQUIRE(head_dim >= 2 && head_dim % 2 == 0, "head_dim must be even and >= 2, got ",
                head_dim);
  LOCKS_REQUIRE(rank >= 1 && rank < page_size && rank <= head_dim, "bad rank ", rank,
                " for page_size ", page_size, ", head_dim ", head_dim);
  LOCKS_REQUIRE(basis_group >= 2 && basis_group % 2 == 0 && head_dim % basis_group == 0,
                "basis_group must be an even divisor of head_dim ", head_dim, ", got ",
                basis_group);
}

}  // namespace

void summary_quantize(const float* mu, const float* basis, const float* coeff, int head_dim,
                      int page_size, int rank, int basis_group, int8_t* mu_q, float* mu_scale,
                      uint8_t* basis_q, float* basis_scale, int8_t* coeff_q, float* coeff_scale) {
  check_args(head_dim, page_size, rank, basis_group);
  LOCKS_REQUIRE(
      mu && basis && coeff && mu_q && mu_scale && basis_q && basis_scale && coeff_q && coeff_scale,
      "null pointer argument");
  const int d = head_dim, r = rank, P = page_size;

  const float ms = max_abs(mu, d, 1) / 127.0f;
  LOCKS_REQUIRE(std::isfinite(ms), "centroid has a non-finite element");
  *mu_scale = ms;
  for (int i = 0; i < d; ++i) mu_q[i] = static_cast<int8_t>(code(mu[i], ms, 127));

  const int g = basis_group, ng = d / g;
  for (int k = 0; k < r; ++k) {
    for (int j = 0; j < ng; ++j) {  // group j: dims [j g, (j + 1) g), bytes [j g / 2, ...)
      const float* row = basis + int64_t(k) * d + int64_t(j) * g;
      const float bs = max_abs(row, g, 1) / 7.0f;
      LOCKS_REQUIRE(std::isfinite(bs), "basis row ", k, " has a non-finite element");
      basis_scale[int64_t(k) * ng + j] = bs;
      uint8_t* out = basis_q + int64_t(k) * (d / 2) + int64_t(j) * (g / 2);
      for (int i = 0; i < g / 2; ++i) {
        const unsigned lo = static_cast<unsigned>(code(row[2 * i], bs, 7)) & 0xFu;
        const unsigned hi = static_cast<unsigned>(code(row[2 * i + 1], bs, 7)) & 0xFu;
        out[i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }

  for (int k = 0; k < r; ++k) {
    const float cs = max_abs(coeff + k, P, r) / 127.0f;
    LOCKS_REQUIRE(std::isfinite(cs), "coefficient column ", k, " has a non-finite element");
    coeff_scale[k] = cs;
    for (int i = 0; i < P; ++i)
      coeff_q[int64_t(i) * r + k] = static_cast<int8_t>(code(coeff[int64_t(i) * r + k], cs, 127));
  }
}

void summary_dequantize(const int8_t* mu_q, float mu_scale, const uint8_t* basis_q,
                        const float* basis_scale, const int8_t* coeff_q, const float* coeff_scale,
                        int head_dim, int page_size, int rank, int basis_group, float* mu,
                        float* basis, float* coeff) {
  check_args(head_dim, page_size, rank, basis_group);
  LOCKS_REQUIRE(mu_q && basis_q && basis_scale && coeff_q && coeff_scale && mu && basis && coeff,
                "null pointer argument");
  const int d = head_dim, r = rank, P = page_size;
  const int ng = d / basis_group;
  for (int i = 0; i < d; ++i) mu[i] = float(mu_q[i]) * mu_scale;
  for (int k = 0; k < r; ++k) {
    const uint8_t* in = basis_q + int64_t(k) * (d / 2);
    float* row = basis + int64_t(k) * d;
    for (int i = 0; i < d / 2; ++i) {
      const float bs = basis_scale[int64_t(k) * ng + 2 * i / basis_group];
      const int8_t lo = static_cast<int8_t>(static_cast<uint8_t>(in[i] << 4)) >> 4;
      const int8_t hi = static_cast<int8_t>(in[i]) >> 4;
      row[2 * i] = float(lo) * bs;
      row[2 * i + 1] = float(hi) * bs;
    }
  }
  for (int i = 0; i < P; ++i)
    for (int k = 0; k < r; ++k)
      coeff[int64_t(i) * r + k] = float(coeff_q[int64_t(i) * r + k]) * coeff_scale[k];
}

}  // namespace locks

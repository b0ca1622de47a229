// Page summaries: for every full page and KV head, the centroid mu of its keys,
// the top-`rank` right singular vectors of the centred keys (rows of basis), and
// each key's coefficients in that basis. Stored per physical block, beside the cache.
//
// Storage (SoA, indexed by physical block id b and KV head h; H = num_kv_heads,
// d = head_dim, P = page_size, r = rank):
//   fp32 mode:
//     mu          float [num_blocks, H, d]
//     basis       float [num_blocks, H, r, d]      row k = k-th right singular vector
//     coeff       float [num_blocks, H, P, r]      coeff[i][k] = basis[k] . (key_i - mu)
//   quant mode (int8 centroid, int4 basis, int8 coefficients, float scales):
//     mu_q        int8  [num_blocks, H, d]          mu ~= mu_q * mu_scale
//     mu_scale    float [num_blocks, H]             = max|mu| / 127
//     basis_q     uint8 [num_blocks, H, r, d/2]     two int4 in [-7, 7] per byte, two's
//                                                   complement; low nibble = even dim
//     basis_scale float [num_blocks, H, r, d/g]     scale of dims [j g, (j + 1) g) of row k
//                                                   = max over them of |basis[k]| / 7
//                                                   (g = layout.basis_group; g = d: one a row)
//     coeff_q     int8  [num_blocks, H, P, r]       coeff ~= coeff_q * coeff_scale[k]
//     coeff_scale float [num_blocks, H, r]          = max_i |coeff[i][k]| / 127
// Quantization is symmetric round-to-nearest; a zero range gives scale 0 and codes 0.
// Basis scale groups (basis_group): at head_dim 256 the basis rows' entries spread over
// channels of very different magnitude (Gemma-3's queries and keys, and the query-weighted
// basis that is on by default there; docs/study_gemma3.md), so one int4 scale a row wastes the
// small channels' codes; a scale per 32 dims keeps them (docs/quantization.md has the error
// bound per group). At head_dim <= 128 the default is one scale a row: there group scales
// showed no recall gain on the plain basis and cost the tensor-core scorer ~19% (Llama-3.1-8B
// 128K batch 8, docs/cuda_notes.md v18); they remain available (basis_group 16 / 32).
// Query-weighted summaries (optional, SummaryView::qweight; docs/method.md): with per-channel
// weights w > 0 of each KV head, the basis and coefficients are those of the weighted
// deviations (k_i - mu) * w (elementwise), so that the rank-r fit is best where the queries
// have their energy; mu stays unweighted. A score then reads q.mu + sum_k c_ik (basis_k . q / w)
// and a key's reconstruction is mu + (sum_k c_ik basis_k) / w. w = 1 is the plain summary.
// The singular vectors' signs are whatever the solver returns; scores do not depend
// on them, so backends are compared on scores and reconstructions, not on raw bases.
// Only full pages have summaries; the partial tail page of a sequence has none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "locks/kv_cache.h"

namespace locks {

enum class Precision : int { fp32 = 0, quant = 1 };
inline constexpr const char* precision_name(Precision p) {
  return p == Precision::fp32 ? "fp32" : "int4";
}

struct SummaryLayout {
  int64_t num_blocks = 0;
  int page_size = 16;
  int num_kv_heads = 1;
  int head_dim = 128;
  int rank = 8;
  Precision precision = Precision::fp32;
  // Dims per int4 basis scale (quant mode; every layout carries it so that plans compare
  // whole layouts): an even divisor of head_dim; head_dim = one scale a row. 0 (unset) is
  // rejected: summary_layout_for / default_basis_group choose it.
  int basis_group = 0;
};

// The library's basis scale group: 32 at head_dim >= 256 (when 32 divides it), else one
// scale a row (head_dim).
int default_basis_group(int head_dim);
// Throws unless 1 <= rank < page_size, rank <= head_dim, head_dim even, and basis_group an
// even divisor of head_dim.
void validate_summary_layout(const SummaryLayout& s);
// basis_group 0: default_basis_group(cache.head_dim).
SummaryLayout summary_layout_for(const CacheLayout& cache, int rank, Precision precision,
                                 int basis_group = 0);

// Bytes of one (page, KV head) summary, and that as a share of the page's bf16 K+V
// for that head (2 * P * d * 2 bytes).
size_t summary_bytes_per_page(const SummaryLayout& s);
double summary_share_of_bf16_kv(const SummaryLayout& s);

struct SummaryView {
  SummaryLayout layout;
  // fp32 mode
  float* mu = nullptr;
  float* basis = nullptr;
  float* coeff = nullptr;
  // quant mode
  int8_t* mu_q = nullptr;
  float* mu_scale = nullptr;
  uint8_t* basis_q = nullptr;
  float* basis_scale = nullptr;
  int8_t* coeff_q = nullptr;
  float* coeff_scale = nullptr;
  // Query weights [num_kv_heads, head_dim] (same memory space as the summaries), finite and
  // > 0, or nullptr for the plain summaries (w = 1). Builds and scores of one set of
  // summaries must use the same weights.
  const float* qweight = nullptr;
};

// Throws locks::InvalidArgument unless the host array qweight [num_kv_heads, head_dim] is
// finite and > 0 everywhere (CUDA callers check their device weights before the copy or
// with the Python layer's validate=True).
void validate_qweight(const float* qweight, int num_kv_heads, int head_dim);
// Per-channel query weights from observed queries q [n, num_q_heads, head_dim] (e.g. the
// last prompt queries): w = sqrt(max(mean q^2, floor * mean over channels of mean q^2)) per
// KV head over its group's query heads; floor 1e-2 keeps channels that no observed query
// used from vanishing. Host arrays, out [num_kv_heads, head_dim].
void qweight_from_queries(const float* q, int64_t n, int num_q_heads, int num_kv_heads,
                          int head_dim, float* out, double floor = 1e-2);

// Owning host storage for the summaries of a whole cache.
class SummaryStore {
 public:
  explicit SummaryStore(const SummaryLayout& layout);
  SummaryView view();
  const SummaryLayout& layout() const { return layout_; }

 private:
  SummaryLayout layout_;
  std::vector<float> mu_, basis_, coeff_, mu_scale_, basis_scale_, coeff_scale_;
  std::vector<int8_t> mu_q_, coeff_q_;
  std::vector<uint8_t> basis_q_;
};

// Quantize/dequantize one summary (helpers shared by every backend and the tests).
// fp32 inputs: mu[d], basis[r*d], coeff[P*r]; outputs in quant layout for one (block, head):
// basis_scale[r * (d / basis_group)].
void summary_quantize(const float* mu, const float* basis, const float* coeff, int head_dim,
                      int page_size, int rank, int basis_group, int8_t* mu_q, float* mu_scale,
                      uint8_t* basis_q, float* basis_scale, int8_t* coeff_q, float* coeff_scale);
void summary_dequantize(const int8_t* mu_q, float mu_scale, const uint8_t* basis_q,
                        const float* basis_scale, const int8_t* coeff_q, const float* coeff_scale,
                        int head_dim, int page_size, int rank, int basis_group, float* mu,
                        float* basis, float* coeff);
// Basis scales per (block, head): rank * (head_dim / basis_group).
inline int64_t basis_scales_per_head(const SummaryLayout& s) {
  return int64_t(s.rank) * (s.head_dim / s.basis_group);
}

namespace cpu {
// Build the summaries of the given physical blocks (all full pages), every KV head.
// Multi-threaded over (block, head). Exact thin SVD through Eigen (JacobiSVD) in double,
// results rounded to float. Throws on non-finite keys, block ids out of range, or a
// summary layout that does not match the cache.
void summary_build(const KvCacheView& cache, const int32_t* block_ids, int64_t n_blocks,
                   const SummaryView& out);
}  // namespace cpu

}  // namespace locks

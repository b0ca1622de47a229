// cpu::aggregate_gqa: share-averaging of the query heads' page scores into one score per
// KV head (score.h):  a_j = log( (1/G) sum_h exp(s_hj - LSE_h) ), all in the log domain.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "internal/fast_exp.h"
#include "internal/ops.h"
#include "internal/simd_clones.h"
#include "locks/error.h"
#include "locks/score.h"

namespace locks::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One (sequence, KV head): s = its G heads' scores [G][M], a = the group scores [M].
LOCKS_SIMD_CLONES
void aggregate_group(const float* s, int G, int M, float log_g, float* lse, float* buf, float* mx,
                     float* sum, float* a) {
  for (int h = 0; h < G; ++h) {
    const float* sh = s + int64_t(h) * M;
    float m = kNegInf;
    for (int j = 0; j < M; ++j) m = sh[j] > m ? sh[j] : m;
    if (m == kNegInf) {
      lse[h] = kNegInf;  // head has no scored page: contributes nothing
      continue;
    }
    for (int j = 0; j < M; ++j) buf[j] = detail::exp_nonpos(sh[j] - m);  // -inf: 0
    float total = 0.0f;
    for (int j = 0; j < M; ++j) total += buf[j];
    lse[h] = m + std::log(total);
  }
  // mx_j = max over heads of the log shares t_hj = s_hj - LSE_h (-inf where unscored).
  std::fill(mx, mx + M, kNegInf);
  std::fill(sum, sum + M, 0.0f);
  for (int h = 0; h < G; ++h) {
    if (lse[h] == kNegInf) continue;
    const float* sh = s + int64_t(h) * M;
    const float l = lse[h];
    for (int j = 0; j < M; ++j) {
      const float t = sh[j] - l;
      mx[j] = t > mx[j] ? t : mx[j];
    }
  }
  for (int h = 0; h < G; ++h) {
    if (lse[h] == kNegInf) continue;
    const float* sh = s + int64_t(h) * M;
    const float l = lse[h];
    // Unscored entries give -inf or NaN (-inf minus -inf) here: exp_nonpos maps both to 0.
    for (int j = 0; j < M; ++j) sum[j] += detail::exp_nonpos(sh[j] - l - mx[j]);
  }
  for (int j = 0; j < M; ++j) a[j] = mx[j] == kNegInf ? kNegInf : mx[j] + std::log(sum[j]) - log_g;
}

}  // namespace

void aggregate_gqa(const float* head_scores, const BatchView& batch, int num_q_heads,
                   int num_kv_heads, float* group_scores) {
  const int G = num_kv_heads >= 1 ? num_q_heads / num_kv_heads : 0;
  const detail::OwnedScratch sc(
      detail::checked_bytes(impl::aggregate_scratch_bytes, G, batch.max_blocks_per_seq));
  impl::aggregate_gqa(head_scores, batch, num_q_heads, num_kv_heads, group_scores, sc.view());
}

size_t impl::aggregate_scratch_bytes(int G, int M) {
  return detail::carve_bytes<float>(size_t(G)) + 3 * detail::carve_bytes<float>(size_t(M));
}

void impl::aggregate_gqa(const float* head_scores, const BatchView& batch, int num_q_heads,
                         int num_kv_heads, float* group_scores, const detail::ThreadScratch& sc) {
  LOCKS_REQUIRE(head_scores != nullptr && group_scores != nullptr, "null score array");
  LOCKS_REQUIRE(batch.batch_size >= 1, "batch is empty (batch_size ", batch.batch_size, ")");
  LOCKS_REQUIRE(batch.max_blocks_per_seq >= 1, "batch.max_blocks_per_seq must be >= 1, got ",
                batch.max_blocks_per_seq);
  LOCKS_REQUIRE(num_q_heads >= 1 && num_kv_heads >= 1 && num_q_heads % num_kv_heads == 0,
                "num_q_heads ", num_q_heads, " is not a positive multiple of num_kv_heads ",
                num_kv_heads);
  const int M = batch.max_blocks_per_seq, Hq = num_q_heads, Hkv = num_kv_heads;
  const int G = Hq / Hkv;
  const int64_t n = int64_t(batch.batch_size) * Hq * M;
  // Scores are finite or -inf (pages without a score); NaN or +inf means a broken input.
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; ++i) {
    const float x = head_scores[i];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) bad = i;
  }
  LOCKS_REQUIRE(bad < 0, "head_scores[", bad, "] = ", head_scores[bad < 0 ? 0 : bad],
                " (NaN or +inf)");

  const float log_g = std::log(float(G));
  const int64_t groups = int64_t(batch.batch_size) * Hkv;
  // Loops run over pages (contiguous) with the vectorizable exp: ~3 ns a score on one thread.
  LOCKS_REQUIRE(sc.per_thread >= impl::aggregate_scratch_bytes(G, M), "scratch too small");
#pragma omp parallel num_threads(sc.threads) if (n >= 16384)
  {
    detail::Carver c(sc.slice(omp_get_thread_num()));
    float* lse = c.take<float>(size_t(G));
    float* buf = c.take<float>(size_t(M));
    float* mx = c.take<float>(size_t(M));
    float* sum = c.take<float>(size_t(M));
#pragma omp for schedule(dynamic, 1)
    for (int64_t bg = 0; bg < groups; ++bg) {
      aggregate_group(head_scores + bg * G * M, G, M, log_g, lse, buf, mx, sum,
                      group_scores + bg * M);
    }
  }
}

}  // namespace locks::cpu

// cpu::aggregate_gqa: share-averaging of the query heads' page scores into one score per
// KV head (score.h):  a_j = log( (1/G) sum_h exp(s_hj - LSE_h) ), all in the log domain.
#include <cmath>
#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/score.h"

namespace locks::cpu {

void aggregate_gqa(const float* head_scores, const BatchView& batch, int num_q_heads,
                   int num_kv_heads, float* group_scores) {
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

  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float log_g = std::log(float(G));
  const int64_t groups = int64_t(batch.batch_size) * Hkv;
  // Single-threaded this costs ~8 ns a score (0.5 ms at 32K tokens, 32 heads): threads only
  // pay off for long batches; a fork/join on a loaded machine can cost a scheduler slice.
#pragma omp parallel if (n >= (int64_t(1) << 18))
  {
    std::vector<float> lse(static_cast<size_t>(G));
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < groups; ++bg) {
      const float* s = head_scores + bg * G * M;  // heads g*G .. g*G+G-1 of sequence b
      float* a = group_scores + bg * M;
      for (int h = 0; h < G; ++h) {
        const float* sh = s + int64_t(h) * M;
        float m = kNegInf;
        for (int j = 0; j < M; ++j) m = sh[j] > m ? sh[j] : m;
        if (m == kNegInf) {
          lse[size_t(h)] = kNegInf;  // head has no scored page: contributes nothing
          continue;
        }
        float sum = 0.0f;
        for (int j = 0; j < M; ++j) sum += std::exp(sh[j] - m);
        lse[size_t(h)] = m + std::log(sum);
      }
      for (int j = 0; j < M; ++j) {
        float m = kNegInf;  // max over heads of the log shares t_h = s_hj - LSE_h
        for (int h = 0; h < G; ++h) {
          if (lse[size_t(h)] == kNegInf || s[int64_t(h) * M + j] == kNegInf) continue;
          const float t = s[int64_t(h) * M + j] - lse[size_t(h)];
          m = t > m ? t : m;
        }
        if (m == kNegInf) {
          a[j] = kNegInf;
          continue;
        }
        float sum = 0.0f;
        for (int h = 0; h < G; ++h) {
          if (lse[size_t(h)] == kNegInf || s[int64_t(h) * M + j] == kNegInf) continue;
          sum += std::exp(s[int64_t(h) * M + j] - lse[size_t(h)] - m);
        }
        a[j] = m + std::log(sum) - log_g;
      }
    }
  }
}

}  // namespace locks::cpu

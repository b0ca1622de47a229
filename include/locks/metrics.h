// Quality metrics shared by the CLI, the evaluation harness and the tests.
#pragma once

#include <cstdint>

#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"

namespace locks {

// Share of query head h's exact softmax mass (over the whole sequence) that falls on the
// selected pages of its KV head. Float64 inside. recall: [batch, num_q_heads].
void attention_mass_recall(const KvCacheView& cache, const BatchView& batch, const QueryView& q,
                           float scale, const Selection& sel, double* recall);

// Float64 sums. Two all-zero vectors give 1, one all-zero vector gives 0; NaN propagates.
double cosine_similarity(const float* a, const float* b, int64_t n);
// ||a - ref|| / ||ref||, float64; 0 when both are zero, +inf when only ref is zero.
double relative_l2(const float* a, const float* ref, int64_t n);

}  // namespace locks

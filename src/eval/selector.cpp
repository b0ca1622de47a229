// The parts of the selector interface shared by every method: defaults and GQA rules.
#include "locks/eval/selector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "locks/error.h"
#include "locks/score.h"

namespace locks::eval {

const char* gqa_rule_name(GqaRule r) {
  return r == GqaRule::share_average ? "share-average" : "max-share";
}

bool PageSelector::available(const LayerContext&, std::string*) const { return true; }

void PageSelector::adjust_group_scores(const LayerContext&, const SelectConfig&, float*) {}

void aggregate_group_scores(GqaRule rule, const LayerContext& ctx, const float* head_scores,
                            float* group_scores) {
  if (rule == GqaRule::share_average) {
    cpu::aggregate_gqa(head_scores, ctx.batch, ctx.q_heads, ctx.kv_heads, group_scores);
    return;
  }
  // max-share: log max_h (exp(s_hj - LSE_h)) = max_h (s_hj - LSE_h). Written here because
  // locks_core implements only share-averaging (LOCKS's rule).
  const float ninf = -std::numeric_limits<float>::infinity();
  const int n = ctx.num_pages, G = ctx.group();
  std::vector<double> lse(G);
  for (int s = 0; s < ctx.steps; ++s) {
    for (int g = 0; g < ctx.kv_heads; ++g) {
      for (int i = 0; i < G; ++i) {
        const float* row = head_scores + (int64_t(s) * ctx.q_heads + g * G + i) * n;
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < n; ++j) m = std::max(m, double(row[j]));
        double acc = 0;
        if (std::isfinite(m))
          for (int j = 0; j < n; ++j) acc += std::exp(double(row[j]) - m);
        lse[i] = std::isfinite(m) ? m + std::log(acc) : m;
      }
      float* out = group_scores + (int64_t(s) * ctx.kv_heads + g) * n;
      for (int j = 0; j < n; ++j) {
        double best = -std::numeric_limits<double>::infinity();
        for (int i = 0; i < G; ++i) {
          const float v = head_scores[(int64_t(s) * ctx.q_heads + g * G + i) * n + j];
          if (v == ninf || !std::isfinite(lse[i])) continue;
          best = std::max(best, double(v) - lse[i]);
        }
        out[j] = static_cast<float>(best);
      }
    }
  }
}

}  // namespace locks::eval

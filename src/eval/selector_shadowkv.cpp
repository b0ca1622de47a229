// ShadowKV-style landmark selector: per chunk of `shadow_chunk` tokens (8) a landmark, the
// mean of its keys as attention sees them (post-RoPE when the capture's keys are); a page's
// score is the log of its estimated mass, log sum_chunks C * exp(scale * q . landmark); the
// GQA group takes the max of its heads' mass shares (ShadowKV's rule). Outlier chunks (keys
// least similar to their landmark: lowest min cosine) are kept exact, as in ShadowKV: their
// pages are forced into the selection, inside the budget, at most a quarter of the slots.
// The shared rank-R key basis of ShadowKV compresses the keys it stores; attention here is
// exact for every method, so the basis only enters the metadata bytes (amortised).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>

#include "score_rows.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class ShadowKv final : public PageSelector {
 public:
  explicit ShadowKv(const SelectorParams& p) : p_(p) {}
  std::string name() const override { return "shadowkv"; }
  std::string description() const override {
    return "ShadowKV-style: 8-token chunk landmarks + outlier chunks, max over GQA group";
  }
  GqaRule gqa_rule() const override { return GqaRule::max_share; }

  void prepare(const LayerContext& ctx) override {
    const int d = ctx.head_dim, P = ctx.page_size;
    C_ = (p_.shadow_chunk > 0 && P % p_.shadow_chunk == 0) ? p_.shadow_chunk : P;
    const int cpp = P / C_, np = ctx.num_full_pages;
    land_.assign(size_t(np) * ctx.kv_heads * cpp * d, 0.0f);
    outlier_order_.assign(ctx.kv_heads, {});
    std::vector<double> page_cos(size_t(np) * ctx.kv_heads, 1.0);
#pragma omp parallel for schedule(static)
    for (int j = 0; j < np; ++j) {
      for (int h = 0; h < ctx.kv_heads; ++h) {
        double worst = 1.0;
        for (int c = 0; c < cpp; ++c) {
          float* l = landmark(ctx, j, h, c);
          std::vector<double> mean(d, 0.0);
          for (int i = 0; i < C_; ++i) {
            const float* k = ctx.key(int64_t(j) * P + c * C_ + i, h);
            for (int e = 0; e < d; ++e) mean[e] += k[e];
          }
          double mn = 0;
          for (int e = 0; e < d; ++e) {
            mean[e] /= C_;
            l[e] = static_cast<float>(mean[e]);
            mn += mean[e] * mean[e];
          }
          for (int i = 0; i < C_; ++i) {
            const float* k = ctx.key(int64_t(j) * P + c * C_ + i, h);
            double dot = 0, kn = 0;
            for (int e = 0; e < d; ++e) {
              dot += k[e] * mean[e];
              kn += double(k[e]) * k[e];
            }
            const double cs = (kn > 0 && mn > 0) ? dot / std::sqrt(kn * mn) : 1.0;
            worst = std::min(worst, cs);
          }
        }
        page_cos[size_t(j) * ctx.kv_heads + h] = worst;
      }
    }
    for (int h = 0; h < ctx.kv_heads; ++h) {
      std::vector<int>& o = outlier_order_[h];
      o.resize(np);
      std::iota(o.begin(), o.end(), 0);
      std::stable_sort(o.begin(), o.end(), [&](int a, int b) {
        return page_cos[size_t(a) * ctx.kv_heads + h] < page_cos[size_t(b) * ctx.kv_heads + h];
      });
    }
  }

  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int d = ctx.head_dim, cpp = ctx.page_size / C_;
    const double logC = std::log(double(C_));
    score_rows(ctx, head_scores, [&](const float* q, int kvh) {
      return [&, q, kvh](int j) {
        double l[256];
        for (int c = 0; c < cpp; ++c) {
          const float* lm = landmark(ctx, j, kvh, c);
          double dot = 0;
          for (int e = 0; e < d; ++e) dot += double(q[e]) * lm[e];
          l[c] = dot * ctx.scale;
        }
        return logC + log_sum_exp(l, cpp);
      };
    });
  }

  void adjust_group_scores(const LayerContext& ctx, const SelectConfig& cfg,
                           float* group_scores) override {
    if (cfg.budget_tokens >= ctx.tokens) return;
    const int k = cfg.budget_tokens / ctx.page_size;
    const int want = static_cast<int>(std::ceil(p_.shadow_outlier_share * ctx.num_full_pages));
    const int n_out = std::min({want, k / 4, ctx.num_full_pages});
    for (int s = 0; s < ctx.steps; ++s)
      for (int h = 0; h < ctx.kv_heads; ++h)
        for (int i = 0; i < n_out; ++i)
          group_scores[(int64_t(s) * ctx.kv_heads + h) * ctx.num_pages + outlier_order_[h][i]] =
              FLT_MAX;  // forced in (finite, so ties still resolve by page index)
  }

  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    const int C = (p_.shadow_chunk > 0 && ctx.page_size % p_.shadow_chunk == 0) ? p_.shadow_chunk
                                                                                : ctx.page_size;
    const int R = p_.basis_rank > 0 ? p_.basis_rank : ctx.head_dim / 4;
    return double(ctx.page_size / C) * ctx.head_dim * 2.0 +
           double(ctx.head_dim) * R * 2.0 / std::max(1, ctx.num_full_pages);
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    const int C = (p_.shadow_chunk > 0 && ctx.page_size % p_.shadow_chunk == 0) ? p_.shadow_chunk
                                                                                : ctx.page_size;
    return double(ctx.num_full_pages) * (ctx.page_size / C) * ctx.head_dim * 2.0;
  }

 private:
  float* landmark(const LayerContext& ctx, int page, int h, int c) {
    const int cpp = ctx.page_size / C_;
    return land_.data() + ((size_t(page) * ctx.kv_heads + h) * cpp + c) * ctx.head_dim;
  }
  SelectorParams p_;
  int C_ = 8;
  std::vector<float> land_;                      // [pages, kv_heads, chunks/page, d]
  std::vector<std::vector<int>> outlier_order_;  // per KV head: pages, most outlying first
};

}  // namespace

std::unique_ptr<PageSelector> make_shadowkv(const SelectorParams& p) {
  return std::make_unique<ShadowKv>(p);
}

}  // namespace locks::eval

// RocketKV-style selector: per page and channel the keys' min/max (as Quest), but each step
// scores with only the query's top-r channels by |q_c| (r = rocket_dims, default d/4):
//   s_j = scale * sum_{c in top-r(q)} max(q_c M_c, q_c m_c).
// Optional SnapKV-style prefill eviction (rocket_snapkv): from the observation-window
// queries (layer{L}_qobs.npy) each token gets the attention weight summed over the window
// and the GQA group, max-pooled over `snapkv_pool` tokens; pages are ranked by the sum of
// their pooled weights and only the top ceil(snapkv_keep * b / P) pages (plus the pages
// holding the window's own last tokens) stay selectable. Simplification: eviction is at
// page granularity (SnapKV evicts tokens), so the kept cache stays paged like the others.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "locks/error.h"
#include "page_minmax.h"
#include "score_rows.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class Rocket final : public PageSelector {
 public:
  Rocket(const SelectorParams& p, bool snapkv) : p_(p), snapkv_(snapkv) {}
  std::string name() const override { return snapkv_ ? "rocket_snapkv" : "rocket"; }
  std::string description() const override {
    return snapkv_ ? "RocketKV-style: SnapKV page eviction + top-r-dim chunk min/max"
                   : "RocketKV-style: chunk min/max on the top-r query dims";
  }
  bool available(const LayerContext& ctx, std::string* why) const override {
    if (snapkv_ && ctx.obs_steps == 0) {
      if (why) *why = "no observation-window queries (layer{L}_qobs.npy) in the capture";
      return false;
    }
    return true;
  }
  int dims(const LayerContext& ctx) const {
    return p_.rocket_dims > 0 ? p_.rocket_dims : ctx.head_dim / 4;
  }

  void prepare(const LayerContext& ctx) override {
    // An explicit dimension count beyond head_dim is an error, not clamped to head_dim.
    LOCKS_REQUIRE(p_.rocket_dims <= ctx.head_dim, "rocket_dims (--rocket-dims) ", p_.rocket_dims,
                  " exceeds head_dim ", ctx.head_dim);
    mm_.build(ctx);
    if (snapkv_) snap_prepare(ctx);
  }

  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int d = ctx.head_dim, r = dims(ctx);
    score_rows(ctx, head_scores, [&](const float* q, int kvh) {
      std::vector<int> idx(d);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(),
                       [&](int a, int b) { return std::fabs(q[a]) > std::fabs(q[b]); });
      return [&, q, kvh, idx = std::move(idx)](int j) {
        return ctx.scale * channel_bound(q, mm_.min(j, kvh, d), mm_.max(j, kvh, d), idx.data(), r);
      };
    });
  }

  void adjust_group_scores(const LayerContext& ctx, const SelectConfig& cfg,
                           float* group_scores) override {
    if (!snapkv_ || cfg.budget_tokens >= ctx.tokens) return;
    const int P = ctx.page_size, np = ctx.num_full_pages;
    const int keep = std::min<int>(
        np, static_cast<int>(std::ceil(p_.snapkv_keep * cfg.budget_tokens / double(P))));
    // The window's own tokens are the last obs_steps of the prefix: SnapKV keeps them.
    const int first_window_page =
        static_cast<int>(std::max<int64_t>(0, ctx.tokens - ctx.obs_steps) / P);
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int h = 0; h < ctx.kv_heads; ++h) {
      std::vector<char> kept(np, 0);
      for (int i = 0; i < keep; ++i) kept[snap_order_[h][i]] = 1;
      for (int j = first_window_page; j < np; ++j) kept[j] = 1;
      for (int s = 0; s < ctx.steps; ++s)
        for (int j = 0; j < np; ++j)
          if (!kept[j]) group_scores[(int64_t(s) * ctx.kv_heads + h) * ctx.num_pages + j] = ninf;
    }
  }

  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    return 2.0 * ctx.head_dim * 2.0;  // min and max of every channel, bf16
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    // Per KV head: the union of its heads' top-r channels, at most d, min and max, bf16.
    const int ch = std::min(ctx.head_dim, ctx.group() * dims(ctx));
    return double(ctx.num_full_pages) * 2.0 * ch * 2.0;
  }

 private:
  void snap_prepare(const LayerContext& ctx) {
    const int d = ctx.head_dim, P = ctx.page_size, np = ctx.num_full_pages, G = ctx.group();
    const int64_t T = ctx.tokens;
    snap_order_.assign(ctx.kv_heads, {});
    for (int h = 0; h < ctx.kv_heads; ++h) {
      std::vector<double> w(T, 0.0);
      const int nq = ctx.obs_steps * G;
#pragma omp parallel
      {
        std::vector<double> local(T, 0.0), logit(T);
#pragma omp for schedule(static)
        for (int x = 0; x < nq; ++x) {
          const int o = x / G, qh = h * G + x % G;
          const float* q = ctx.q_obs + (int64_t(o) * ctx.q_heads + qh) * d;
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t t = 0; t < T; ++t) {
            const float* k = ctx.key(t, h);
            double dot = 0;
            for (int e = 0; e < d; ++e) dot += double(q[e]) * k[e];
            logit[t] = dot * ctx.scale;
            m = std::max(m, logit[t]);
          }
          double sum = 0;
          for (int64_t t = 0; t < T; ++t) sum += (logit[t] = std::exp(logit[t] - m));
          for (int64_t t = 0; t < T; ++t) local[t] += logit[t] / sum;
        }
#pragma omp critical
        for (int64_t t = 0; t < T; ++t) w[t] += local[t];
      }
      const int half = std::max(0, p_.snapkv_pool / 2);
      std::vector<double> page(np, 0.0);
      for (int j = 0; j < np; ++j) {
        for (int i = 0; i < P; ++i) {
          const int64_t t = int64_t(j) * P + i;
          double mx = 0;
          for (int64_t u = std::max<int64_t>(0, t - half); u <= std::min(T - 1, t + half); ++u)
            mx = std::max(mx, w[u]);
          page[j] += mx;
        }
      }
      std::vector<int>& o = snap_order_[h];
      o.resize(np);
      std::iota(o.begin(), o.end(), 0);
      std::stable_sort(o.begin(), o.end(), [&](int a, int b) { return page[a] > page[b]; });
    }
  }

  SelectorParams p_;
  bool snapkv_;
  PageMinMax mm_;
  std::vector<std::vector<int>> snap_order_;  // per KV head: full pages by pooled weight
};

}  // namespace

std::unique_ptr<PageSelector> make_rocket(const SelectorParams& p, bool snapkv) {
  return std::make_unique<Rocket>(p, snapkv);
}

}  // namespace locks::eval

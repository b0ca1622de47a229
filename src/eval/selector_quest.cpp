// Quest: per page and channel the keys' min m and max M; page score
// scale * sum_c max(q_c M_c, q_c m_c), an upper bound of the page's largest logit.
// Metadata 2 x d values in bf16 per page and KV head (6.25% of bf16 K+V); computed in fp32.
#include <limits>
#include <numeric>

#include "page_minmax.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class Quest final : public PageSelector {
 public:
  std::string name() const override { return "quest"; }
  std::string description() const override { return "Quest: per-page channel min/max upper bound"; }
  void prepare(const LayerContext& ctx) override { mm_.build(ctx); }
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int n = ctx.num_pages, d = ctx.head_dim;
    std::vector<int> all(d);
    std::iota(all.begin(), all.end(), 0);
    const int64_t rows = int64_t(ctx.steps) * ctx.q_heads;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int s = static_cast<int>(r / ctx.q_heads), qh = static_cast<int>(r % ctx.q_heads);
      const int kvh = qh / ctx.group();
      const float* q = ctx.query(s, qh);
      float* out = head_scores + r * n;
      for (int j = 0; j < n; ++j) {
        out[j] =
            j < ctx.num_full_pages
                ? static_cast<float>(ctx.scale * channel_bound(q, mm_.min(j, kvh, d),
                                                               mm_.max(j, kvh, d), all.data(), d))
                : -std::numeric_limits<float>::infinity();
      }
    }
  }
  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    return 2.0 * ctx.head_dim * 2.0;
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return ctx.num_full_pages * metadata_bytes_per_page(ctx);
  }

 private:
  PageMinMax mm_;
};

}  // namespace

std::unique_ptr<PageSelector> make_quest() { return std::make_unique<Quest>(); }

}  // namespace locks::eval

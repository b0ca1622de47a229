// Quest: per page and channel the keys' min m and max M; page score
// scale * sum_c max(q_c M_c, q_c m_c), an upper bound of the page's largest logit.
// Metadata 2 x d values in bf16 per page and KV head (6.25% of bf16 K+V); computed in fp32.
#include <limits>
#include <numeric>

#include "page_minmax.h"
#include "score_rows.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class Quest final : public PageSelector {
 public:
  std::string name() const override { return "quest"; }
  std::string description() const override { return "Quest: per-page channel min/max upper bound"; }
  void prepare(const LayerContext& ctx) override { mm_.build(ctx); }
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int d = ctx.head_dim;
    std::vector<int> all(d);
    std::iota(all.begin(), all.end(), 0);
    score_rows(ctx, head_scores, [&](const float* q, int kvh) {
      return [&, q, kvh](int j) {
        return ctx.scale * channel_bound(q, mm_.min(j, kvh, d), mm_.max(j, kvh, d), all.data(), d);
      };
    });
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

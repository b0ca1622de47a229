// Oracle: pages ranked by their exact attention mass (reads every key). Through the same
// aggregation and selection as every method, it maximises the group-mean recall over the
// free slots: the ceiling for value-blind page selectors under these budget rules.
#include <cmath>
#include <limits>

#include "selectors.h"

namespace locks::eval {
namespace {

class Oracle final : public PageSelector {
 public:
  std::string name() const override { return "oracle"; }
  std::string description() const override { return "Oracle: exact page mass (reads all keys)"; }
  void prepare(const LayerContext&) override {}
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int n = ctx.num_pages, P = ctx.page_size, d = ctx.head_dim;
    const int64_t rows = int64_t(ctx.steps) * ctx.q_heads;
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < rows; ++r) {
      const int s = static_cast<int>(r / ctx.q_heads), qh = static_cast<int>(r % ctx.q_heads);
      const int kvh = qh / ctx.group();
      const float* q = ctx.query(s, qh);
      float* out = head_scores + r * n;
      for (int j = 0; j < n; ++j) {
        if (j >= ctx.num_full_pages) {  // the tail: no score, like every method
          out[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        double logits[256];
        double m = -std::numeric_limits<double>::infinity();
        for (int i = 0; i < P; ++i) {
          const float* k = ctx.key(int64_t(j) * P + i, kvh);
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += double(q[c]) * k[c];
          logits[i] = dot * ctx.scale;
          m = std::max(m, logits[i]);
        }
        double acc = 0;
        for (int i = 0; i < P; ++i) acc += std::exp(logits[i] - m);
        out[j] = static_cast<float>(m + std::log(acc));
      }
    }
  }
  double metadata_bytes_per_page(const LayerContext&) const override { return 0; }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return double(ctx.tokens) * ctx.head_dim * 2.0;  // every key, bf16
  }
};

}  // namespace

std::unique_ptr<PageSelector> make_oracle() { return std::make_unique<Oracle>(); }

}  // namespace locks::eval

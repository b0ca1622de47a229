// Oracle: pages ranked by their exact attention mass (reads every key). Through the same
// aggregation and selection as every method, it maximises the group-mean recall over the
// free slots: the ceiling for value-blind page selectors under these budget rules.
#include <cmath>
#include <limits>

#include "score_rows.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class Oracle final : public PageSelector {
 public:
  std::string name() const override { return "oracle"; }
  std::string description() const override { return "Oracle: exact page mass (reads all keys)"; }
  void prepare(const LayerContext&) override {}
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    const int P = ctx.page_size, d = ctx.head_dim;
    score_rows(ctx, head_scores, [&](const float* q, int kvh) {
      return [&ctx, q, kvh, P, d](int j) {
        double logits[256];
        for (int i = 0; i < P; ++i) {
          const float* k = ctx.key(int64_t(j) * P + i, kvh);
          double dot = 0;
          for (int c = 0; c < d; ++c) dot += double(q[c]) * k[c];
          logits[i] = dot * ctx.scale;
        }
        return log_sum_exp(logits, P);
      };
    });
  }
  double metadata_bytes_per_page(const LayerContext&) const override { return 0; }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return double(ctx.tokens) * ctx.head_dim * 2.0;  // every key, bf16
  }
};

}  // namespace

std::unique_ptr<PageSelector> make_oracle() { return std::make_unique<Oracle>(); }

}  // namespace locks::eval

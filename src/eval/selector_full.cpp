// FullKV: dense attention over every key (the reference every method is measured against).
#include <algorithm>

#include "selectors.h"

namespace locks::eval {
namespace {

class FullKv final : public PageSelector {
 public:
  std::string name() const override { return "full"; }
  std::string description() const override { return "FullKV: every page (reference)"; }
  bool dense() const override { return true; }
  void prepare(const LayerContext&) override {}
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    std::fill(head_scores, head_scores + int64_t(ctx.steps) * ctx.q_heads * ctx.num_pages, 0.0f);
  }
  double metadata_bytes_per_page(const LayerContext&) const override { return 0; }
  double scoring_bytes_per_step(const LayerContext&) const override { return 0; }
};

}  // namespace

std::unique_ptr<PageSelector> make_full() { return std::make_unique<FullKv>(); }

}  // namespace locks::eval

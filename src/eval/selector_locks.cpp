// LOCKS through the harness: summaries built by locks::cpu::summary_build (fp32, or the
// quantized int8 centroid / int4 basis / int8 coefficients), scored by
// locks::cpu::score_pages. Nothing method-specific lives here; it wires locks_core in.
#include <memory>

#include "locks/summary.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class Locks final : public PageSelector {
 public:
  Locks(const SelectorParams& p, bool quantized) : p_(p), quant_(quantized) {}
  std::string name() const override { return quant_ ? "locks_quant" : "locks_fp32"; }
  std::string description() const override {
    return quant_ ? "LOCKS, int8 centroid / int4 basis / int8 coefficients"
                  : "LOCKS, fp32 summaries";
  }
  SummaryLayout layout(const LayerContext& ctx) const {
    return summary_layout_for(ctx.cache.layout, p_.rank,
                              quant_ ? Precision::quant : Precision::fp32);
  }
  void prepare(const LayerContext& ctx) override {
    store_ = std::make_unique<SummaryStore>(layout(ctx));
    std::vector<int32_t> blocks(ctx.num_full_pages);
    for (int j = 0; j < ctx.num_full_pages; ++j) blocks[j] = j;
    if (!blocks.empty())
      cpu::summary_build(ctx.cache, blocks.data(), blocks.size(), store_->view());
  }
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    cpu::score_pages(store_->view(), ctx.batch, ctx.q, ctx.scale, head_scores);
  }
  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    return double(summary_bytes_per_page(layout(ctx)));
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return ctx.num_full_pages * metadata_bytes_per_page(ctx);
  }

 private:
  SelectorParams p_;
  bool quant_;
  std::unique_ptr<SummaryStore> store_;
};

}  // namespace

std::unique_ptr<PageSelector> make_locks(const SelectorParams& p, bool quantized) {
  return std::make_unique<Locks>(p, quantized);
}

}  // namespace locks::eval

// LOCKS through the harness: summaries built by locks::cpu::summary_build (fp32, or the
// quantized int8 centroid / int4 basis / int8 coefficients), scored by
// locks::cpu::score_pages. Nothing method-specific lives here; it wires locks_core in.
// The query-weighted versions (locks_wq, locks_wq_fp32; summary.h) calibrate the weights from
// the capture's observation-window queries (locks::qweight_from_queries), once per layer.
#include <memory>
#include <vector>

#include "locks/summary.h"
#include "selectors.h"

namespace locks::eval {
namespace {

class Locks final : public PageSelector {
 public:
  Locks(const SelectorParams& p, bool quantized, bool weighted)
      : p_(p), quant_(quantized), weighted_(weighted) {}
  std::string name() const override {
    if (weighted_) return quant_ ? "locks_wq" : "locks_wq_fp32";
    return quant_ ? "locks_quant" : "locks_fp32";
  }
  std::string description() const override {
    const std::string w = weighted_ ? ", query-weighted basis" : "";
    return quant_ ? "LOCKS, int8 centroid / int4 basis / int8 coefficients" + w
                  : "LOCKS, fp32 summaries" + w;
  }
  bool available(const LayerContext& ctx, std::string* why) const override {
    if (weighted_ && (ctx.q_obs == nullptr || ctx.obs_steps == 0)) {
      *why = "query-weighted summaries need the observation-window queries (layer*_qobs.npy)";
      return false;
    }
    return PageSelector::available(ctx, why);
  }
  SummaryLayout layout(const LayerContext& ctx) const {
    return summary_layout_for(ctx.cache.layout, p_.rank,
                              quant_ ? Precision::quant : Precision::fp32, p_.basis_group);
  }
  void prepare(const LayerContext& ctx) override {
    store_ = std::make_unique<SummaryStore>(layout(ctx));
    qweight_.clear();
    if (weighted_) {
      qweight_.resize(size_t(ctx.kv_heads) * ctx.head_dim);
      qweight_from_queries(ctx.q_obs, ctx.obs_steps, ctx.q_heads, ctx.kv_heads, ctx.head_dim,
                           qweight_.data(), p_.qweight_floor);
    }
    std::vector<int32_t> blocks(ctx.num_full_pages);
    for (int j = 0; j < ctx.num_full_pages; ++j) blocks[j] = j;
    if (!blocks.empty()) cpu::summary_build(ctx.cache, blocks.data(), blocks.size(), view());
  }
  void score(const LayerContext& ctx, const SelectConfig&, float* head_scores) override {
    cpu::score_pages(view(), ctx.batch, ctx.q, ctx.scale, head_scores);
  }
  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    return double(summary_bytes_per_page(layout(ctx)));
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return ctx.num_full_pages * metadata_bytes_per_page(ctx);
  }

 private:
  SummaryView view() const {
    SummaryView v = store_->view();
    v.qweight = qweight_.empty() ? nullptr : qweight_.data();
    return v;
  }
  SelectorParams p_;
  bool quant_, weighted_;
  std::unique_ptr<SummaryStore> store_;
  std::vector<float> qweight_;  // [H, d] (query-weighted versions)
};

}  // namespace

std::unique_ptr<PageSelector> make_locks(const SelectorParams& p, bool quantized, bool weighted) {
  return std::make_unique<Locks>(p, quantized, weighted);
}

}  // namespace locks::eval

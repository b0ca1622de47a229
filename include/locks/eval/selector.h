// The interface every page selector of the evaluation harness implements.
//
// One path for every method, so that budgets mean the same thing everywhere:
//   prepare(layer)                once per layer (summaries, bases, landmarks, ...)
//   score(layer, cfg) -> head scores [steps, q_heads, pages], -inf at the tail page
//   GQA aggregation by the selector's rule -> group scores [steps, kv_heads, pages]
//   adjust_group_scores(...)      optional: force pages in (outliers) or out (evicted)
//   locks::cpu::select_pages      the same budget / tail / sink / recent / ties for all
//   locks::cpu::decode_attention_sparse over the selection; locks::attention_mass_recall.
// Scores are meant as estimated log page masses (log of the unnormalised attention mass);
// share-averaging treats them that way.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "locks/eval/layer_setup.h"
#include "locks/select.h"

namespace locks::eval {

enum class GqaRule : int {
  share_average = 0,  // locks::cpu::aggregate_gqa: log of the group-mean mass share
  max_share = 1,      // log of the group-max mass share (ShadowKV's max over the group)
};
const char* gqa_rule_name(GqaRule r);

class PageSelector {
 public:
  virtual ~PageSelector() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual GqaRule gqa_rule() const { return GqaRule::share_average; }
  // FullKV: selects every page whatever the budget.
  virtual bool dense() const { return false; }
  // False (with the reason) when the layer lacks what the method needs (e.g. q_obs).
  virtual bool available(const LayerContext& ctx, std::string* why) const;

  virtual void prepare(const LayerContext& ctx) = 0;
  // head_scores: [steps, q_heads, num_pages] float32; -inf for the tail page.
  virtual void score(const LayerContext& ctx, const SelectConfig& cfg, float* head_scores) = 0;
  // group_scores: [steps, kv_heads, num_pages] after aggregation; default leaves them.
  virtual void adjust_group_scores(const LayerContext& ctx, const SelectConfig& cfg,
                                   float* group_scores);
  // Optional, after selection: may drop selected pages (an adaptive budget attends fewer
  // than the budget allows); pages stay ascending, counts shrink. Default keeps them.
  virtual void adjust_selection(const LayerContext&, const SelectConfig&, const float*,
                                const Selection&) {}

  // Metadata stored per full page per KV head at its stored precision, amortised shared
  // parts included (bytes). Share of bf16 K+V = this / (2 * P * d * 2).
  virtual double metadata_bytes_per_page(const LayerContext& ctx) const = 0;
  // Bytes read per decode step per KV head to score every page (metadata or keys).
  virtual double scoring_bytes_per_step(const LayerContext& ctx) const = 0;
  // The same after score() ran at this budget: a selector whose reads depend on the budget
  // (the two-level LOCKS reads page summaries only inside the groups it keeps) overrides it.
  virtual double scoring_bytes_at(const LayerContext& ctx, const SelectConfig&) const {
    return scoring_bytes_per_step(ctx);
  }
};

struct SelectorParams {
  int rank = 8;  // LOCKS summary rank r
  // LOCKS int4 summaries: dims per basis scale; 0 = the library's default_basis_group(d)
  int basis_group = 0;
  int basis_rank = 0;   // shared basis rank R; 0 = head_dim / 4
  int rocket_dims = 0;  // RocketKV: query dimensions used per head; 0 = head_dim / 4
  // locks_wq: floor of the query weights' power, as a share of its mean over channels
  // (locks::qweight_from_queries); 1 = every channel weighted alike (the plain summaries).
  double qweight_floor = 1e-2;
  int shadow_chunk = 8;                    // ShadowKV landmark chunk (tokens)
  double shadow_outlier_share = 1.0 / 64;  // share of pages kept as outliers (cap: k / 4)
  double snapkv_keep = 4.0;                // SnapKV eviction keeps ceil(keep * budget / P) pages
  int snapkv_pool = 7;                     // SnapKV max-pool kernel (tokens)
};

// Names in evaluation order: full, oracle, quest, shared_proj, shadowkv, rocket,
// rocket_snapkv, locks_fp32, locks_quant.
std::vector<std::string> selector_names();
// Throws locks::Error on an unknown name.
std::unique_ptr<PageSelector> make_selector(const std::string& name, const SelectorParams& p);

// Fills group_scores [steps, kv_heads, pages] from head_scores by the given rule.
void aggregate_group_scores(GqaRule rule, const LayerContext& ctx, const float* head_scores,
                            float* group_scores);

inline double bf16_kv_bytes_per_page(const LayerContext& ctx) {
  return 2.0 * ctx.page_size * ctx.head_dim * 2.0;
}

}  // namespace locks::eval

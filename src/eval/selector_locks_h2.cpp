// Two-level LOCKS through the harness (include/locks/super_summary.h): super-page summaries
// scored first, page summaries read only inside the kept groups, then the common aggregation
// and selection. Every step is a library op (cpu::super_build, super_score, select_groups,
// score_pages_masked); nothing method-specific is computed here.
//
// Name: "locks_h2" (the defaults: the chosen design, docs/study_hierarchical.md) or "h2"
// followed by '-'-separated tokens changing them, any order:
//   sN     pages per super-page S (default 32)
//   rN     rank R of the group basis (default 8)
//   aX     alpha: kept groups m = max(min, ceil(alpha * floor(b/P) / S)) (default 40: 1.25
//          groups per budget page slot at S 32; "a1.5")
//   mN     minimum kept groups (default 4)
//   fN     flat fallback below N complete groups (default 8)
//   kN     always keep the first N groups (default 1: the attention sink's group)
//   gX     gamma, weight of the centroid residual radius (default 0)
//   max    group score = best page estimate (default: LSE of the page estimates)
//   cen    centroid estimate only: no per-page extent stored or used (default: extent, the
//          min/max of the page's key coefficients in the group basis)
//   mix    mixed page estimate: log(P e^{centroid} + e^{extent bound}) (super_summary.h)
//   p32    fp32 page summaries at level 2 (default: the int4 layout of locks_quant)
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "locks/error.h"
#include "locks/super_summary.h"
#include "selectors.h"

namespace locks::eval {
namespace {

struct H2Spec {
  int group_pages = 32, rank = 8;
  TwoLevelConfig cfg;
  bool fp32_pages = false;
};

double parse_num(const std::string& s, const std::string& name) {
  LOCKS_REQUIRE(!s.empty() && s.find_first_not_of("0123456789.") == std::string::npos, "method ",
                name, ": bad number '", s, "'");
  return std::stod(s);
}

H2Spec parse(const std::string& name) {
  H2Spec v;
  if (name == "locks_h2") return v;
  LOCKS_REQUIRE(name.rfind("h2", 0) == 0, "not a two-level LOCKS name: ", name);
  std::stringstream ss(name.substr(2));
  std::string t;
  while (std::getline(ss, t, '-')) {
    if (t.empty()) continue;
    const std::string rest = t.substr(1);
    if (t == "max")
      v.cfg.agg = GroupAgg::max;
    else if (t == "cen")
      v.cfg.use_extent = false;
    else if (t == "mix")
      v.cfg.mix = true;
    else if (t == "p32")
      v.fp32_pages = true;
    else if (t[0] == 's')
      v.group_pages = int(parse_num(rest, name));
    else if (t[0] == 'r')
      v.rank = int(parse_num(rest, name));
    else if (t[0] == 'a')
      v.cfg.alpha = parse_num(rest, name);
    else if (t[0] == 'm')
      v.cfg.min_groups = int(parse_num(rest, name));
    else if (t[0] == 'f')
      v.cfg.flat_below_groups = int(parse_num(rest, name));
    else if (t[0] == 'k')
      v.cfg.first_groups = int(parse_num(rest, name));
    else if (t[0] == 'g')
      v.cfg.gamma = parse_num(rest, name);
    else
      LOCKS_REQUIRE(false, "method ", name, ": unknown token '", t,
                    "' (see selector_locks_h2.cpp)");
  }
  validate_two_level(v.cfg);
  return v;
}

class LocksH2 final : public PageSelector {
 public:
  LocksH2(std::string name, const SelectorParams& p) : name_(std::move(name)), p_(p) {
    v_ = parse(name_);
  }
  std::string name() const override { return name_; }
  std::string description() const override {
    return "two-level LOCKS (super-pages of " + std::to_string(v_.group_pages) + " pages)";
  }
  bool available(const LayerContext& ctx, std::string* why) const override {
    if (v_.rank > ctx.head_dim || v_.rank > 32 || v_.group_pages < 2 || v_.group_pages > 256) {
      *why = "super rank or group size out of range";
      return false;
    }
    return true;
  }
  SummaryLayout page_layout(const LayerContext& ctx) const {
    return summary_layout_for(ctx.cache.layout, p_.rank,
                              v_.fp32_pages ? Precision::fp32 : Precision::quant, p_.basis_group);
  }
  SuperLayout super_layout(const LayerContext& ctx) const {
    SuperLayout l;
    l.num_slots = std::max(1, ctx.num_full_pages / v_.group_pages);
    l.group_pages = v_.group_pages;
    l.page_size = ctx.page_size;
    l.num_kv_heads = ctx.kv_heads;
    l.head_dim = ctx.head_dim;
    l.rank = v_.rank;
    l.extent = v_.cfg.use_extent;
    return l;
  }

  void prepare(const LayerContext& ctx) override {
    pages_ = std::make_unique<SummaryStore>(page_layout(ctx));
    std::vector<int32_t> blocks(ctx.num_full_pages);
    for (int j = 0; j < ctx.num_full_pages; ++j) blocks[j] = j;
    if (!blocks.empty())
      cpu::summary_build(ctx.cache, blocks.data(), blocks.size(), pages_->view());
    supers_ = std::make_unique<SuperStore>(super_layout(ctx));
    const int S = v_.group_pages, C = ctx.num_full_pages / S;
    std::vector<int32_t> slots(C);
    for (int j = 0; j < C; ++j) slots[j] = j;
    if (C > 0) cpu::super_build(ctx.cache, blocks.data(), slots.data(), C, supers_->view());
    max_groups_ = (ctx.num_pages + S - 1) / S;
    table_.assign(size_t(ctx.steps) * max_groups_, 0);
    for (int s = 0; s < ctx.steps; ++s)
      for (int j = 0; j < C; ++j) table_[size_t(s) * max_groups_ + j] = j;
  }

  void score(const LayerContext& ctx, const SelectConfig& cfg, float* head_scores) override {
    const SuperTableView t{table_.data(), max_groups_, max_groups_};
    std::vector<float> gs(size_t(ctx.steps) * ctx.q_heads * max_groups_);
    cpu::super_score(supers_->view(), t, ctx.batch, ctx.q, ctx.scale, v_.cfg, gs.data());
    std::vector<uint8_t> mask(size_t(ctx.steps) * ctx.kv_heads * ctx.num_pages);
    cpu::select_groups(gs.data(), t, ctx.batch, ctx.q_heads, ctx.kv_heads, ctx.page_size,
                       v_.group_pages, cfg, v_.cfg, mask.data());
    cpu::score_pages_masked(pages_->view(), ctx.batch, ctx.q, ctx.scale, mask.data(), head_scores);
    // Bytes: a fallback row reads every page summary; otherwise level 1 (every complete
    // group) plus the page summaries of the masked full pages.
    const double page_b = double(summary_bytes_per_page(page_layout(ctx)));
    const int C = ctx.num_full_pages / v_.group_pages;
    const double level1 = C * double(super_bytes_per_group(super_layout(ctx)));
    const bool flat = groups_kept(v_.cfg, cfg, ctx.page_size, v_.group_pages, ctx.tokens) < 0;
    double total = 0;
    const int64_t rows = int64_t(ctx.steps) * ctx.kv_heads;
    for (int64_t r = 0; r < rows; ++r) {
      int n = 0;
      for (int j = 0; j < ctx.num_full_pages; ++j) n += mask[size_t(r) * ctx.num_pages + j];
      total += (flat ? 0.0 : level1) + n * page_b;
    }
    last_bytes_ = rows > 0 ? total / rows : 0.0;
  }

  double metadata_bytes_per_page(const LayerContext& ctx) const override {
    return double(summary_bytes_per_page(page_layout(ctx))) +
           super_bytes_per_page(super_layout(ctx));
  }
  double scoring_bytes_per_step(const LayerContext& ctx) const override {
    return ctx.num_full_pages * double(summary_bytes_per_page(page_layout(ctx)));
  }
  double scoring_bytes_at(const LayerContext&, const SelectConfig&) const override {
    return last_bytes_;
  }

 private:
  std::string name_;
  SelectorParams p_;
  H2Spec v_;
  std::unique_ptr<SummaryStore> pages_;
  std::unique_ptr<SuperStore> supers_;
  std::vector<int32_t> table_;
  int max_groups_ = 0;
  double last_bytes_ = 0;
};

}  // namespace

std::unique_ptr<PageSelector> make_locks_h2(const std::string& name, const SelectorParams& p) {
  return std::make_unique<LocksH2>(name, p);
}

}  // namespace locks::eval

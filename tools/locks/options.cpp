#include "options.h"

#include <limits>

#include "locks/error.h"
#include "locks/kv_cache.h"
#include "usage.h"

namespace locks::cli {
namespace {

constexpr long long kMaxInt32 = std::numeric_limits<int32_t>::max();

}  // namespace

void check_rank_and_budget(int rank, int page_size, const SelectConfig& select) {
  if (rank >= page_size)
    throw UsageError("--rank (" + std::to_string(rank) + ") must be smaller than --page-size (" +
                     std::to_string(page_size) + ")");
  try {
    validate_select(select, page_size);
  } catch (const Error& e) {
    throw UsageError(std::string("budget too small for the options: ") + e.what());
  }
}

EvalOptions parse_eval_options(const std::vector<std::string>& args) {
  const Args o(
      args,
      {"--capture", "--out", "--budgets", "--methods", "--page-size", "--rank", "--basis-rank",
       "--rocket-dims", "--sink", "--recent", "--snapkv-keep", "--outlier-share", "--qweight-floor",
       "--title", "--tau", "--floor-pages", "--basis-group"},
      {"--no-plots", "--per-query", "--force"});
  EvalOptions e;
  eval::EvalConfig& cfg = e.cfg;
  e.capture = o.required("--capture");
  e.out = o.required("--out");
  e.title = o.str("--title", "");
  e.plots = !o.has("--no-plots");
  e.per_query = o.has("--per-query");
  e.force = o.has("--force");
  if (o.has("--budgets")) {
    cfg.budgets.clear();
    for (const auto& b : split_list("--budgets", o.str("--budgets", "")))
      cfg.budgets.push_back(static_cast<int>(parse_integer("--budgets", b, 1, 1 << 30)));
  }
  if (o.has("--methods")) cfg.methods = split_list("--methods", o.str("--methods", ""));
  cfg.page_size = static_cast<int>(o.integer("--page-size", 16, 2, 256));
  cfg.sink_pages = static_cast<int>(o.integer("--sink", 0, 0, 1 << 20));
  cfg.recent_pages = static_cast<int>(o.integer("--recent", 0, 0, 1 << 20));
  cfg.tau = static_cast<float>(o.real("--tau", 0.0, 0.0, 1.0));
  cfg.floor_pages = static_cast<int>(o.integer("--floor-pages", 1, 0, 1 << 20));
  cfg.params.rank = static_cast<int>(o.integer("--rank", 8, 1, 255));
  cfg.params.basis_rank = static_cast<int>(o.integer("--basis-rank", 0, 0, 256));
  cfg.params.basis_group = static_cast<int>(o.integer("--basis-group", 0, 0, 256));
  cfg.params.rocket_dims = static_cast<int>(o.integer("--rocket-dims", 0, 0, 256));
  cfg.params.snapkv_keep = o.real("--snapkv-keep", cfg.params.snapkv_keep, 1.0, 1e6);
  cfg.params.shadow_outlier_share =
      o.real("--outlier-share", cfg.params.shadow_outlier_share, 0.0, 0.5);
  cfg.params.qweight_floor = o.real("--qweight-floor", cfg.params.qweight_floor, 1e-6, 1.0);
  for (int b : cfg.budgets)
    check_rank_and_budget(cfg.params.rank, cfg.page_size,
                          {b, cfg.sink_pages, cfg.recent_pages, cfg.tau, cfg.floor_pages});
  return e;
}

SelectOptions parse_select_options(const std::vector<std::string>& args) {
  const Args o(args,
               {"--keys", "--values", "--query", "--budget", "--page-size", "--rank", "--precision",
                "--sink-pages", "--recent-pages", "--tau", "--floor-pages"},
               {"--json"});
  SelectOptions s;
  s.keys = o.required("--keys");
  s.values = o.required("--values");
  s.query = o.required("--query");
  s.select.budget_tokens = static_cast<int>(o.integer("--budget", 2048, 1, 1 << 30));
  s.page_size = static_cast<int>(o.integer("--page-size", 16, 2, 256));
  s.rank = static_cast<int>(o.integer("--rank", 8, 1, 255));
  s.select.sink_pages = static_cast<int>(o.integer("--sink-pages", 0, 0, 1 << 24));
  s.select.recent_pages = static_cast<int>(o.integer("--recent-pages", 0, 0, 1 << 24));
  s.select.tau = static_cast<float>(o.real("--tau", 0.0, 0.0, 1.0));
  s.select.floor_pages = static_cast<int>(o.integer("--floor-pages", 1, 0, 1 << 24));
  s.precision_name = o.str("--precision", "fp32");
  if (s.precision_name != "fp32" && s.precision_name != "int4")
    throw UsageError("--precision must be fp32 or int4, got '" + s.precision_name + "'");
  s.precision = s.precision_name == "fp32" ? Precision::fp32 : Precision::quant;
  s.json = o.has("--json");
  check_rank_and_budget(s.rank, s.page_size, s.select);
  return s;
}

SynthOptions parse_synth_options(const std::vector<std::string>& args) {
  const Args o(args,
               {"--kind", "--out", "--tokens", "--kv-heads", "--q-heads", "--head-dim",
                "--page-size", "--steps", "--obs-window", "--seed"},
               {"--force"});
  SynthOptions s;
  SynthConfig& c = s.synth;
  const std::string kind = o.required("--kind");
  try {
    c.kind = synth_from_name(kind);
  } catch (const Error&) {
    throw UsageError("--kind must be gaussian, local_lowrank, blind_spot or needles, got '" + kind +
                     "'");
  }
  s.out = o.required("--out");
  s.force = o.has("--force");
  c.tokens = o.integer("--tokens", 16384, 1, kMaxInt32);
  c.num_kv_heads = static_cast<int>(o.integer("--kv-heads", 2, 1, 1024));
  c.num_q_heads = static_cast<int>(o.integer("--q-heads", 8, 1, 4096));
  c.head_dim = static_cast<int>(o.integer("--head-dim", 128, 16, locks::kMaxHeadDim));
  c.page_size = static_cast<int>(o.integer("--page-size", 16, 2, 256));
  s.steps = o.integer("--steps", 4, 1, 1 << 16);
  s.obs_window = o.integer("--obs-window", 16, 0, 1 << 16);
  s.seed = o.integer("--seed", 0, 0, (1LL << 62));
  if (c.num_q_heads % c.num_kv_heads != 0)
    throw UsageError("--q-heads (" + std::to_string(c.num_q_heads) +
                     ") must be a multiple of --kv-heads (" + std::to_string(c.num_kv_heads) + ")");
  c.seed = static_cast<uint64_t>(s.seed);
  // The generator draws every query i.i.d. from one distribution (its own stream), so the
  // first `steps` are the decode queries and the rest the observation window.
  c.steps = static_cast<int>(s.steps + s.obs_window);
  return s;
}

}  // namespace locks::cli

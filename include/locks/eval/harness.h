// The evaluation harness: runs page selectors side by side on the same layer data, budgets
// and metrics, and aggregates the per-(layer, query head, step) metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "locks/eval/capture.h"
#include "locks/eval/selector.h"
#include "locks/select.h"

namespace locks::eval {

// Everything one selector produced on one layer at one budget.
struct MethodRun {
  SelectConfig cfg;
  std::vector<float> head_scores;   // [steps, q_heads, pages]
  std::vector<float> group_scores;  // [steps, kv_heads, pages]
  std::vector<int32_t> pages, counts;
  Selection sel;               // points into pages / counts
  std::vector<float> out;      // [steps, q_heads, head_dim]
  std::vector<double> recall;  // [steps, q_heads]
};
// Runs the common path (score -> aggregate -> adjust -> select -> attend -> recall).
// prepare() must have been called on this layer. cfg.budget_tokens >= tokens (or a dense
// selector) selects every page.
MethodRun run_selector(PageSelector& sel, const LayerContext& ctx, const SelectConfig& cfg);

// Tokens attended (selected pages, valid tokens only) for (step, kv head).
int64_t attended_tokens(const LayerContext& ctx, const Selection& sel, int step, int kv_head);

struct QueryMetrics {
  std::string method;
  int budget = 0;
  int layer = 0;
  int step = 0;
  int q_head = 0;
  double recall = 0, rel_l2 = 0, cosine = 0;
};

// Per (method, budget, layer, step, KV head): what was read.
struct StepRecord {
  std::string method;
  int budget = 0;
  int layer = 0;
  int step = 0;
  int kv_head = 0;
  double attended = 0;        // tokens attended
  double bytes = 0;           // scoring bytes + attended tokens' K+V in bf16
  double dense_bytes = 0;     // every token's K+V in bf16
  double metadata_share = 0;  // metadata bytes per page / bf16 K+V bytes per page
};

// Aggregate over all (layer, step, query head) of one (method, budget).
struct Aggregate {
  std::string method;
  int budget = 0;
  int64_t n = 0;
  double recall_mean = 0, recall_p5 = 0, recall_min = 0;
  double err_mean = 0, err_p95 = 0, err_max = 0;  // relative L2 vs FullKV (worst = max)
  double cos_mean = 0, cos_p5 = 0, cos_min = 0;
  double attended_mean = 0;   // tokens attended per (step, KV head)
  double bytes_per_step = 0;  // per KV head per layer: scoring + selected K+V (bf16)
  double bytes_vs_full = 0;   // bytes_per_step / dense K+V bytes
  double metadata_share = 0;  // metadata bytes / bf16 K+V, e.g. 0.0625
};

struct EvalConfig {
  std::vector<int> budgets{64, 128, 256, 512, 1024, 2048};
  std::vector<std::string> methods;  // empty: every selector
  int page_size = 16;
  int sink_pages = 0;
  int recent_pages = 0;
  float tau = 0.0f;     // adaptive budget for every selector's selection (select.h); 0 = fixed
  int floor_pages = 1;  // its floor
  SelectorParams params;
  std::function<void(const std::string&)> progress;  // optional progress lines
};

struct EvalResult {
  CaptureMeta meta;
  EvalConfig cfg;
  std::vector<std::string> methods;  // evaluated, in order
  std::vector<QueryMetrics> per_query;
  std::vector<StepRecord> per_step;
  std::vector<Aggregate> table;    // method-major, budgets ascending (aggregate())
  std::vector<std::string> notes;  // skipped methods, substitutions, etc.
};

// Evaluates one in-memory layer for result.methods (used by run_eval and the tests):
// appends per_query and per_step records; a method unavailable on this layer adds a note.
void eval_layer(const LayerContext& ctx, int layer, const EvalConfig& cfg, EvalResult& result);
// Fills result.table from the records.
void aggregate(EvalResult& result);
// Reads a capture directory and evaluates every layer.
EvalResult run_eval(const std::string& capture_dir, const EvalConfig& cfg);

// Percentile with linear interpolation between order statistics (numpy's default);
// p in [0, 100]. Throws on an empty input.
double percentile(std::vector<double> v, double p);

}  // namespace locks::eval

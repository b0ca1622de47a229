// The evaluation harness: every selector through one path (see selector.h), metrics per
// (layer, step, query head), aggregates per (method, budget).
#include "locks/eval/harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <sstream>

#include "locks/attention.h"
#include "locks/error.h"
#include "locks/metrics.h"

namespace locks::eval {

MethodRun run_selector(PageSelector& selector, const LayerContext& ctx, const SelectConfig& cfg) {
  MethodRun r;
  const int n = ctx.num_pages;
  r.cfg = cfg;
  if (selector.dense() || cfg.budget_tokens >= ctx.tokens)
    r.cfg.budget_tokens = static_cast<int>(std::max<int64_t>(cfg.budget_tokens, ctx.tokens));
  validate_select(r.cfg, ctx.page_size);
  r.head_scores.resize(size_t(ctx.steps) * ctx.q_heads * n);
  r.group_scores.resize(size_t(ctx.steps) * ctx.kv_heads * n);
  selector.score(ctx, r.cfg, r.head_scores.data());
  aggregate_group_scores(selector.gqa_rule(), ctx, r.head_scores.data(), r.group_scores.data());
  selector.adjust_group_scores(ctx, r.cfg, r.group_scores.data());

  const int cap = select_capacity(r.cfg, ctx.page_size, n);
  r.pages.assign(size_t(ctx.steps) * ctx.kv_heads * cap, -1);
  r.counts.assign(size_t(ctx.steps) * ctx.kv_heads, 0);
  r.sel = {r.pages.data(), r.counts.data(), cap};
  cpu::select_pages(r.group_scores.data(), ctx.batch, ctx.kv_heads, ctx.page_size, r.cfg, r.sel);
  selector.adjust_selection(ctx, r.cfg, r.group_scores.data(), r.sel);

  r.out.assign(size_t(ctx.steps) * ctx.q_heads * ctx.head_dim, 0.0f);
  cpu::decode_attention_sparse(ctx.cache, ctx.batch, ctx.q, ctx.scale, r.sel,
                               {r.out.data(), nullptr});
  r.recall.assign(size_t(ctx.steps) * ctx.q_heads, 0.0);
  attention_mass_recall(ctx.cache, ctx.batch, ctx.q, ctx.scale, r.sel, r.recall.data());
  return r;
}

int64_t attended_tokens(const LayerContext& ctx, const Selection& sel, int step, int kv_head) {
  const int64_t row = int64_t(step) * ctx.kv_heads + kv_head;
  int64_t total = 0;
  for (int i = 0; i < sel.counts[row]; ++i)
    total += ctx.tokens_in_page(sel.pages[row * sel.capacity + i]);
  return total;
}

void eval_layer(const LayerContext& ctx, int layer, const EvalConfig& cfg, EvalResult& result) {
  using clock = std::chrono::steady_clock;
  auto say = [&](const std::string& s) {
    if (cfg.progress) cfg.progress(s);
  };
  const int d = ctx.head_dim;
  std::vector<float> ref(size_t(ctx.steps) * ctx.q_heads * d);
  cpu::decode_attention_dense(ctx.cache, ctx.batch, ctx.q, ctx.scale, {ref.data(), nullptr});
  const double dense_bytes = double(ctx.tokens) * d * 2.0 * 2.0;

  for (const std::string& name : result.methods) {
    auto selector = make_selector(name, cfg.params);
    std::string why;
    if (!selector->available(ctx, &why)) {
      result.notes.push_back(name + " skipped on layer " + std::to_string(layer) + ": " + why);
      say("layer " + std::to_string(layer) + ": " + name + " skipped (" + why + ")");
      continue;
    }
    const auto t0 = clock::now();
    selector->prepare(ctx);
    const double meta_share = selector->metadata_bytes_per_page(ctx) / bf16_kv_bytes_per_page(ctx);
    for (int b : cfg.budgets) {
      SelectConfig sc;
      sc.budget_tokens = b;
      sc.sink_pages = cfg.sink_pages;
      sc.recent_pages = cfg.recent_pages;
      sc.tau = cfg.tau;
      sc.floor_pages = cfg.floor_pages;
      MethodRun run = run_selector(*selector, ctx, sc);
      const double scoring = selector->scoring_bytes_at(ctx, sc);
      for (int s = 0; s < ctx.steps; ++s) {
        for (int h = 0; h < ctx.q_heads; ++h) {
          const size_t o = (size_t(s) * ctx.q_heads + h) * d;
          QueryMetrics m;
          m.method = name;
          m.budget = b;
          m.layer = layer;
          m.step = s;
          m.q_head = h;
          m.recall = run.recall[size_t(s) * ctx.q_heads + h];
          m.rel_l2 = relative_l2(run.out.data() + o, ref.data() + o, d);
          m.cosine = cosine_similarity(run.out.data() + o, ref.data() + o, d);
          result.per_query.push_back(m);
        }
        for (int g = 0; g < ctx.kv_heads; ++g) {
          StepRecord rec;
          rec.method = name;
          rec.budget = b;
          rec.layer = layer;
          rec.step = s;
          rec.kv_head = g;
          rec.attended = double(attended_tokens(ctx, run.sel, s, g));
          const bool dense = selector->dense() || b >= ctx.tokens;
          rec.bytes = (dense ? 0.0 : scoring) + rec.attended * d * 2.0 * 2.0;
          rec.dense_bytes = dense_bytes;
          rec.metadata_share = meta_share;
          result.per_step.push_back(rec);
        }
      }
    }
    const double secs = std::chrono::duration<double>(clock::now() - t0).count();
    std::ostringstream os;
    os << "layer " << layer << ": " << name << " done in " << secs << " s";
    say(os.str());
  }
}

double percentile(std::vector<double> v, double p) {
  LOCKS_REQUIRE(!v.empty(), "percentile of an empty set");
  LOCKS_REQUIRE(p >= 0 && p <= 100, "percentile p must be in [0, 100], got ", p);
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

void aggregate(EvalResult& result) {
  result.table.clear();
  std::map<std::pair<std::string, int>, std::vector<const QueryMetrics*>> q;
  std::map<std::pair<std::string, int>, std::vector<const StepRecord*>> st;
  for (const auto& m : result.per_query) q[{m.method, m.budget}].push_back(&m);
  for (const auto& s : result.per_step) st[{s.method, s.budget}].push_back(&s);
  for (const std::string& name : result.methods) {
    for (int b : result.cfg.budgets) {
      auto it = q.find({name, b});
      if (it == q.end()) continue;
      Aggregate a;
      a.method = name;
      a.budget = b;
      std::vector<double> rec, err, cs;
      for (const QueryMetrics* m : it->second) {
        rec.push_back(m->recall);
        err.push_back(m->rel_l2);
        cs.push_back(m->cosine);
      }
      a.n = static_cast<int64_t>(rec.size());
      auto mean = [](const std::vector<double>& v) {
        double s = 0;
        for (double x : v) s += x;
        return s / double(v.size());
      };
      a.recall_mean = mean(rec);
      a.recall_p5 = percentile(rec, 5);
      a.recall_min = *std::min_element(rec.begin(), rec.end());
      a.err_mean = mean(err);
      a.err_p95 = percentile(err, 95);
      a.err_max = *std::max_element(err.begin(), err.end());
      a.cos_mean = mean(cs);
      a.cos_p5 = percentile(cs, 5);
      a.cos_min = *std::min_element(cs.begin(), cs.end());
      double att = 0, bytes = 0, dense = 0, meta = 0;
      const auto& steps = st[{name, b}];
      for (const StepRecord* s : steps) {
        att += s->attended;
        bytes += s->bytes;
        dense += s->dense_bytes;
        meta += s->metadata_share;
      }
      const double ns = std::max<size_t>(1, steps.size());
      a.attended_mean = att / ns;
      a.bytes_per_step = bytes / ns;
      a.bytes_vs_full = dense > 0 ? bytes / dense : 0;
      a.metadata_share = meta / ns;
      result.table.push_back(a);
    }
  }
}

EvalResult run_eval(const std::string& capture_dir, const EvalConfig& cfg_in) {
  EvalResult result;
  result.cfg = cfg_in;
  EvalConfig& cfg = result.cfg;
  LOCKS_REQUIRE(!cfg.budgets.empty(), "no budgets given");
  for (int b : cfg.budgets) LOCKS_REQUIRE(b >= 1, "budgets must be >= 1 token, got ", b);
  std::sort(cfg.budgets.begin(), cfg.budgets.end());
  cfg.budgets.erase(std::unique(cfg.budgets.begin(), cfg.budgets.end()), cfg.budgets.end());
  result.methods = cfg.methods.empty() ? selector_names() : cfg.methods;
  for (const auto& m : result.methods) make_selector(m, cfg.params);  // unknown names throw
  for (int b : cfg.budgets) {
    SelectConfig sc{b, cfg.sink_pages, cfg.recent_pages, cfg.tau, cfg.floor_pages};
    validate_select(sc, cfg.page_size);
  }
  result.meta = read_capture_meta(capture_dir);
  const CaptureMeta& m = result.meta;
  check_capture_files(capture_dir, m);
  if (m.positional_encoding != "none" && m.keys == "pre_rope")
    result.notes.push_back(
        "keys are pre-RoPE while the model uses " + m.positional_encoding +
        ": selection is scored on the keys as given, which is not what attention sees");
  for (int layer : m.layers) {
    if (cfg.progress) cfg.progress("loading layer " + std::to_string(layer));
    LayerCapture c = load_capture_layer(capture_dir, m, layer);
    if (!c.k_prerope.empty() && layer == m.layers.front())
      result.notes.push_back(
          "layer*_k_prerope.npy present: validated, not used (selection scores use the keys "
          "attention sees; the shared bases are taken from them)");
    LayerSetup setup(c.k.data(), c.v.data(), m.tokens, m.kv_heads, m.head_dim, c.q.data(),
                     static_cast<int>(m.steps), m.q_heads, cfg.page_size,
                     c.q_obs.empty() ? nullptr : c.q_obs.data(), static_cast<int>(c.obs_steps));
    eval_layer(setup.context(), layer, cfg, result);
  }
  aggregate(result);
  std::vector<std::string> notes;  // one line per distinct note, first-seen order
  for (auto& n : result.notes)
    if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
  result.notes = std::move(notes);
  return result;
}

}  // namespace locks::eval

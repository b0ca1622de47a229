// Outputs of `locks eval`: markdown (pivot tables + the full table), CSV, JSON, and PNG
// plots drawn by running gnuplot on a generated script (gnuplot is an external program, not
// a library dependency: without it the other outputs are still written). gnuplot is run from
// an argument vector in the output folder (run_program.h): never through a shell. Every file
// is written whole or the call throws (locks/io/files.h).
#include "locks/eval/report.h"

#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>

#include "locks/error.h"
#include "locks/io/files.h"
#include "run_program.h"

namespace locks::eval {
namespace {

namespace fs = std::filesystem;

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

const Aggregate* find(const EvalResult& r, const std::string& m, int b) {
  for (const auto& a : r.table)
    if (a.method == m && a.budget == b) return &a;
  return nullptr;
}

std::vector<std::string> present_methods(const EvalResult& r) {
  std::vector<std::string> out;
  for (const auto& m : r.methods)
    for (const auto& a : r.table)
      if (a.method == m) {
        out.push_back(m);
        break;
      }
  return out;
}

template <typename F>
std::string pivot(const EvalResult& r, const std::string& title, F value, int prec) {
  std::ostringstream os;
  os << "**" << title << "**\n\n| method |";
  for (int b : r.cfg.budgets) os << " b=" << b << " |";
  os << "\n|---|";
  for (size_t i = 0; i < r.cfg.budgets.size(); ++i) os << "---:|";
  os << "\n";
  for (const auto& m : present_methods(r)) {
    os << "| " << m << " |";
    for (int b : r.cfg.budgets) {
      const Aggregate* a = find(r, m, b);
      os << " " << (a ? fmt(value(*a), prec) : "-") << " |";
    }
    os << "\n";
  }
  return os.str();
}

void write_file(const std::string& path, const std::string& text) {
  io::write_text_file(path, text, "locks eval");
}

}  // namespace

std::string markdown_table(const EvalResult& r) {
  std::ostringstream os;
  const CaptureMeta& m = r.meta;
  os << "Capture: model `" << m.model << "`, layers " << m.num_layers << ", tokens " << m.tokens
     << ", steps " << m.steps << ", kv_heads " << m.kv_heads << ", q_heads " << m.q_heads
     << ", head_dim " << m.head_dim << ", keys " << m.keys << ". Page size " << r.cfg.page_size
     << ", sink " << r.cfg.sink_pages << ", recent " << r.cfg.recent_pages
     << (r.cfg.tau > 0 ? ", adaptive budget tau " + std::to_string(r.cfg.tau) + " floor " +
                             std::to_string(r.cfg.floor_pages) + " pages (budget = ceiling)"
                       : std::string())
     << ", LOCKS rank " << r.cfg.params.rank << ".\n\n";
  os << pivot(
            r, "Attention-mass recall, mean", [](const Aggregate& a) { return a.recall_mean; }, 3)
     << "\n";
  os << pivot(
            r, "Attention-mass recall, 5th percentile",
            [](const Aggregate& a) { return a.recall_p5; }, 3)
     << "\n";
  os << pivot(
            r, "Output relative L2 error vs FullKV, mean",
            [](const Aggregate& a) { return a.err_mean; }, 4)
     << "\n";
  os << "**All metrics** (p5 = 5th percentile; for the error, p95 and max are the bad tail; "
        "bytes = scoring + attended K+V, bf16, per step and KV head, as a share of dense)\n\n";
  os << "| method | b | recall mean | recall p5 | recall min | err mean | err p95 | err max | "
        "cos mean | cos p5 | cos min | attended | bytes/dense | metadata |\n";
  os << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const auto& a : r.table) {
    os << "| " << a.method << " | " << a.budget << " | " << fmt(a.recall_mean, 4) << " | "
       << fmt(a.recall_p5, 4) << " | " << fmt(a.recall_min, 4) << " | " << fmt(a.err_mean, 4)
       << " | " << fmt(a.err_p95, 4) << " | " << fmt(a.err_max, 4) << " | " << fmt(a.cos_mean, 4)
       << " | " << fmt(a.cos_p5, 4) << " | " << fmt(a.cos_min, 4) << " | "
       << fmt(a.attended_mean, 0) << " | " << fmt(100 * a.bytes_vs_full, 2) << "% | "
       << fmt(100 * a.metadata_share, 2) << "% |\n";
  }
  if (!r.notes.empty()) {
    os << "\nNotes:\n";
    for (const auto& n : r.notes) os << "- " << n << "\n";
  }
  return os.str();
}

void write_csv(const std::string& path, const EvalResult& r) {
  std::ostringstream os;
  os << std::setprecision(8);
  os << "method,budget,n,recall_mean,recall_p5,recall_min,err_mean,err_p95,err_max,cos_mean,"
        "cos_p5,cos_min,attended_mean,bytes_per_step,bytes_vs_full,metadata_share\n";
  for (const auto& a : r.table)
    os << a.method << "," << a.budget << "," << a.n << "," << a.recall_mean << "," << a.recall_p5
       << "," << a.recall_min << "," << a.err_mean << "," << a.err_p95 << "," << a.err_max << ","
       << a.cos_mean << "," << a.cos_p5 << "," << a.cos_min << "," << a.attended_mean << ","
       << a.bytes_per_step << "," << a.bytes_vs_full << "," << a.metadata_share << "\n";
  write_file(path, os.str());
}

void write_per_query_csv(const std::string& path, const EvalResult& r) {
  std::ostringstream os;
  os << std::setprecision(8);
  os << "method,budget,layer,step,q_head,recall,rel_l2,cosine\n";
  for (const auto& m : r.per_query)
    os << m.method << "," << m.budget << "," << m.layer << "," << m.step << "," << m.q_head << ","
       << m.recall << "," << m.rel_l2 << "," << m.cosine << "\n";
  write_file(path, os.str());
}

namespace {

// Per (method, budget, layer): mean tokens attended per (step, KV head) and mean recall per
// (step, query head); what the adaptive budget spends where (docs/study_adaptive.md).
nlohmann::json per_layer_json(const EvalResult& r) {
  struct Acc {
    double attended = 0, recall = 0;
    int64_t n_steps = 0, n_queries = 0;
  };
  std::map<std::tuple<std::string, int, int>, Acc> acc;
  for (const auto& s : r.per_step) {
    Acc& a = acc[{s.method, s.budget, s.layer}];
    a.attended += s.attended;
    ++a.n_steps;
  }
  for (const auto& q : r.per_query) {
    Acc& a = acc[{q.method, q.budget, q.layer}];
    a.recall += q.recall;
    ++a.n_queries;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [key, a] : acc)
    rows.push_back({{"method", std::get<0>(key)},
                    {"budget", std::get<1>(key)},
                    {"layer", std::get<2>(key)},
                    {"attended_mean", a.n_steps ? a.attended / double(a.n_steps) : 0.0},
                    {"recall_mean", a.n_queries ? a.recall / double(a.n_queries) : 0.0}});
  return rows;
}

}  // namespace

void write_json(const std::string& path, const EvalResult& r) {
  using nlohmann::json;
  json j;
  const CaptureMeta& m = r.meta;
  j["capture"] = {{"model", m.model},
                  {"layers", m.layers},
                  {"kv_heads", m.kv_heads},
                  {"q_heads", m.q_heads},
                  {"head_dim", m.head_dim},
                  {"tokens", m.tokens},
                  {"steps", m.steps},
                  {"keys", m.keys},
                  {"positional_encoding", m.positional_encoding}};
  if (!m.extra_json.empty()) j["capture"]["extra"] = json::parse(m.extra_json);
  const SelectorParams& p = r.cfg.params;
  j["config"] = {{"budgets", r.cfg.budgets},
                 {"page_size", r.cfg.page_size},
                 {"sink_pages", r.cfg.sink_pages},
                 {"recent_pages", r.cfg.recent_pages},
                 {"tau", r.cfg.tau},
                 {"floor_pages", r.cfg.floor_pages},
                 {"rank", p.rank},
                 {"basis_rank", p.basis_rank > 0 ? p.basis_rank : m.head_dim / 4},
                 {"rocket_dims", p.rocket_dims > 0 ? p.rocket_dims : m.head_dim / 4},
                 {"shadow_chunk", p.shadow_chunk},
                 {"shadow_outlier_share", p.shadow_outlier_share},
                 {"snapkv_keep", p.snapkv_keep},
                 {"snapkv_pool", p.snapkv_pool}};
  json methods = json::array();
  for (const auto& name : r.methods) {
    auto s = make_selector(name, p);
    methods.push_back({{"name", name},
                       {"description", s->description()},
                       {"gqa_rule", gqa_rule_name(s->gqa_rule())}});
  }
  j["methods"] = methods;
  json rows = json::array();
  for (const auto& a : r.table)
    rows.push_back({{"method", a.method},
                    {"budget", a.budget},
                    {"n", a.n},
                    {"recall_mean", a.recall_mean},
                    {"recall_p5", a.recall_p5},
                    {"recall_min", a.recall_min},
                    {"err_mean", a.err_mean},
                    {"err_p95", a.err_p95},
                    {"err_max", a.err_max},
                    {"cos_mean", a.cos_mean},
                    {"cos_p5", a.cos_p5},
                    {"cos_min", a.cos_min},
                    {"attended_mean", a.attended_mean},
                    {"bytes_per_step", a.bytes_per_step},
                    {"bytes_vs_full", a.bytes_vs_full},
                    {"metadata_share", a.metadata_share}});
  j["results"] = rows;
  j["per_layer"] = per_layer_json(r);
  j["notes"] = r.notes;
  write_file(path, j.dump(2) + "\n");
}

bool write_plots(const std::string& dir, const EvalResult& r, const std::string& title_in,
                 std::string* why) {
  // The title goes inside single quotes in the gnuplot script: quotes, backslashes and
  // control characters would end the string.
  std::string title = title_in;
  for (char& c : title)
    if (c == '\'' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
  const auto methods = present_methods(r);
  // One data file per metric: budget then one column per method ("nan" where missing).
  auto data = [&](const std::string& file, auto value) {
    std::ostringstream os;
    os << "budget";
    for (const auto& m : methods) os << " " << m;
    os << "\n" << std::setprecision(8);
    for (int b : r.cfg.budgets) {
      os << b;
      for (const auto& m : methods) {
        const Aggregate* a = find(r, m, b);
        os << " ";
        if (a)
          os << value(*a);
        else
          os << "nan";
      }
      os << "\n";
    }
    write_file((fs::path(dir) / file).string(), os.str());
  };
  data("plot_recall_mean.dat", [](const Aggregate& a) { return a.recall_mean; });
  data("plot_recall_p5.dat", [](const Aggregate& a) { return a.recall_p5; });
  data("plot_err_mean.dat", [](const Aggregate& a) { return a.err_mean; });
  // Shortfall of each selector's mean recall against the oracle's (FullKV and the oracle
  // itself left out): on a log axis, so that gaps of 0.001 and 0.9 both show.
  const bool has_oracle = std::find(methods.begin(), methods.end(), "oracle") != methods.end();
  std::vector<std::string> gap_methods;
  for (const auto& m : methods)
    if (m != "full" && m != "oracle") gap_methods.push_back(m);
  if (has_oracle && !gap_methods.empty()) {
    std::ostringstream os;
    os << "budget";
    for (const auto& m : gap_methods) os << " " << m;
    os << "\n" << std::setprecision(8);
    for (int b : r.cfg.budgets) {
      os << b;
      const Aggregate* o = find(r, "oracle", b);
      for (const auto& m : gap_methods) {
        const Aggregate* a = find(r, m, b);
        os << " ";
        if (a && o)
          os << o->recall_mean - a->recall_mean;
        else
          os << "nan";
      }
      os << "\n";
    }
    write_file((fs::path(dir) / "plot_recall_gap.dat").string(), os.str());
  }

  // Recall against bytes read per step: one data block per method (x differs by method).
  std::vector<std::string> byte_methods;
  {
    std::ostringstream os;
    os << std::setprecision(8);
    for (const auto& m : methods) {
      if (m == "full") continue;
      byte_methods.push_back(m);
      os << "# " << m << "\n";
      for (int b : r.cfg.budgets)
        if (const Aggregate* a = find(r, m, b))
          os << 100.0 * a->bytes_vs_full << " " << a->recall_mean << "\n";
      os << "\n\n";
    }
    write_file((fs::path(dir) / "plot_recall_bytes.dat").string(), os.str());
  }

  const int ncol = static_cast<int>(methods.size()) + 1;
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,600 noenhanced font 'Sans,11'\n"
     << "set key outside right top\nset grid\nset logscale x 2\n"
     << "set xlabel 'token budget b'\nset datafile missing 'nan'\n"
     << "set xrange [" << r.cfg.budgets.front() * 0.8 << ":" << r.cfg.budgets.back() * 1.25
     << "]\n";
  // One line style per method: colour, point and dash all differ, so overlapping curves
  // stay distinguishable.
  for (size_t k = 1; k <= methods.size(); ++k)
    gp << "set style line " << k << " lw 2 pt " << k << " dt " << k << " lc " << k << "\n";
  gp << "set output 'recall_vs_budget.png'\nset title '" << title
     << ": attention-mass recall (mean)'\nset ylabel 'recall'\nset yrange [0:1.02]\n"
     << "plot for [i=2:" << ncol
     << "] 'plot_recall_mean.dat' using 1:i with linespoints ls (i-1) title "
        "columnheader(i)\n";
  gp << "set output 'recall_p5_vs_budget.png'\nset title '" << title
     << ": attention-mass recall (5th percentile)'\n"
     << "plot for [i=2:" << ncol
     << "] 'plot_recall_p5.dat' using 1:i with linespoints ls (i-1) title "
        "columnheader(i)\n";
  // The error plot leaves out FullKV (zero error: nothing to draw on a log axis).
  gp << "set output 'error_vs_budget.png'\nset title '" << title
     << ": output relative L2 error vs FullKV (mean)'\nset ylabel 'relative L2 error'\n"
     << "set autoscale y\nset logscale y\nset format y '%g'\n"
     << "plot for [i=2:" << ncol
     << "] 'plot_err_mean.dat' using 1:(column(i) > 0 ? column(i) : NaN) with linespoints "
        "ls (i-1) title columnheader(i)\n";
  if (has_oracle && !gap_methods.empty()) {
    // Line styles follow the method's position in `methods`, as in the other plots.
    std::ostringstream styles;
    for (const auto& m : gap_methods)
      styles << (styles.tellp() > 0 ? " " : "")
             << (std::find(methods.begin(), methods.end(), m) - methods.begin() + 1);
    gp << "set output 'recall_gap_vs_budget.png'\nset title '" << title
       << ": recall shortfall vs the oracle (mean; points at 0 not drawn)'\n"
       << "set ylabel 'oracle recall - method recall'\nset logscale y\nset autoscale y\n"
       << "set format y '%g'\n"
       << "styles = '" << styles.str() << "'\n"
       << "plot for [i=2:" << gap_methods.size() + 1
       << "] 'plot_recall_gap.dat' using 1:(column(i) > 0 ? column(i) : NaN) with linespoints "
          "ls int(word(styles, i-1)) title columnheader(i)\n";
  }
  if (!byte_methods.empty()) {
    gp << "set output 'recall_vs_bytes.png'\nset title '" << title
       << ": recall (mean) vs bytes read per step (budgets " << r.cfg.budgets.front() << " to "
       << r.cfg.budgets.back() << ")'\n"
       << "set xlabel 'bytes read per step, % of dense K+V (scoring metadata or keys + "
          "attended K+V)'\nset ylabel 'recall'\nunset logscale y\nset format y '%g'\n"
       << "set autoscale y\nset logscale x 10\nset autoscale x\nset format x '%g'\n";
    gp << "plot ";
    for (size_t i = 0; i < byte_methods.size(); ++i) {
      const auto pos = std::find(methods.begin(), methods.end(), byte_methods[i]) - methods.begin();
      gp << (i ? ", " : "") << "'plot_recall_bytes.dat' index " << i
         << " using 1:2 with linespoints ls " << pos + 1 << " title '" << byte_methods[i] << "'";
    }
    gp << "\n";
  }
  write_file((fs::path(dir) / "plots.gp").string(), gp.str());
  const std::string log = fs::absolute(fs::path(dir) / "gnuplot.log").string();
  const ProgramResult run = run_program({"gnuplot", "plots.gp"}, dir, log);
  if (!run.started) {
    if (why) *why = run.error;
    return false;
  }
  if (run.exit_code != 0) {
    if (why) *why = run.error + " (see " + log + ")";
    return false;
  }
  return true;
}

}  // namespace locks::eval

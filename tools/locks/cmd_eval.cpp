// `locks eval`: every page selector side by side on one KV capture (docs/capture_format.md).
#include <filesystem>
#include <fstream>
#include <iostream>

#include "command.h"
#include "locks/error.h"
#include "locks/eval/harness.h"
#include "locks/eval/report.h"
#include "usage.h"

namespace {

using locks::cli::UsageError;

// "a,b,c" -> items; an empty item is a usage error.
std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (item.empty()) throw UsageError(flag + " needs a comma-separated list, got '" + text + "'");
    out.push_back(item);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

int to_int(const std::string& flag, const std::string& s) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = std::string::npos;
  }
  if (pos != s.size() || v < 1 || v > (1 << 30))
    throw UsageError(flag + " needs positive integers, got '" + s + "'");
  return static_cast<int>(v);
}

double to_real(const std::string& flag, const std::string& s, double lo, double hi) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = std::string::npos;
  }
  if (pos != s.size() || !(v >= lo && v <= hi))
    throw UsageError(flag + " needs a number in [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "], got '" + s + "'");
  return v;
}

constexpr const char* kUsage =
    "usage: locks eval --capture DIR --out DIR [--budgets 64,128,256,512,1024,2048]\n"
    "                  [--methods full,oracle,quest,shared_proj,shadowkv,rocket,rocket_snapkv,\n"
    "                   locks_fp32,locks_quant] [--page-size 16] [--rank 8]\n"
    "                  [--basis-rank d/4] [--rocket-dims d/4] [--sink 0] [--recent 0]\n"
    "                  [--snapkv-keep 4] [--outlier-share 0.015625] [--title TEXT]\n"
    "                  [--no-plots] [--per-query]\n"
    "Writes OUT/table.md, results.csv, results.json (and per_query.csv with --per-query),\n"
    "recall_vs_budget.png, recall_p5_vs_budget.png, error_vs_budget.png,\n"
    "recall_gap_vs_budget.png, recall_vs_bytes.png; prints the table.\n";

int run_eval_cmd(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  using namespace locks::eval;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage;  // no arguments is a usage error
    return args.empty() ? 2 : 0;
  }
  locks::cli::Args o(
      args,
      {"--capture", "--out", "--budgets", "--methods", "--page-size", "--rank", "--basis-rank",
       "--rocket-dims", "--sink", "--recent", "--snapkv-keep", "--outlier-share", "--title"},
      {"--no-plots", "--per-query"});
  EvalConfig cfg;
  const std::string capture = o.required("--capture");
  const std::string out = o.required("--out");
  if (o.has("--budgets")) {
    cfg.budgets.clear();
    for (const auto& b : split_list("--budgets", o.str("--budgets", "")))
      cfg.budgets.push_back(to_int("--budgets", b));
  }
  if (o.has("--methods")) cfg.methods = split_list("--methods", o.str("--methods", ""));
  cfg.page_size = static_cast<int>(o.integer("--page-size", 16, 2, 256));
  cfg.sink_pages = static_cast<int>(o.integer("--sink", 0, 0, 1 << 20));
  cfg.recent_pages = static_cast<int>(o.integer("--recent", 0, 0, 1 << 20));
  cfg.params.rank = static_cast<int>(o.integer("--rank", 8, 1, 255));
  cfg.params.basis_rank = static_cast<int>(o.integer("--basis-rank", 0, 0, 256));
  cfg.params.rocket_dims = static_cast<int>(o.integer("--rocket-dims", 0, 0, 256));
  if (o.has("--snapkv-keep"))
    cfg.params.snapkv_keep = to_real("--snapkv-keep", o.str("--snapkv-keep", ""), 1.0, 1e6);
  if (o.has("--outlier-share"))
    cfg.params.shadow_outlier_share =
        to_real("--outlier-share", o.str("--outlier-share", ""), 0.0, 0.5);
  cfg.progress = [](const std::string& s) { std::cerr << "[eval] " << s << std::endl; };
  fs::create_directories(out);

  EvalResult r = run_eval(capture, cfg);
  const std::string md = markdown_table(r);
  std::ofstream((fs::path(out) / "table.md").string()) << md;
  write_csv((fs::path(out) / "results.csv").string(), r);
  write_json((fs::path(out) / "results.json").string(), r);
  if (o.has("--per-query")) write_per_query_csv((fs::path(out) / "per_query.csv").string(), r);
  std::cout << md;
  if (!o.has("--no-plots")) {
    std::string why;
    const std::string title = o.str("--title", r.meta.model);
    if (write_plots(out, r, title, &why))
      std::cerr << "[eval] plots written to " << out << std::endl;
    else
      std::cerr << "[eval] plots skipped: " << why << std::endl;
  }
  std::cerr << "[eval] wrote " << out << "/{table.md,results.csv,results.json}" << std::endl;
  return 0;
}

}  // namespace

LOCKS_COMMAND(eval, "eval", "run every page selector on a KV capture; tables, CSV, JSON, plots",
              run_eval_cmd);

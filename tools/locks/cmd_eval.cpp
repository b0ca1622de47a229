// `locks eval`: every page selector side by side on one KV capture (docs/capture_format.md).
#include <filesystem>
#include <iostream>

#include "command.h"
#include "locks/error.h"
#include "locks/eval/harness.h"
#include "locks/eval/report.h"
#include "locks/io/files.h"
#include "options.h"
#include "usage.h"

namespace {

using locks::cli::UsageError;

constexpr const char* kUsage =
    "usage: locks eval --capture DIR --out DIR [--budgets 64,128,256,512,1024,2048]\n"
    "                  [--methods full,oracle,quest,shared_proj,shadowkv,rocket,rocket_snapkv,\n"
    "                   locks_fp32,locks_quant] [--page-size 16] [--rank 8]\n"
    "                  [--basis-rank d/4] [--rocket-dims d/4] [--sink 0] [--recent 0]\n"
    "                  [--snapkv-keep 4] [--outlier-share 0.015625] [--qweight-floor 0.01]\n"
    "                  [--title TEXT] [--tau 0] [--floor-pages 1] [--basis-group 0]\n"
    "                  [--no-plots] [--per-query] [--force]\n"
    "--methods also takes LOCKS variants lx-... (src/eval/selector_locks_variant.cpp) and\n"
    "two-level LOCKS locks_h2 / h2-... (src/eval/selector_locks_h2.cpp, "
    "docs/study_hierarchical.md).\n"
    "--basis-group N: dims per int4 basis scale of the LOCKS int4 summaries (an even divisor\n"
    "of head_dim; 0 = the library's default: 32 at head_dim >= 128, one scale a row below).\n"
    "Writes OUT/table.md, results.csv, results.json (and per_query.csv with --per-query),\n"
    "recall_vs_budget.png, recall_p5_vs_budget.png, error_vs_budget.png,\n"
    "recall_gap_vs_budget.png, recall_vs_bytes.png; prints the table.\n"
    "--tau T (0 < T <= 1): the adaptive budget for every selector's selection: per step and\n"
    "KV head the fewest scored pages (>= --floor-pages) whose estimated mass covers T of the\n"
    "estimated total; each budget is the ceiling (column attended_mean: what it attends).\n"
    "OUT is written whole or not at all (a temporary folder beside it, renamed into place);\n"
    "an existing non-empty OUT is refused unless --force (then it is replaced).\n";

int run_eval_cmd(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  using namespace locks::eval;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage;  // no arguments is a usage error
    return args.empty() ? 2 : 0;
  }
  const locks::cli::EvalOptions o = locks::cli::parse_eval_options(args);
  // Checked before the (long) evaluation: an unusable output folder or an unknown method.
  const std::string why = locks::io::StagedDir::check_target(o.out, o.force);
  if (!why.empty()) throw UsageError(why);
  for (const std::string& m : o.cfg.methods) {
    try {
      make_selector(m, o.cfg.params);
    } catch (const locks::Error& e) {
      throw UsageError(std::string("--methods: ") + e.what());
    }
  }
  EvalConfig cfg = o.cfg;
  cfg.progress = [](const std::string& s) { std::cerr << "[eval] " << s << std::endl; };

  EvalResult r;
  std::string md, plots;
  try {
    r = run_eval(o.capture, cfg);
    md = markdown_table(r);
    locks::io::StagedDir staged(o.out, o.force);
    const fs::path dir = staged.path();
    locks::io::write_text_file((dir / "table.md").string(), md, "locks eval");
    write_csv((dir / "results.csv").string(), r);
    write_json((dir / "results.json").string(), r);
    if (o.per_query) write_per_query_csv((dir / "per_query.csv").string(), r);
    if (o.plots) {
      std::string why_not;
      if (write_plots(dir.string(), r, o.title.empty() ? r.meta.model : o.title, &why_not))
        plots = "plots written";
      else
        plots = "plots skipped: " + why_not;
    }
    staged.commit();
  } catch (...) {
    // Said explicitly, so that results left from an earlier run are not taken for this one's.
    std::cerr << "[eval] failed: nothing written (" << o.out << " left as it was)" << std::endl;
    throw;
  }
  std::cout << md;
  if (!plots.empty()) std::cerr << "[eval] " << plots << std::endl;
  std::cerr << "[eval] wrote " << o.out << "/{table.md,results.csv,results.json"
            << (o.per_query ? ",per_query.csv" : "") << "}" << std::endl;
  return 0;
}

}  // namespace

LOCKS_COMMAND(eval, "eval", "run every page selector on a KV capture; tables, CSV, JSON, plots",
              run_eval_cmd);

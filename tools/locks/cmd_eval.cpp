// `locks eval`: every page selector side by side on one KV capture (docs/capture_format.md).
#include <filesystem>
#include <fstream>
#include <iostream>

#include "command.h"
#include "locks/error.h"
#include "locks/eval/harness.h"
#include "locks/eval/options.h"
#include "locks/eval/report.h"

namespace {

constexpr const char* kUsage =
    "usage: locks eval --capture DIR --out DIR [--budgets 64,128,256,512,1024,2048]\n"
    "                  [--methods full,oracle,quest,shared_proj,shadowkv,rocket,rocket_snapkv,\n"
    "                   locks_fp32,locks_quant] [--page-size 16] [--rank 8]\n"
    "                  [--basis-rank d/4] [--rocket-dims d/4] [--sink 0] [--recent 0]\n"
    "                  [--snapkv-keep 4] [--outlier-share 0.015625] [--title TEXT]\n"
    "                  [--no-plots] [--per-query]\n"
    "Writes OUT/table.md, results.csv, results.json (and per_query.csv with --per-query),\n"
    "recall_vs_budget.png, recall_p5_vs_budget.png, error_vs_budget.png; prints the table.\n";

int run_eval_cmd(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  using namespace locks::eval;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << kUsage;
    return args.empty() ? 2 : 0;
  }
  try {
    Options o(
        args,
        {"--capture", "--out", "--budgets", "--methods", "--page-size", "--rank", "--basis-rank",
         "--rocket-dims", "--sink", "--recent", "--snapkv-keep", "--outlier-share", "--title"},
        {"--no-plots", "--per-query"});
    EvalConfig cfg;
    const std::string capture = o.required("--capture");
    const std::string out = o.required("--out");
    cfg.budgets = o.int_list("--budgets", cfg.budgets);
    cfg.methods = o.str_list("--methods");
    cfg.page_size = static_cast<int>(o.integer("--page-size", 16));
    cfg.sink_pages = static_cast<int>(o.integer("--sink", 0));
    cfg.recent_pages = static_cast<int>(o.integer("--recent", 0));
    cfg.params.rank = static_cast<int>(o.integer("--rank", 8));
    cfg.params.basis_rank = static_cast<int>(o.integer("--basis-rank", 0));
    cfg.params.rocket_dims = static_cast<int>(o.integer("--rocket-dims", 0));
    cfg.params.snapkv_keep = o.real("--snapkv-keep", 4.0);
    cfg.params.shadow_outlier_share = o.real("--outlier-share", 1.0 / 64);
    LOCKS_REQUIRE(cfg.params.basis_rank >= 0 && cfg.params.rocket_dims >= 0,
                  "--basis-rank and --rocket-dims must be >= 0");
    LOCKS_REQUIRE(cfg.params.snapkv_keep >= 1.0, "--snapkv-keep must be >= 1");
    LOCKS_REQUIRE(cfg.params.shadow_outlier_share >= 0 && cfg.params.shadow_outlier_share < 1,
                  "--outlier-share must be in [0, 1)");
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
  } catch (const locks::Error& e) {
    std::cerr << "locks eval: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

LOCKS_COMMAND(eval, "eval", "run every page selector on a KV capture; tables, CSV, JSON, plots",
              run_eval_cmd);

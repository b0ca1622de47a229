#include <unistd.h>
// Report writers: CSV/JSON/markdown carry every (method, budget) row; plots are produced
// when gnuplot is installed (and their absence is reported, not fatal).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "eval_test_util.h"
#include "locks/eval/harness.h"
#include "locks/eval/report.h"

namespace locks::eval {
namespace {

namespace fs = std::filesystem;

EvalResult small_result() {
  auto l = test::synth_layer(SynthKind::needles, 16 * 64, 1, 2, 32, 2);
  EvalResult r;
  r.cfg.budgets = {64, 128};
  r.methods = {"full", "oracle", "quest", "locks_quant"};
  r.meta.model = "it's/a test";
  r.meta.layers = {0};
  r.meta.head_dim = 32;
  eval_layer(l.ctx(), 0, r.cfg, r);
  aggregate(r);
  return r;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Report, WritesEveryRow) {
  EvalResult r = small_result();
  ASSERT_EQ(r.table.size(), 8u);
  // Per process: ctest -j runs tests side by side.
  const fs::path dir =
      fs::temp_directory_path() / ("locks_eval_report_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_csv((dir / "r.csv").string(), r);
  write_json((dir / "r.json").string(), r);
  write_per_query_csv((dir / "q.csv").string(), r);
  const std::string csv = slurp(dir / "r.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 8);
  EXPECT_NE(csv.find("locks_quant,128,"), std::string::npos);
  const std::string qcsv = slurp(dir / "q.csv");
  EXPECT_EQ(std::count(qcsv.begin(), qcsv.end(), '\n'), 1 + 4 * 2 * 2 * 2);
  nlohmann::json j = nlohmann::json::parse(slurp(dir / "r.json"));
  EXPECT_EQ(j["results"].size(), 8u);
  EXPECT_EQ(j["methods"][2]["name"], "quest");
  const std::string md = markdown_table(r);
  EXPECT_NE(md.find("| oracle | 64 |"), std::string::npos);
  EXPECT_NE(md.find("| locks_quant |"), std::string::npos);

  std::string why;
  const bool have_gnuplot = std::system("command -v gnuplot >/dev/null 2>&1") == 0;
  const bool ok = write_plots(dir.string(), r, r.meta.model, &why);
  EXPECT_EQ(ok, have_gnuplot) << why;
  if (have_gnuplot)
    for (const char* png :
         {"recall_vs_budget.png", "recall_p5_vs_budget.png", "error_vs_budget.png",
          "recall_gap_vs_budget.png", "recall_vs_bytes.png"})
      EXPECT_GT(fs::exists(dir / png) ? fs::file_size(dir / png) : 0, 1000u) << png;
  fs::remove_all(dir);
}

// The adaptive budget through the harness (EvalConfig::tau): the selection attends fewer
// tokens than the ceiling on data whose mass sits on a few pages, and results.json carries
// the tau and the tokens attended per layer.
TEST(Report, AdaptiveBudgetAttendsLessAndReportsPerLayer) {
  auto l = test::synth_layer(SynthKind::needles, 16 * 64, 1, 2, 32, 2);
  EvalResult r;
  r.cfg.budgets = {512};
  r.cfg.tau = 0.5f;
  r.methods = {"oracle", "locks_quant"};
  r.meta.layers = {3};
  r.meta.head_dim = 32;
  eval_layer(l.ctx(), 3, r.cfg, r);
  aggregate(r);
  ASSERT_EQ(r.table.size(), 2u);
  for (const Aggregate& a : r.table) EXPECT_LT(a.attended_mean, 512) << a.method;
  const fs::path dir =
      fs::temp_directory_path() / ("locks_eval_report_tau_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_json((dir / "r.json").string(), r);
  const nlohmann::json j = nlohmann::json::parse(slurp(dir / "r.json"));
  EXPECT_EQ(j["config"]["tau"], 0.5);
  ASSERT_EQ(j["per_layer"].size(), 2u);
  for (const auto& row : j["per_layer"]) {
    EXPECT_EQ(row["layer"], 3);
    const auto& agg = row["method"] == "oracle" ? r.table[0] : r.table[1];
    EXPECT_DOUBLE_EQ(row["attended_mean"].get<double>(), agg.attended_mean);
    EXPECT_NEAR(row["recall_mean"].get<double>(), agg.recall_mean, 1e-12);
  }
  EXPECT_NE(markdown_table(r).find("adaptive budget tau"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace locks::eval

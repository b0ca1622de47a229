// Outputs of `locks eval`: markdown table, CSV, JSON, gnuplot PNG plots.
#pragma once

#include <string>

#include "locks/eval/harness.h"

namespace locks::eval {

std::string markdown_table(const EvalResult& r);
void write_csv(const std::string& path, const EvalResult& r);
void write_per_query_csv(const std::string& path, const EvalResult& r);
void write_json(const std::string& path, const EvalResult& r);
// Writes recall_vs_budget.png, recall_p5_vs_budget.png, error_vs_budget.png and
// recall_gap_vs_budget.png, recall_vs_bytes.png (with the data files and plots.gp) into dir by
// running `gnuplot`. Returns false, with the reason, when gnuplot is missing or fails.
bool write_plots(const std::string& dir, const EvalResult& r, const std::string& title,
                 std::string* why);

}  // namespace locks::eval

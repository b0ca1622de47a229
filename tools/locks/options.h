// Option parsing of the `locks` sub-commands, apart from running them: every rule about the
// command line alone is checked here and broken ones throw UsageError (exit 2), before any
// file is read. Kept free of the evaluation harness so that the CLI fuzzer
// (fuzz/fuzz_cli.cpp) can drive exactly this code.
#pragma once

#include <string>
#include <vector>

#include "locks/eval/harness.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "locks/synthetic.h"

namespace locks::cli {

struct EvalOptions {
  std::string capture, out, title;  // title empty: the capture's model name
  eval::EvalConfig cfg;
  bool plots = true, per_query = false, force = false;
};
EvalOptions parse_eval_options(const std::vector<std::string>& args);

struct SelectOptions {
  std::string keys, values, query;
  SelectConfig select;
  int page_size = 16, rank = 8;
  Precision precision = Precision::fp32;
  std::string precision_name = "fp32";
  bool json = false;
};
SelectOptions parse_select_options(const std::vector<std::string>& args);

struct SynthOptions {
  SynthConfig synth;  // synth.steps = decode steps + observation window
  std::string out;
  long long steps = 4, obs_window = 16, seed = 0;
  bool force = false;
};
SynthOptions parse_synth_options(const std::vector<std::string>& args);

// The checks shared by eval and select: rank below the page size, and each budget large
// enough for the sink and recent pages plus the tail page.
void check_rank_and_budget(int rank, int page_size, const SelectConfig& select);

}  // namespace locks::cli

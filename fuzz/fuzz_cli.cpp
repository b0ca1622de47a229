// libFuzzer harness of the CLI option parsing (tools/locks/options.h): the input is split at
// 0 bytes into arguments; the first byte picks the command (eval, select, synth). Every
// outcome must be options or a UsageError / locks::Error; any other exception
// (std::out_of_range, std::invalid_argument, ...) or a sanitizer report is a finding.
#include <cstdint>
#include <string>
#include <vector>

#include "locks/error.h"
#include "options.h"
#include "usage.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int command = data[0] % 3;
  std::vector<std::string> args(1);
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back().push_back(static_cast<char>(data[i]));
  }
  if (args.size() > 64) return 0;
  try {
    if (command == 0) {
      const auto o = locks::cli::parse_eval_options(args);
      for (int b : o.cfg.budgets)
        if (b < 1) std::abort();
      if (o.cfg.params.rank >= o.cfg.page_size) std::abort();
    } else if (command == 1) {
      const auto o = locks::cli::parse_select_options(args);
      if (o.select.budget_tokens < o.page_size || o.rank >= o.page_size) std::abort();
    } else {
      const auto o = locks::cli::parse_synth_options(args);
      if (o.synth.num_q_heads % o.synth.num_kv_heads != 0) std::abort();
    }
  } catch (const locks::cli::UsageError&) {
  } catch (const locks::Error&) {
  }
  return 0;
}

// locks_bench_cuda's command line: its options and their strict parse, host-only (no CUDA), so
// that a malformed command is refused before any device call and the parse is tested without a
// GPU (tests/bench/test_bench_args.cpp). Before, unknown options and malformed numbers were
// ignored or read as 0: `--only Llama 131072` (batch missing) ran the whole grid.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace bench {

struct Opts {
  bool quick = false;
  bool two_level = false;
  int group_pages = 32;                   // --S
  double alpha = 40.0;                    // --alpha (TwoLevelConfig's default)
  int flat_below = -1;                    // --flat-below: TwoLevelConfig::flat_below_groups
  int score_chunk = 0, select_chunk = 0;  // plan knobs (0 = the plan's choice)
  int select_cluster = 0;                 // -1 never, 0 the plan's rule, 1-16 forced
  int group_cluster = 0;                  // two-level group choice: 0 the plan's rule, 1-8 forced
  int attn_pps = 0;                       // sparse attention pages a split: 0 the plan's rule
  float tau = 0.0f;                       // adaptive budget (0: the fixed budget)
  int tokens_per_seq = 1;                 // --tokens-per-seq: rows a sequence (verification)
  int row_tokens = 0;    // --row-tokens: every row this long, the plan and cache for CONTEXT (0: =)
  int buckets = 0;       // --buckets K: also the step over K length buckets (0: not timed)
  std::string pipeline;  // --pipeline K or B1,B2,...: sub-batches to time
  double ceiling = 0;    // --ceiling (TB/s); 0: measured
  FILE* csv = nullptr;   // opened by main from csv_path
  // The command line's own values (not knobs).
  std::string csv_path;    // first argument when it does not start with "--"
  std::string only_model;  // --only MODEL_PREFIX CONTEXT BATCH (empty: the grid)
  int64_t only_ctx = 0;
  int only_batch = 0;
};

namespace detail {

// The whole string as a base-10 integer in [lo, hi]; false otherwise.
inline bool parse_int(const char* s, int64_t lo, int64_t hi, int64_t* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// The whole string as a finite number >= lo; false otherwise.
inline bool parse_num(const char* s, double lo, double* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (errno != 0 || *end != '\0' || !(v >= lo) || v > 1e300) return false;
  *out = v;
  return true;
}

}  // namespace detail

// Parses argv into `o`. Returns an empty string when the command is well formed, otherwise what
// is wrong with it. Ranges here are the command's (numbers, signs); the plan checks its knobs'
// values when a row is planned and says why a row cannot run.
inline std::string parse_args(int argc, const char* const* argv, Opts& o) {
  int i = 1;
  if (argc > 1 && std::strncmp(argv[1], "--", 2) != 0) o.csv_path = argv[i++];
  constexpr int64_t kIntMax = 2147483647;
  // The options that take one value: integers with their least value, numbers (finite, >= 0).
  struct IntOpt {
    const char* name;
    int* dst;
    int64_t lo;
  };
  const IntOpt ints[] = {{"--S", &o.group_pages, 1},
                         {"--group-cluster", &o.group_cluster, 0},
                         {"--flat-below", &o.flat_below, -1},
                         {"--score-chunk", &o.score_chunk, 0},
                         {"--select-chunk", &o.select_chunk, 0},
                         {"--select-cluster", &o.select_cluster, -1},
                         {"--attn-pps", &o.attn_pps, 0},
                         {"--tokens-per-seq", &o.tokens_per_seq, 1},
                         {"--row-tokens", &o.row_tokens, 1},
                         {"--buckets", &o.buckets, 1}};
  double tau = o.tau;  // (Opts keeps it as the float the plan takes)
  const std::pair<const char*, double*> nums[] = {
      {"--alpha", &o.alpha}, {"--ceiling", &o.ceiling}, {"--tau", &tau}};
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](int k) -> const char* { return i + k < argc ? argv[i + k] : nullptr; };
    auto got = [&]() {
      return value(1) ? std::string(", got '") + value(1) + "'" : std::string(", got nothing");
    };
    const IntOpt* io = nullptr;
    for (const IntOpt& c : ints)
      if (a == c.name) io = &c;
    double* num = nullptr;
    for (const auto& c : nums)
      if (a == c.first) num = c.second;
    if (io) {
      int64_t v = 0;
      if (!detail::parse_int(value(1), io->lo, kIntMax, &v))
        return a + " takes an integer >= " + std::to_string(io->lo) + got();
      *io->dst = int(v);
      ++i;
    } else if (num) {
      if (!detail::parse_num(value(1), 0.0, num)) return a + " takes a number >= 0" + got();
      ++i;
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--two-level") {
      o.two_level = true;
    } else if (a == "--pipeline") {
      if (value(1) == nullptr || std::strncmp(value(1), "--", 2) == 0)
        return "--pipeline takes K or B1,B2,...";
      o.pipeline = argv[++i];
    } else if (a == "--only") {
      int64_t ctx = 0, batch = 0;
      if (value(1) == nullptr || *value(1) == '\0' || std::strncmp(value(1), "--", 2) == 0 ||
          value(3) == nullptr)
        return "--only takes MODEL_PREFIX CONTEXT BATCH";
      if (!detail::parse_int(value(2), 1, int64_t(1) << 40, &ctx))
        return std::string("--only: CONTEXT must be a positive number of tokens, got '") +
               value(2) + "'";
      if (!detail::parse_int(value(3), 1, kIntMax, &batch))
        return std::string("--only: BATCH must be a positive integer, got '") + value(3) + "'";
      o.only_model = value(1);
      o.only_ctx = ctx;
      o.only_batch = int(batch);
      i += 3;
    } else {
      return "unknown argument '" + a + "'" +
             (i == 1 ? "" : " (the CSV path, if any, comes first)");
    }
  }
  o.tau = float(tau);
  // Options that take a flat row named with --only.
  const bool flat_row = !o.two_level && !o.only_model.empty();
  if (o.tokens_per_seq != 1 && !flat_row)
    return "--tokens-per-seq " + std::to_string(o.tokens_per_seq) +
           ": takes flat rows named with --only (not the grid, not --two-level)";
  if (o.row_tokens > 0 && (!flat_row || o.tokens_per_seq != 1 || o.row_tokens > o.only_ctx))
    return "--row-tokens " + std::to_string(o.row_tokens) +
           ": takes a flat row named with --only, at most its CONTEXT tokens, one row a sequence";
  return "";
}

}  // namespace bench

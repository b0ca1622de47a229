// locks_bench_cuda's command line (bench/cuda/bench_args.h): well-formed commands give the
// options they name; every malformed one is refused with a message naming what is wrong, so the
// bench exits before any device call instead of running something else (the grid, a 0 knob).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench_args.h"

namespace {

std::string parse(std::vector<const char*> args, bench::Opts* out = nullptr) {
  args.insert(args.begin(), "locks_bench_cuda");
  bench::Opts o;
  const std::string err = bench::parse_args(int(args.size()), args.data(), o);
  if (out) *out = o;
  return err;
}

TEST(BenchArgs, EmptyCommandIsTheGrid) {
  bench::Opts o;
  EXPECT_EQ(parse({}, &o), "");
  EXPECT_TRUE(o.csv_path.empty());
  EXPECT_TRUE(o.only_model.empty());
  EXPECT_FALSE(o.quick);
}

TEST(BenchArgs, EveryOptionIsRead) {
  bench::Opts o;
  ASSERT_EQ(parse({"out.csv", "--quick",         "--two-level", "--S",
                   "16",      "--group-cluster", "4",           "--alpha",
                   "8.5",     "--flat-below",    "-1",          "--score-chunk",
                   "96",      "--select-chunk",  "2048",        "--select-cluster",
                   "-1",      "--attn-pps",      "8",           "--ceiling",
                   "4.4",     "--tau",           "0.9",         "--pipeline",
                   "2,6",     "--only",          "GLM",         "1048576",
                   "8"},
                  &o),
            "");
  EXPECT_EQ(o.csv_path, "out.csv");
  EXPECT_TRUE(o.quick && o.two_level);
  EXPECT_EQ(o.group_pages, 16);
  EXPECT_EQ(o.group_cluster, 4);
  EXPECT_DOUBLE_EQ(o.alpha, 8.5);
  EXPECT_EQ(o.flat_below, -1);
  EXPECT_EQ(o.score_chunk, 96);
  EXPECT_EQ(o.select_chunk, 2048);
  EXPECT_EQ(o.select_cluster, -1);
  EXPECT_EQ(o.attn_pps, 8);
  EXPECT_DOUBLE_EQ(o.ceiling, 4.4);
  EXPECT_FLOAT_EQ(o.tau, 0.9f);
  EXPECT_EQ(o.pipeline, "2,6");
  EXPECT_EQ(o.only_model, "GLM");
  EXPECT_EQ(o.only_ctx, 1048576);
  EXPECT_EQ(o.only_batch, 8);
}

// --tokens-per-seq and --row-tokens take a flat row named with --only (and one row a sequence
// for --row-tokens).
TEST(BenchArgs, FlatRowOptionsAreRead) {
  bench::Opts o;
  ASSERT_EQ(parse({"--only", "GLM", "1048576", "8", "--tokens-per-seq", "4"}, &o), "");
  EXPECT_EQ(o.tokens_per_seq, 4);
  EXPECT_EQ(o.row_tokens, 0);
  ASSERT_EQ(parse({"--row-tokens", "131072", "--only", "GLM", "1048576", "8"}, &o), "");
  EXPECT_EQ(o.row_tokens, 131072);
  EXPECT_EQ(o.tokens_per_seq, 1);
  ASSERT_EQ(parse({"--only", "GLM", "131072", "1", "--row-tokens", "131072"}, &o), "");
  EXPECT_EQ(o.row_tokens, 131072);  // N == CONTEXT is allowed
}

TEST(BenchArgs, OnlyWithoutCsvPath) {
  bench::Opts o;
  ASSERT_EQ(parse({"--only", "Llama", "131072", "8", "--select-cluster", "4"}, &o), "");
  EXPECT_TRUE(o.csv_path.empty());
  EXPECT_EQ(o.only_model, "Llama");
  EXPECT_EQ(o.select_cluster, 4);
}

struct Bad {
  std::vector<const char*> args;
  const char* says;  // a piece of the message
};

TEST(BenchArgs, MalformedCommandsAreRefused) {
  const Bad cases[] = {
      {{"/dev/null", "--only", "Llama", "131072"}, "--only takes MODEL_PREFIX CONTEXT BATCH"},
      {{"--only", "Llama"}, "--only takes"},
      {{"--only", "--quick", "1", "1"}, "--only takes"},
      {{"--only", "", "1024", "1"}, "--only takes"},  // an empty prefix would be the grid
      {{"--only", "Llama", "x", "8"}, "CONTEXT must be a positive"},
      {{"--only", "Llama", "0", "8"}, "CONTEXT must be a positive"},
      {{"--only", "Llama", "-5", "8"}, "CONTEXT must be a positive"},
      {{"--only", "Llama", "1024k", "8"}, "CONTEXT must be a positive"},
      {{"--only", "Llama", "1024", "0"}, "BATCH must be a positive"},
      {{"--only", "Llama", "1024", "99999999999"}, "BATCH must be a positive"},
      {{"--only", "Llama", "1024", "2.5"}, "BATCH must be a positive"},
      {{"/dev/null", "--quick", "out.csv"}, "unknown argument 'out.csv' (the CSV path"},
      {{"--bogus"}, "unknown argument '--bogus'"},
      {{"/dev/null", "-quick"}, "unknown argument '-quick'"},
      {{"--score-chunk"}, "--score-chunk takes an integer >= 0, got nothing"},
      {{"--score-chunk", "abc"}, "--score-chunk takes an integer >= 0, got 'abc'"},
      {{"--score-chunk", "-32"}, "--score-chunk takes an integer >= 0"},
      {{"--select-cluster", "-2"}, "--select-cluster takes an integer >= -1"},
      {{"--S", "0"}, "--S takes an integer >= 1"},
      {{"--tokens-per-seq", "0"}, "--tokens-per-seq takes an integer >= 1"},
      {{"--row-tokens", "0"}, "--row-tokens takes an integer >= 1"},
      {{"--row-tokens", "1e5"}, "--row-tokens takes an integer >= 1"},
      {{"--tokens-per-seq", "4"}, "--tokens-per-seq 4: takes flat rows named with --only"},
      {{"--two-level", "--only", "GLM", "1024", "8", "--tokens-per-seq", "4"},
       "--tokens-per-seq 4: takes flat rows"},
      {{"--row-tokens", "1024"}, "--row-tokens 1024: takes a flat row named with --only"},
      {{"--only", "GLM", "1024", "1", "--row-tokens", "2048"}, "at most its CONTEXT tokens"},
      {{"--only", "GLM", "4096", "4", "--tokens-per-seq", "2", "--row-tokens", "1024"},
       "--row-tokens 1024: takes a flat row"},
      {{"--two-level", "--only", "GLM", "4096", "1", "--row-tokens", "1024"},
       "--row-tokens 1024: takes a flat row"},
      {{"--attn-pps", "8 "}, "--attn-pps takes an integer"},
      {{"--ceiling", "-1"}, "--ceiling takes a number >= 0"},
      {{"--ceiling", "nan"}, "--ceiling takes a number >= 0"},
      {{"--alpha", "inf"}, "--alpha takes a number >= 0"},
      {{"--tau", "x"}, "--tau takes a number >= 0"},
      {{"--pipeline"}, "--pipeline takes K or B1,B2"},
      {{"--pipeline", "--quick"}, "--pipeline takes K or B1,B2"},
  };
  for (const Bad& c : cases) {
    std::string cmd;
    for (const char* a : c.args) cmd += std::string(" ") + a;
    const std::string err = parse(c.args);
    EXPECT_NE(err.find(c.says), std::string::npos) << "command:" << cmd << "\n  said: " << err;
  }
}

}  // namespace

// Regression tests of issue #12's file findings, end to end: no shell (an --out name with
// shell syntax runs nothing), output folders replaced whole or not at all (--force), and a
// failed write (a file-size limit standing in for a full disk) leaves nothing behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_runner.h"

namespace fs = std::filesystem;

namespace {

class FileSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("locks_files_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  locks::test::Proc locks(const std::vector<std::string>& args, long long max_file_bytes = 0) {
    locks::test::RunOptions ro;
    ro.cwd = dir_;
    ro.max_file_bytes = max_file_bytes;
    return locks::test::run_locks(args, ro);
  }
  void make_capture(const std::string& name = "cap") {
    const auto r =
        locks({"synth", "--kind", "local_lowrank", "--out", name, "--tokens", "256", "--kv-heads",
               "1", "--q-heads", "2", "--head-dim", "32", "--steps", "2", "--obs-window", "4"});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  // Names in dir_ other than the ones given (temporary folders left behind, strays).
  std::vector<std::string> others(const std::vector<std::string>& expected) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string n = e.path().filename().string();
      if (std::find(expected.begin(), expected.end(), n) == expected.end()) out.push_back(n);
    }
    return out;
  }
  static bool gnuplot_present() {
    const char* path = std::getenv("PATH");
    std::string p = path ? path : "";
    size_t start = 0;
    while (start <= p.size()) {
      const size_t end = p.find(':', start);
      const std::string d = p.substr(start, end == std::string::npos ? end : end - start);
      if (!d.empty() && ::access((fs::path(d) / "gnuplot").c_str(), X_OK) == 0) return true;
      if (end == std::string::npos) break;
      start = end + 1;
    }
    return false;
  }

  fs::path dir_;
};

// Finding 1: `--out "x'; touch PWNED; echo '"` ran `touch` through the shell of std::system.
TEST_F(FileSafety, OutNameWithShellSyntaxRunsNothing) {
  make_capture();
  const std::string out = "x'; touch PWNED; echo '";
  const auto r = locks({"eval", "--capture", "cap", "--out", out, "--budgets", "64,128"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "PWNED")) << "the --out name was run as a shell command";
  EXPECT_TRUE(fs::exists(dir_ / out / "results.json"));
  if (gnuplot_present()) {
    EXPECT_NE(r.err.find("plots written"), std::string::npos) << r.err;
    EXPECT_GT(fs::file_size(dir_ / out / "recall_vs_budget.png"), 0u);
  }
  EXPECT_TRUE(others({"cap", out}).empty());
}

TEST_F(FileSafety, OutNameWithSpacesAndApostrophe) {
  if (!gnuplot_present()) GTEST_SKIP() << "gnuplot not on PATH";
  make_capture();
  const std::string out = "my results/it's here";
  const auto r = locks({"eval", "--capture", "cap", "--out", out, "--budgets", "64"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("plots written"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / out / "error_vs_budget.png"));
}

// Finding 4: an existing result folder is refused without --force, replaced whole with it,
// and left exactly as it was when the replacing run fails.
TEST_F(FileSafety, ExistingOutputNeedsForceAndIsReplacedWhole) {
  make_capture();
  const std::vector<std::string> eval = {"eval", "--capture", "cap", "--out",
                                         "out",  "--budgets", "64",  "--no-plots"};
  ASSERT_EQ(locks(eval).code, 0);
  std::ofstream(dir_ / "out" / "stale.txt") << "from an older run";
  const std::string before = locks::test::slurp(dir_ / "out" / "results.json");

  auto r = locks(eval);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("exists and is not empty (pass --force"), std::string::npos) << r.err;

  // A failing --force run (the capture broken meanwhile) leaves the old folder untouched.
  fs::rename(dir_ / "cap" / "layer0_v.npy", dir_ / "v.npy");
  auto with_force = eval;
  with_force.push_back("--force");
  r = locks(with_force);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("layer0_v.npy"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("wrote"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "stale.txt"));
  EXPECT_EQ(locks::test::slurp(dir_ / "out" / "results.json"), before);
  EXPECT_TRUE(others({"cap", "out", "v.npy"}).empty());

  // A successful --force run replaces the folder as a whole: the stray file is gone.
  fs::rename(dir_ / "v.npy", dir_ / "cap" / "layer0_v.npy");
  r = locks(with_force);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "stale.txt"));
  EXPECT_TRUE(fs::exists(dir_ / "out" / "table.md"));
  EXPECT_TRUE(others({"cap", "out"}).empty());
}

// An empty existing folder may be used without --force (e.g. made by a job script).
TEST_F(FileSafety, EmptyExistingOutputIsUsed) {
  make_capture();
  fs::create_directories(dir_ / "out");
  const auto r =
      locks({"eval", "--capture", "cap", "--out", "out/", "--budgets", "64", "--no-plots"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "out" / "results.csv"));
  EXPECT_TRUE(others({"cap", "out"}).empty());
}

// Finding 4: a failed write (here RLIMIT_FSIZE: write(2) fails with EFBIG, as it fails with
// ENOSPC on a full disk) is an error, and nothing is left: no 0-byte meta.json, no folder.
TEST_F(FileSafety, SynthWriteFailureLeavesNothing) {
  const auto r = locks({"synth", "--kind", "gaussian", "--out", "s", "--tokens", "1024",
                        "--kv-heads", "1", "--q-heads", "1", "--head-dim", "32"},
                       64 * 1024);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("write failed (File too large)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "s"));
  EXPECT_TRUE(others({}).empty());
}

TEST_F(FileSafety, EvalWriteFailureLeavesNothing) {
  make_capture();
  const auto r = locks(
      {"eval", "--capture", "cap", "--out", "out", "--budgets", "64", "--no-plots", "--per-query"},
      2048);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("write failed (File too large)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("wrote"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "out"));
  EXPECT_TRUE(others({"cap"}).empty());
}

}  // namespace

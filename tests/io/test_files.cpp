// The file-safety layer (locks/io/files.h): checked writes, regular files only, and result
// folders staged next to the target and renamed into place whole.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "locks/error.h"
#include "locks/io/files.h"

namespace fs = std::filesystem;
using locks::io::StagedDir;

namespace {

class Files : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("locks_files_unit_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path p(const std::string& n) const { return dir_ / n; }
  static std::string read(const fs::path& f) {
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const locks::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(Files, WriteAndReadBack) {
  locks::io::write_text_file(p("a.txt").string(), "hello\n", "test");
  EXPECT_EQ(locks::io::read_text_file(p("a.txt").string(), "test", 100), "hello\n");
  const std::string e = error_of([&] { locks::io::read_text_file(p("a.txt").string(), "t", 3); });
  EXPECT_NE(e.find("more than the limit of 3"), std::string::npos) << e;
}

TEST_F(Files, FullDiskIsAnErrorNamingTheCause) {
  const std::string e =
      error_of([] { locks::io::write_text_file("/dev/full", std::string(100, 'x'), "test"); });
  EXPECT_NE(e.find("test: /dev/full: write failed (No space left on device)"), std::string::npos)
      << e;
}

TEST_F(Files, WriteIntoADirectoryIsAnError) {
  fs::create_directories(p("table.md"));
  const std::string e =
      error_of([&] { locks::io::write_text_file(p("table.md").string(), "x", "test"); });
  EXPECT_NE(e.find("cannot open for writing (Is a directory)"), std::string::npos) << e;
}

// An OutputFile not closed (an exception on the way) removes its partial file.
TEST_F(Files, UnclosedOutputIsRemoved) {
  {
    locks::io::OutputFile f(p("partial.bin").string(), "test");
    f.write("abc", 3);
  }
  EXPECT_FALSE(fs::exists(p("partial.bin")));
}

TEST_F(Files, ReadRefusesNonRegularFiles) {
  fs::create_directories(p("d"));
  ASSERT_EQ(::mkfifo(p("f").c_str(), 0644), 0);
  EXPECT_NE(error_of([&] {
              locks::io::InputFile(p("d").string(), "t");
            }).find("not a regular file (it is a directory)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              locks::io::InputFile(p("f").string(), "t");
            }).find("not a regular file (it is a FIFO)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              locks::io::InputFile(p("none").string(), "t");
            }).find("cannot open file (No such file or directory)"),
            std::string::npos);
}

TEST_F(Files, StagedDirCommitsIntoAbsentTarget) {
  {
    StagedDir s(p("out/sub").string(), false);
    EXPECT_TRUE(fs::is_directory(s.path()));
    EXPECT_EQ(fs::path(s.path()).parent_path(), p("out"));  // beside the target: same fs
    locks::io::write_text_file((fs::path(s.path()) / "r.txt").string(), "new", "t");
    EXPECT_FALSE(fs::exists(p("out/sub")));  // nothing visible before commit
    s.commit();
  }
  EXPECT_EQ(read(p("out/sub/r.txt")), "new");
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(p("out"))) ++n;
  EXPECT_EQ(n, 1u);  // no temporary folder left
}

TEST_F(Files, StagedDirWithoutCommitLeavesTargetAsItWas) {
  fs::create_directories(p("out"));
  std::ofstream(p("out/old.txt")) << "old";
  {
    StagedDir s(p("out").string(), true);
    locks::io::write_text_file((fs::path(s.path()) / "r.txt").string(), "new", "t");
  }  // no commit: as after an error
  EXPECT_EQ(read(p("out/old.txt")), "old");
  EXPECT_FALSE(fs::exists(p("out/r.txt")));
  EXPECT_EQ(entries(), 1u);
}

TEST_F(Files, StagedDirReplacesWholeWithForce) {
  fs::create_directories(p("out"));
  std::ofstream(p("out/old.txt")) << "old";
  EXPECT_NE(StagedDir::check_target(p("out").string(), false).find("pass --force"),
            std::string::npos);
  EXPECT_THROW(StagedDir(p("out").string(), false), locks::Error);
  {
    StagedDir s(p("out").string(), true);
    locks::io::write_text_file((fs::path(s.path()) / "r.txt").string(), "new", "t");
    s.commit();
  }
  EXPECT_FALSE(fs::exists(p("out/old.txt")));
  EXPECT_EQ(read(p("out/r.txt")), "new");
  EXPECT_EQ(entries(), 1u);
}

TEST_F(Files, StagedDirRefusesWhatItCannotReplace) {
  std::ofstream(p("file")) << "x";
  fs::create_directories(p("real"));
  fs::create_symlink(p("real"), p("link"));
  EXPECT_NE(StagedDir::check_target(p("file").string(), true).find("is not a folder"),
            std::string::npos);
  EXPECT_NE(StagedDir::check_target(p("link").string(), true).find("symbolic link"),
            std::string::npos);
  EXPECT_NE(StagedDir::check_target(".", true).find("must be named"), std::string::npos);
  EXPECT_NE(StagedDir::check_target("..", true).find("must be named"), std::string::npos);
  EXPECT_NE(StagedDir::check_target("", true).find("empty"), std::string::npos);
  EXPECT_EQ(StagedDir::check_target(p("real/").string(), false), "");  // empty: usable
}

}  // namespace

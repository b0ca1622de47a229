// Captures: round trip, and every malformed or inconsistent capture is a clear locks::Error.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "locks/error.h"
#include "locks/eval/capture.h"
#include "locks/eval/harness.h"
#include "locks/npy.h"

namespace locks::eval {
namespace {

namespace fs = std::filesystem;

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("locks_eval_capture_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    m_.model = "test/model";
    m_.num_layers = 2;
    m_.layers = {0, 3};
    m_.kv_heads = 2;
    m_.q_heads = 4;
    m_.head_dim = 32;
    m_.positional_encoding = "rope";
    m_.keys = "post_rope";
    m_.tokens = 100;
    m_.steps = 3;
    m_.dtype = "float32";
    m_.extra_json = R"({"note": "kept"})";
    std::mt19937 g(1);
    std::normal_distribution<float> n;
    for (int layer : m_.layers) {
      LayerCapture c;
      c.layer = layer;
      c.k.resize(100 * 2 * 32);
      c.v.resize(c.k.size());
      c.q.resize(3 * 4 * 32);
      for (auto* v : {&c.k, &c.v, &c.q})
        for (auto& x : *v) x = n(g);
      layers_.push_back(c);
    }
    write_capture_meta(dir(), m_);
    for (const auto& c : layers_) write_capture_layer(dir(), m_, c);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // Rewrites meta.json with one field changed (or removed when value is null).
  void patch_meta(const std::string& key, const nlohmann::json& value) {
    std::ifstream in(file("meta.json"));
    nlohmann::json j = nlohmann::json::parse(in);
    in.close();
    if (value.is_null())
      j.erase(key);
    else
      j[key] = value;
    std::ofstream(file("meta.json")) << j.dump();
  }

  // Expects loading the whole capture to throw a locks::Error whose text contains `what`.
  void expect_error(const std::string& what) {
    try {
      CaptureMeta m = read_capture_meta(dir());
      for (int l : m.layers) load_capture_layer(dir(), m, l);
      FAIL() << "no error; expected one mentioning '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos)
          << "message: " << e.what() << "\nexpected to mention: " << what;
    }
  }

  fs::path dir_;
  CaptureMeta m_;
  std::vector<LayerCapture> layers_;
};

TEST_F(CaptureTest, RoundTrip) {
  CaptureMeta m = read_capture_meta(dir());
  EXPECT_EQ(m.model, "test/model");
  EXPECT_EQ(m.layers, (std::vector<int>{0, 3}));
  EXPECT_EQ(m.tokens, 100);
  EXPECT_NE(m.extra_json.find("kept"), std::string::npos);
  LayerCapture c = load_capture_layer(dir(), m, 3);
  EXPECT_EQ(c.k, layers_[1].k);
  EXPECT_EQ(c.v, layers_[1].v);
  EXPECT_EQ(c.q, layers_[1].q);
  EXPECT_TRUE(c.k_prerope.empty());
  EXPECT_EQ(c.obs_steps, 0);
}

TEST_F(CaptureTest, MissingLayerFile) {
  fs::remove(file("layer3_v.npy"));
  expect_error("layer3_v.npy");
}

TEST_F(CaptureTest, MissingFileIsReportedBeforeAnyWork) {
  fs::remove(file("layer3_q.npy"));
  CaptureMeta m = read_capture_meta(dir());
  EXPECT_THROW(check_capture_files(dir(), m), Error);
  EvalConfig cfg;
  int progress_lines = 0;
  cfg.progress = [&](const std::string&) { ++progress_lines; };
  EXPECT_THROW(run_eval(dir(), cfg), Error);
  EXPECT_EQ(progress_lines, 0);  // failed before loading layer 0
}

TEST_F(CaptureTest, LayerNotListed) {
  CaptureMeta m = read_capture_meta(dir());
  EXPECT_THROW(load_capture_layer(dir(), m, 1), Error);
}

TEST_F(CaptureTest, MissingMeta) {
  fs::remove(file("meta.json"));
  expect_error("meta.json");
}

TEST_F(CaptureTest, MissingDirectory) { EXPECT_THROW(read_capture_meta(dir() + "/nope"), Error); }

TEST_F(CaptureTest, ShapeMismatchWithMeta) {
  patch_meta("tokens", 101);
  expect_error("expected [101, 2, 32]");
}

TEST_F(CaptureTest, KeysAndValuesDisagree) {
  std::vector<float> v(99 * 2 * 32, 0.0f);
  npy_save(file("layer0_v.npy"), v.data(), {99, 2, 32});
  expect_error("layer0_v.npy: shape [99, 2, 32], expected [100, 2, 32]");
}

TEST_F(CaptureTest, QueryHeadsMismatch) {
  std::vector<float> q(3 * 2 * 32, 0.0f);
  npy_save(file("layer0_q.npy"), q.data(), {3, 2, 32});
  expect_error("layer0_q.npy: shape [3, 2, 32], expected [3, 4, 32]");
}

TEST_F(CaptureTest, WrongDtypeVsMeta) {
  patch_meta("dtype", "float16");
  expect_error("dtype float32 but meta.json says \"float16\"");
}

TEST_F(CaptureTest, UnsupportedDtypeInFile) {
  // A float64 array: the npy reader refuses it with its own error.
  std::ofstream out(file("layer0_k.npy"), std::ios::binary);
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (100, 2, 32), }";
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out << header;
  std::vector<double> data(100 * 2 * 32, 0.0);
  out.write(reinterpret_cast<const char*>(data.data()), data.size() * 8);
  out.close();
  expect_error("layer0_k.npy");
}

TEST_F(CaptureTest, TruncatedFile) {
  const auto size = fs::file_size(file("layer3_k.npy"));
  fs::resize_file(file("layer3_k.npy"), size - 100);
  expect_error("layer3_k.npy");
}

TEST_F(CaptureTest, NonFiniteValues) {
  layers_[0].k[17] = std::numeric_limits<float>::quiet_NaN();
  write_capture_layer(dir(), m_, layers_[0]);
  expect_error("non-finite");
}

TEST_F(CaptureTest, MetaFieldErrors) {
  patch_meta("num_layers", 3);
  expect_error("layers lists 2 entries but num_layers is 3");
  patch_meta("num_layers", 2);
  patch_meta("keys", "rotated");
  expect_error("keys must be \"pre_rope\" or \"post_rope\"");
  patch_meta("keys", "post_rope");
  patch_meta("q_heads", 3);
  expect_error("q_heads must be a positive multiple of kv_heads");
  patch_meta("q_heads", 4);
  patch_meta("head_dim", 47);
  expect_error("head_dim must be even and in [8, 512], got 47");
  patch_meta("head_dim", 514);
  expect_error("head_dim must be even and in [8, 512], got 514");
  patch_meta("head_dim", 32);
  patch_meta("steps", nullptr);
  expect_error("missing field \"steps\"");
  patch_meta("steps", "three");
  expect_error("field \"steps\" must be an integer");
  patch_meta("steps", 3);
  patch_meta("layers", {0, 0});
  expect_error("layer 0 listed twice");
}

// Issue #12: an unknown field nested ~50,000 deep crashed the reader (recursive copy/dump).
// Nesting is bounded: 64 levels inside the top-level object pass, 65 and 50,000 are an error.
TEST_F(CaptureTest, NestingIsBounded) {
  std::ifstream in(file("meta.json"));
  std::string base = nlohmann::json::parse(in).dump();
  in.close();
  base.pop_back();  // the closing brace
  auto nested = [&](int depth) {
    std::ofstream(file("meta.json")) << base << ",\"deep\":" << std::string(size_t(depth), '[')
                                     << std::string(size_t(depth), ']') << "}";
  };
  nested(64);
  EXPECT_NO_THROW(read_capture_meta(dir()));
  for (int depth : {65, 50000}) {
    nested(depth);
    expect_error("nested more than 64 levels deep");
    expect_error(file("meta.json"));
  }
}

// Issue #12: meta.json numbers were accepted when they wrapped or truncated.
TEST_F(CaptureTest, NumbersAreCheckedNotConverted) {
  const std::vector<std::pair<nlohmann::json, std::string>> bad_num_layers = {
      {1.9, "must be an integer, got 1.9"},
      {2.0, "must be an integer, got 2.0"},
      {true, "must be an integer, got true"},
      {"2", "must be an integer, got \"2\""},
      {4294967298ULL, "= 4294967298 is out of range [1, 1048576]"},
      {-1, "= -1 is out of range"},
      {nlohmann::json::array({2}), "must be an integer"},
  };
  for (const auto& [v, msg] : bad_num_layers) {
    patch_meta("num_layers", v);
    expect_error("field \"num_layers\" " + msg);
  }
  patch_meta("num_layers", 2);
  patch_meta("kv_heads", 4294967298ULL);  // wrapped to 2 through int before
  expect_error("field \"kv_heads\" = 4294967298 is out of range");
  patch_meta("kv_heads", 2);
  patch_meta("tokens", 1e300);
  expect_error("field \"tokens\" must be an integer");
  patch_meta("tokens", 18446744073709551615ULL);
  expect_error("field \"tokens\" = 18446744073709551615 is out of range");
  patch_meta("tokens", 100);
  patch_meta("layers", {0, 4294967299ULL});
  expect_error("layers[1] = 4294967299 is out of range");
  patch_meta("layers", {0, 3});
  EXPECT_NO_THROW(read_capture_meta(dir()));
}

TEST_F(CaptureTest, MetaJsonMustBeARegularFile) {
  fs::remove(file("meta.json"));
  fs::create_directories(file("meta.json"));
  expect_error(file("meta.json") + ": not a regular file (it is a directory)");
}

// Finite values too large for float32 scores are refused when the layer is loaded.
TEST_F(CaptureTest, HugeFiniteValuesAreRefused) {
  for (auto& x : layers_[0].q) x = 1e20f;
  for (auto& x : layers_[0].k) x = 1e20f;
  write_capture_layer(dir(), m_, layers_[0]);
  expect_error("layer 0: values too large for float32 scores");
}

TEST_F(CaptureTest, NotJson) {
  std::ofstream(file("meta.json")) << "{ \"model\": ";
  expect_error("not valid JSON");
}

TEST_F(CaptureTest, OptionalFilesAreValidated) {
  std::vector<float> pre(99 * 2 * 32, 0.0f);
  npy_save(file("layer0_k_prerope.npy"), pre.data(), {99, 2, 32});
  expect_error("layer0_k_prerope.npy");
  fs::remove(file("layer0_k_prerope.npy"));
  std::vector<float> obs(5 * 3 * 32, 0.0f);
  npy_save(file("layer0_qobs.npy"), obs.data(), {5, 3, 32});
  expect_error("layer0_qobs.npy");
}

TEST_F(CaptureTest, RunEvalEndToEnd) {
  EvalConfig cfg;
  cfg.budgets = {64, 32};
  cfg.methods = {"full", "oracle", "quest", "locks_quant", "rocket_snapkv"};
  EvalResult r = run_eval(dir(), cfg);
  ASSERT_EQ(r.table.size(), 4u * 2u);  // rocket_snapkv skipped: no qobs
  EXPECT_EQ(r.table[0].budget, 32);    // budgets sorted
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("rocket_snapkv skipped") != n.npos;
  EXPECT_TRUE(noted);
  for (const auto& a : r.table) {
    EXPECT_EQ(a.n, 2 * 3 * 4);  // layers x steps x q_heads
    if (a.method == "full") {
      EXPECT_NEAR(a.recall_min, 1.0, 1e-12);
      EXPECT_EQ(a.err_max, 0.0);
      EXPECT_DOUBLE_EQ(a.bytes_vs_full, 1.0);
    } else {
      EXPECT_LE(a.attended_mean, a.budget);
      EXPECT_GT(a.recall_min, 0.0);
      EXPECT_LT(a.recall_mean, 1.0);
    }
  }
  EXPECT_THROW(run_eval(dir(),
                        [] {
                          EvalConfig c;
                          c.methods = {"nope"};
                          return c;
                        }()),
               Error);
}

}  // namespace
}  // namespace locks::eval

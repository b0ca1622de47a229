// End-to-end tests of the `locks` binary: each test writes small .npy inputs, runs the
// built executable (LOCKS_BIN) as a separate process and checks its exit status, stdout
// (JSON parsed with nlohmann_json) and stderr messages.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "locks/npy.h"
#include "locks/synthetic.h"

namespace fs = std::filesystem;

namespace {

using locks::test::Proc;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("locks_cli_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Runs `locks ARGS` in the test's folder (argument vector, no shell).
  Proc locks(const std::vector<std::string>& args) const {
    locks::test::RunOptions ro;
    ro.cwd = dir_;
    return locks::test::run_locks(args, ro);
  }

  // Random N(0,1) float32 array saved as .npy; returns the data.
  std::vector<float> save_random(const std::string& name, const std::vector<int64_t>& shape,
                                 uint32_t seed) const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::mt19937 g(seed);
    std::normal_distribution<float> nd;  // values only need to be finite here
    std::vector<float> v(n);
    for (float& x : v) x = nd(g);
    locks::npy_save(path(name), v.data(), shape);
    return v;
  }

  // Standard inputs: K, V [tokens, kv_heads, d], q [q_heads, d].
  void save_kvq(int64_t tokens, int kv_heads, int q_heads, int d) {
    k_ = save_random("K.npy", {tokens, kv_heads, d}, 1);
    v_ = save_random("V.npy", {tokens, kv_heads, d}, 2);
    q_ = save_random("q.npy", {q_heads, d}, 3);
  }
  std::vector<std::string> kvq_args() const {
    return {"select", "--keys", path("K.npy"), "--values", path("V.npy"), "--query", path("q.npy")};
  }
  std::vector<std::string> with(std::vector<std::string> a,
                                const std::vector<std::string>& more) const {
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  fs::path dir_;
  std::vector<float> k_, v_, q_;
};

// Usage errors exit 2, data errors 1; either way stderr names the problem.
void expect_failure(const Proc& r, int code, const std::string& fragment) {
  EXPECT_EQ(r.code, code) << "stderr: " << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos)
      << "expected '" << fragment << "' in stderr: " << r.err;
}

}  // namespace

TEST_F(Cli, HelpAndDispatch) {
  for (const char* h : {"help", "--help", "-h"}) {
    const Proc r = locks({h});
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("demo"), std::string::npos);
    EXPECT_NE(r.out.find("select"), std::string::npos);
  }
  Proc r = locks({});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("usage: locks"), std::string::npos);
  expect_failure(locks({"frobnicate"}), 2, "unknown command 'frobnicate'");
  r = locks({"help", "select"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--budget"), std::string::npos);
  r = locks({"select", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--precision fp32|int4"), std::string::npos);
  r = locks({"demo", "--tokens"});
  EXPECT_EQ(r.code, 2);
}

TEST_F(Cli, SelectJsonObeysBudget) {
  const int T = 1000, H = 2, G = 2, d = 64, P = 16, b = 256;
  save_kvq(T, H, H * G, d);
  for (const char* prec : {"fp32", "int4"}) {
    const Proc r =
        locks(with(kvq_args(), {"--budget", std::to_string(b), "--precision", prec, "--json"}));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"], T);
    EXPECT_EQ(j["precision"], prec);
    ASSERT_EQ(j["kv_heads_selection"].size(), size_t(H));
    const int64_t pages = (T + P - 1) / P;
    for (const auto& s : j["kv_heads_selection"]) {
      const auto p = s["pages"].get<std::vector<int>>();
      EXPECT_LE(p.size(), size_t(b / P));
      EXPECT_EQ(p.size(), size_t(b / P));  // tokens > budget: exactly floor(b / P) pages
      EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
      EXPECT_EQ(std::adjacent_find(p.begin(), p.end()), p.end());
      EXPECT_GE(p.front(), 0);
      EXPECT_EQ(p.back(), pages - 1);  // the partial tail page is always attended
      EXPECT_LE(s["attended_tokens"].get<int>(), b);
    }
    ASSERT_EQ(j["q_heads_output"].size(), size_t(H * G));
    for (const auto& q : j["q_heads_output"]) {
      EXPECT_EQ(q["output"].size(), size_t(d));
      EXPECT_EQ(q["kv_head"], q["q_head"].get<int>() / G);
      EXPECT_GT(q["recall"].get<double>(), 0.0);
      EXPECT_LT(q["recall"].get<double>(), 1.0);
      EXPECT_LE(q["cosine_to_full"].get<double>(), 1.0 + 1e-9);
    }
    const double share = j["summary_share_of_bf16_kv"];
    EXPECT_GT(share, 0.0);
    EXPECT_LT(share, std::string(prec) == "int4" ? 0.2 : 1.0);
  }
}

// Budget >= tokens: every page, recall 1, cosine 1, and the output equals dense attention
// computed here independently in float64.
TEST_F(Cli, SelectFullBudgetIsFullAttention) {
  const int T = 200, H = 2, G = 3, d = 32;
  save_kvq(T, H, H * G, d);
  const Proc r = locks(with(kvq_args(), {"--budget", "256", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& s : j["kv_heads_selection"]) EXPECT_EQ(s["pages"].size(), size_t(13));
  for (const auto& q : j["q_heads_output"]) {
    const int hq = q["q_head"], h = hq / G;
    EXPECT_NEAR(q["cosine_to_full"].get<double>(), 1.0, 1e-9);
    EXPECT_NEAR(q["recall"].get<double>(), 1.0, 1e-9);
    std::vector<double> logit(T), out(d, 0.0);
    double mx = -INFINITY, z = 0;
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += double(q_[hq * d + i]) * k_[(t * H + h) * d + i];
      logit[t] = s / std::sqrt(double(d));
      mx = std::max(mx, logit[t]);
    }
    for (int t = 0; t < T; ++t) {
      const double w = std::exp(logit[t] - mx);
      z += w;
      for (int i = 0; i < d; ++i) out[i] += w * v_[(t * H + h) * d + i];
    }
    const auto got = q["output"].get<std::vector<double>>();
    for (int i = 0; i < d; ++i) EXPECT_NEAR(got[i], out[i] / z, 1e-5) << "q head " << hq;
  }
}

TEST_F(Cli, SelectTextSingleHeadFloat16) {
  // K [tokens, d] and q [d], written as float16 by hand (npy_save writes float32 only).
  const int T = 64, d = 32;
  auto save_f16 = [&](const std::string& name, const std::string& shape, int64_t n) {
    std::string header = "{'descr': '<f2', 'fortran_order': False, 'shape': " + shape + ", }";
    header.append(118 - header.size(), ' ');
    header += '\n';
    std::ofstream f(path(name), std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const uint16_t hl = static_cast<uint16_t>(header.size());
    f.write(reinterpret_cast<const char*>(&hl), 2);
    f << header;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = (i % 3 == 0) ? 0x3C00 : (i % 3 == 1 ? 0xB800 : 0x3400);  // 1, -.5, .25
      f.write(reinterpret_cast<const char*>(&h), 2);
    }
  };
  save_f16("K.npy", "(64, 32)", T * d);
  save_f16("q.npy", "(32,)", d);
  save_random("V.npy", {T, d}, 5);
  const Proc r = locks(with(kvq_args(), {"--budget", "32", "--rank", "4"}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("K float16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kv_head 0: 2 pages"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("q_head 0 (kv_head 0)"), std::string::npos) << r.out;
}

// On structured data the selection finds the planted pages.
TEST_F(Cli, SelectFindsPlantedPages) {
  locks::SynthConfig c;
  c.kind = locks::SynthKind::local_lowrank;
  c.tokens = 4096;
  c.head_dim = 64;
  c.num_kv_heads = 1;
  c.num_q_heads = 2;
  const locks::SynthData s = locks::synth_generate(c);
  locks::npy_save(path("K.npy"), s.keys.data(), {c.tokens, 1, c.head_dim});
  locks::npy_save(path("V.npy"), s.values.data(), {c.tokens, 1, c.head_dim});
  locks::npy_save(path("q.npy"), s.queries.data(), {2, c.head_dim});
  const Proc r = locks(with(kvq_args(), {"--budget", "128", "--precision", "int4", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto pages = j["kv_heads_selection"][0]["pages"].get<std::vector<int64_t>>();
  for (int64_t p : s.relevant_pages)
    EXPECT_TRUE(std::binary_search(pages.begin(), pages.end(), p)) << "missed page " << p;
  for (const auto& q : j["q_heads_output"]) EXPECT_GT(q["recall"].get<double>(), 0.8);
}

TEST_F(Cli, SelectSinkAndRecentPages) {
  save_kvq(512, 1, 1, 64);  // 32 full pages, no tail
  const Proc r = locks(
      with(kvq_args(), {"--budget", "64", "--sink-pages", "1", "--recent-pages", "2", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto p =
      nlohmann::json::parse(r.out)["kv_heads_selection"][0]["pages"].get<std::vector<int>>();
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], 0);
  EXPECT_EQ(p[2], 30);
  EXPECT_EQ(p[3], 31);
}

TEST_F(Cli, SelectUsageErrors) {
  save_kvq(100, 1, 1, 64);
  expect_failure(locks(with(kvq_args(), {"--foo", "1"})), 2, "unknown flag '--foo'");
  expect_failure(locks(with(kvq_args(), {"--budget"})), 2, "missing value for --budget");
  expect_failure(locks(with(kvq_args(), {"--budget", "--json"})), 2, "missing value for --budget");
  expect_failure(locks(with(kvq_args(), {"--budget", "12abc"})), 2, "expects an integer");
  expect_failure(locks(with(kvq_args(), {"--rank", "2.5"})), 2, "expects an integer");
  expect_failure(locks(with(kvq_args(), {"--budget", "99999999999999999999"})), 2, "out of range");
  expect_failure(locks(with(kvq_args(), {"--budget", "-16"})), 2, "--budget must be in");
  expect_failure(locks(with(kvq_args(), {"--precision", "int2"})), 2, "--precision must be");
  expect_failure(locks(with(kvq_args(), {"--rank", "16"})), 2, "must be smaller than --page-size");
  expect_failure(locks(with(kvq_args(), {"--page-size", "1"})), 2, "--page-size must be in");
  expect_failure(locks(with(kvq_args(), {"--budget", "8"})), 2, "budget too small");
  expect_failure(
      locks(with(kvq_args(), {"--budget", "32", "--sink-pages", "1", "--recent-pages", "1"})), 2,
      "budget too small");
  expect_failure(locks(with(kvq_args(), {"--json", "--json"})), 2, "given twice");
  expect_failure(locks(with(kvq_args(), {"stray"})), 2, "unexpected argument 'stray'");
  expect_failure(locks({"select", "--values", path("V.npy"), "--query", path("q.npy")}), 2,
                 "missing required flag --keys");
}

TEST_F(Cli, SelectDataErrors) {
  save_kvq(100, 2, 4, 64);
  save_random("V_bad.npy", {100, 2, 32}, 4);
  save_random("q_d32.npy", {4, 32}, 4);
  save_random("q_3h.npy", {3, 64}, 4);
  save_random("K_1d.npy", {64}, 4);
  save_random("K_empty.npy", {0, 2, 64}, 4);
  save_random("K_d47.npy", {100, 2, 47}, 4);
  save_random("q_d47.npy", {4, 47}, 4);
  auto args = [&](const std::string& k, const std::string& v, const std::string& q) {
    return std::vector<std::string>{"select", "--keys",  path(k), "--values",
                                    path(v),  "--query", path(q)};
  };
  expect_failure(locks(args("K.npy", "V_bad.npy", "q.npy")), 1, "V shape [100, 2, 32] differs");
  expect_failure(locks(args("K.npy", "V.npy", "q_d32.npy")), 1, "q head_dim 32 differs");
  expect_failure(locks(args("K.npy", "V.npy", "q_3h.npy")), 1, "not a positive multiple");
  expect_failure(locks(args("K_1d.npy", "K_1d.npy", "q.npy")), 1, "must be [tokens, head_dim]");
  expect_failure(locks(args("K_empty.npy", "K_empty.npy", "q.npy")), 1, "0 tokens");
  expect_failure(locks(args("K_d47.npy", "K_d47.npy", "q_d47.npy")), 1,
                 "head_dim 47 is not supported");
  expect_failure(locks(args("nope.npy", "V.npy", "q.npy")), 1, "cannot open");
  std::ofstream(path("junk.npy")) << "this is not an npy file";
  expect_failure(locks(args("K.npy", "V.npy", "junk.npy")), 1, "bad magic");

  std::vector<float> k = k_;
  k[(3 * 2 + 1) * 64 + 5] = NAN;
  locks::npy_save(path("K_nan.npy"), k.data(), {100, 2, 64});
  expect_failure(locks(args("K_nan.npy", "V.npy", "q.npy")), 1,
                 "K contains NaN at index [3, 1, 5]");
  std::vector<float> q = q_;
  q[64 + 7] = -INFINITY;
  locks::npy_save(path("q_inf.npy"), q.data(), {4, 64});
  expect_failure(locks(args("K.npy", "V.npy", "q_inf.npy")), 1, "q contains Inf at index [1, 7]");
}

// Files written by numpy itself (float32 and float16) are read correctly.
TEST_F(Cli, SelectReadsNumpyFiles) {
  const std::string script =
      "import numpy as np, sys\n"
      "r = np.random.default_rng(0)\n"
      "d = sys.argv[1]\n"
      "np.save(d + '/K.npy', r.standard_normal((300, 2, 64)).astype(np.float16))\n"
      "np.save(d + '/V.npy', r.standard_normal((300, 2, 64)).astype(np.float32))\n"
      "np.save(d + '/q.npy', r.standard_normal((2, 64)).astype(np.float16))\n";
  std::ofstream(path("gen.py")) << script;
  if (std::system(("python3 -c 'import numpy' >/dev/null 2>&1")) != 0)
    GTEST_SKIP() << "python3 with numpy not available";
  ASSERT_EQ(std::system(("python3 '" + path("gen.py") + "' '" + dir_.string() + "'").c_str()), 0);
  const Proc r = locks(with(kvq_args(), {"--budget", "512", "--json"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["input_dtype"]["keys"], "float16");
  EXPECT_EQ(j["input_dtype"]["values"], "float32");
  EXPECT_EQ(j["tokens"], 300);
  for (const auto& q : j["q_heads_output"])
    EXPECT_NEAR(q["cosine_to_full"].get<double>(), 1.0, 1e-9);
}

// And the other way: numpy reads what npy_save / npy_save_i32 write (shape, dtype, values).
TEST_F(Cli, NumpyReadsOurFiles) {
  if (std::system("python3 -c 'import numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with numpy not available";
  const std::vector<float> f = {1.5f, -2.25f, 0.0f, 3e-30f, 7.0f, -1e30f};
  const std::vector<int32_t> i = {-7, 0, 1 << 30};
  locks::npy_save(path("f.npy"), f.data(), {2, 1, 3});
  locks::npy_save_i32(path("i.npy"), i.data(), {3});
  std::ofstream(path("check.py"))
      << "import numpy as np, sys\n"
         "d = sys.argv[1]\n"
         "f = np.load(d + '/f.npy'); i = np.load(d + '/i.npy')\n"
         "assert f.dtype == np.float32 and f.shape == (2, 1, 3), (f.dtype, f.shape)\n"
         "assert (f.ravel() == np.array([1.5, -2.25, 0, 3e-30, 7, -1e30], np.float32)).all()\n"
         "assert i.dtype == np.int32 and i.shape == (3,) and list(i) == [-7, 0, 1 << 30]\n";
  EXPECT_EQ(std::system(("python3 '" + path("check.py") + "' '" + dir_.string() + "'").c_str()), 0);
}

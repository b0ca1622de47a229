// The bad-input matrix of the `locks` CLI (issue #12): one row per hostile or careless input,
// each with the exit status (2 usage, 1 data; docs/bad_input.md) and a fragment of the message
// it must print. Every row runs the real binary with a time limit, so a hang or a crash fails
// the row instead of the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "locks/npy.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Folder shared by every row: a small valid capture (head_dim 32) made once by `locks synth`.
fs::path suite_dir() {
  static const fs::path d =
      fs::temp_directory_path() / ("locks_cli_matrix_" + std::to_string(getpid()));
  return d;
}
fs::path base_capture() { return suite_dir() / "capture"; }

// What a row may prepare in its own folder (the child's working folder) before the run.
struct Files {
  fs::path dir;
  std::string p(const std::string& name) const { return (dir / name).string(); }
  void save(const std::string& name, const std::vector<int64_t>& shape, float value = 0.5f) const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n), value);
    for (size_t i = 0; i < v.size(); ++i) v[i] *= 1.0f + 0.001f * float(i % 97);
    locks::npy_save(p(name), v.data(), shape);
  }
  void kvq(int64_t tokens = 64, int d = 32) const {
    save("K.npy", {tokens, 1, d});
    save("V.npy", {tokens, 1, d});
    save("q.npy", {1, d});
  }
  void fifo(const std::string& name) const { ASSERT_EQ(::mkfifo(p(name).c_str(), 0644), 0); }
  void folder(const std::string& name) const { fs::create_directories(dir / name); }
  void text(const std::string& name, const std::string& t) const {
    std::ofstream(p(name), std::ios::binary) << t;
  }
  // A copy of the base capture as ./cap, with meta.json changed by `edit`.
  void capture(const std::function<void(json&)>& edit = {}) const {
    fs::copy(base_capture(), dir / "cap", fs::copy_options::recursive);
    if (!edit) return;
    std::ifstream in(dir / "cap" / "meta.json");
    json j = json::parse(in);
    edit(j);
    std::ofstream(dir / "cap" / "meta.json") << j.dump();
  }
  // meta.json with an unknown field nested `depth` levels deep.
  void deep_capture(int depth) const {
    capture();
    std::ifstream in(dir / "cap" / "meta.json");
    std::string t = json::parse(in).dump();
    t.pop_back();  // the closing brace
    t += ",\"deep\":" + std::string(size_t(depth), '[') + std::string(size_t(depth), ']') + "}";
    std::ofstream(dir / "cap" / "meta.json") << t;
  }
  void replace_with_fifo(const std::string& rel) const {
    fs::remove(dir / rel);
    fifo(rel);
  }
};

struct Row {
  const char* name;
  std::function<void(const Files&)> setup;
  std::vector<std::string> args;
  int code;
  const char* message;
};

const std::vector<std::string> kSelect = {"select", "--keys",  "K.npy", "--values",
                                          "V.npy",  "--query", "q.npy"};
std::vector<std::string> select_with(std::vector<std::string> more, const char* k = "K.npy") {
  std::vector<std::string> a = kSelect;
  a[2] = k;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
std::vector<std::string> eval_with(std::vector<std::string> more) {
  std::vector<std::string> a = {"eval", "--capture", "cap", "--out", "out", "--no-plots"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}
auto kvq = [](const Files& f) { f.kvq(); };
auto cap = [](const Files& f) { f.capture(); };

const std::vector<Row>& rows() {
  static const std::vector<Row> r = {
      // --- strict integers and reals: one parser for every flag of every command
      {"select_budget_leading_space", kvq, select_with({"--budget", " 64"}), 2,
       "expects an integer"},
      {"select_budget_trailing_space", kvq, select_with({"--budget", "64 "}), 2,
       "expects an integer"},
      {"select_budget_exponent", kvq, select_with({"--budget", "1e3"}), 2, "expects an integer"},
      {"select_budget_plus", kvq, select_with({"--budget", "+64"}), 2, "expects an integer"},
      {"select_budget_hex", kvq, select_with({"--budget", "0x40"}), 2, "expects an integer"},
      {"select_budget_2_pow_32", kvq, select_with({"--budget", "4294967312"}), 2,
       "--budget must be in"},
      {"select_rank_eq_page", kvq, select_with({"--rank", "16"}), 2,
       "must be smaller than --page-size"},
      {"eval_budgets_leading_space", cap, eval_with({"--budgets", " 64"}), 2, "expects an integer"},
      {"eval_budgets_exponent", cap, eval_with({"--budgets", "64,1e3"}), 2, "expects an integer"},
      {"eval_budgets_empty_item", cap, eval_with({"--budgets", "64,,128"}), 2, "comma-separated"},
      {"eval_tau_nan", cap, eval_with({"--tau", "nan"}), 2, "--tau expects a number"},
      {"eval_tau_above_1", cap, eval_with({"--tau", "1.5"}), 2, "--tau must be in [0, 1]"},
      {"eval_floor_above_budget", cap,
       eval_with({"--tau", "0.5", "--floor-pages", "200", "--budgets", "64"}), 2,
       "floor_pages must be in [0, 3]"},
      {"eval_budgets_2_pow_32", cap, eval_with({"--budgets", "4294967312"}), 2,
       "--budgets must be in"},
      {"eval_rank_eq_page", cap, eval_with({"--rank", "16"}), 2,
       "must be smaller than --page-size"},
      {"eval_budget_below_sink", cap, eval_with({"--sink", "8"}), 2, "budget too small"},
      {"eval_snapkv_keep_nan", cap, eval_with({"--snapkv-keep", "nan"}), 2, "expects a number"},
      {"eval_outlier_share_space", cap, eval_with({"--outlier-share", " 0.1"}), 2,
       "expects a number"},
      {"eval_outlier_share_range", cap, eval_with({"--outlier-share", "0.9"}), 2,
       "--outlier-share must be in"},
      {"eval_unknown_method", cap, eval_with({"--methods", "full,nope"}), 2, "--methods"},
      {"synth_tokens_exponent",
       {},
       {"synth", "--kind", "gaussian", "--out", "s", "--tokens", "1e3"},
       2,
       "expects an integer"},
      {"synth_unknown_kind", {}, {"synth", "--kind", "uniform", "--out", "s"}, 2, "--kind must be"},
      {"synth_heads_not_multiple",
       {},
       {"synth", "--kind", "gaussian", "--out", "s", "--kv-heads", "2", "--q-heads", "3"},
       2,
       "must be a multiple of --kv-heads"},
      // --- options that do not fit the data: data errors, never clamped
      {"eval_rocket_dims_above_head_dim", cap,
       eval_with({"--methods", "rocket", "--rocket-dims", "33"}), 1, "exceeds head_dim 32"},
      {"eval_basis_rank_above_head_dim", cap,
       eval_with({"--methods", "shared_proj", "--basis-rank", "33"}), 1, "exceeds head_dim 32"},
      // --- only regular files are read; none of these may hang
      {"select_keys_directory",
       [](const Files& f) {
         f.kvq();
         f.folder("D.npy");
       },
       select_with({}, "D.npy"), 1, "not a regular file (it is a directory)"},
      {"select_keys_fifo",
       [](const Files& f) {
         f.kvq();
         f.fifo("F.npy");
       },
       select_with({}, "F.npy"), 1, "not a regular file (it is a FIFO)"},
      {"select_keys_device", kvq, select_with({}, "/dev/zero"), 1,
       "not a regular file (it is a character device)"},
      {"select_keys_missing", kvq, select_with({}, "nope.npy"), 1, "cannot open file"},
      {"inspect_meta_directory",
       [](const Files& f) {
         f.capture();
         fs::remove(f.dir / "cap" / "meta.json");
         f.folder("cap/meta.json");
       },
       {"inspect", "--capture", "cap"},
       1,
       "cap/meta.json: not a regular file (it is a directory)"},
      {"inspect_meta_fifo",
       [](const Files& f) {
         f.capture();
         f.replace_with_fifo("cap/meta.json");
       },
       {"inspect", "--capture", "cap"},
       1,
       "meta.json: not a regular file (it is a FIFO)"},
      {"eval_layer_file_fifo",
       [](const Files& f) {
         f.capture();
         f.replace_with_fifo("cap/layer0_v.npy");
       },
       eval_with({}), 1, "layer0_v.npy: not a regular file (it is a FIFO)"},
      // --- .npy contents
      {"select_structured_dtype",
       [](const Files& f) {
         f.kvq();
         std::string h =
             "{'descr': [('a', '<f4'), ('b', '<f4')], 'fortran_order': False, 'shape': (64,), }";
         h.append(118 - h.size(), ' ');
         f.text("S.npy", std::string("\x93NUMPY\x01\x00", 8) + char(h.size() + 1) + '\0' + h +
                             "\n" + std::string(512, '\0'));
       },
       select_with({}, "S.npy"), 1, "unsupported dtype: a structured (record) dtype"},
      {"select_int_dtype",
       [](const Files& f) {
         f.kvq();
         std::string h = "{'descr': '<i4', 'fortran_order': False, 'shape': (64, 32), }";
         h.append(118 - h.size(), ' ');
         f.text("I.npy", std::string("\x93NUMPY\x01\x00", 8) + char(h.size() + 1) + '\0' + h +
                             "\n" + std::string(64 * 32 * 4, '\0'));
       },
       select_with({}, "I.npy"), 1, "unsupported dtype '<i4'"},
      {"select_huge_finite_inputs",
       [](const Files& f) {
         f.kvq();
         f.save("K.npy", {64, 1, 32}, 1e30f);
         f.save("q.npy", {1, 32}, 1e30f);
       },
       select_with({}), 1, "K and q: values too large for float32 scores"},
      {"eval_huge_finite_inputs",
       [](const Files& f) {
         f.capture();
         std::vector<float> q(2 * 2 * 32, 1e37f), qo(4 * 2 * 32, 1e37f);
         locks::npy_save(f.p("cap/layer0_q.npy"), q.data(), {2, 2, 32});
         locks::npy_save(f.p("cap/layer0_qobs.npy"), qo.data(), {4, 2, 32});
       },
       eval_with({}), 1, "layer 0: values too large for float32 scores"},
      {"select_nan_keys",
       [](const Files& f) {
         f.kvq();
         f.save("K.npy", {64, 1, 32}, NAN);
       },
       select_with({}), 1, "K contains NaN at index [0, 0, 0]"},
      // --- meta.json: bounded nesting, strict numbers
      {"inspect_meta_nested_50000",
       [](const Files& f) { f.deep_capture(50000); },
       {"inspect", "--capture", "cap"},
       1,
       "nested more than 64 levels deep"},
      {"eval_meta_nested_50000", [](const Files& f) { f.deep_capture(50000); }, eval_with({}), 1,
       "nested more than 64 levels deep"},
      {"meta_num_layers_float",
       [](const Files& f) { f.capture([](json& j) { j["num_layers"] = 1.9; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"num_layers\" must be an integer, got 1.9"},
      {"meta_num_layers_bool",
       [](const Files& f) { f.capture([](json& j) { j["num_layers"] = true; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"num_layers\" must be an integer, got true"},
      {"meta_kv_heads_2_pow_32_plus_1",
       [](const Files& f) { f.capture([](json& j) { j["kv_heads"] = 4294967297ULL; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"kv_heads\" = 4294967297 is out of range"},
      {"meta_head_dim_wraps_to_32",
       [](const Files& f) { f.capture([](json& j) { j["head_dim"] = 4294967328ULL; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"head_dim\" = 4294967328 is out of range"},
      {"meta_tokens_1e300",
       [](const Files& f) { f.capture([](json& j) { j["tokens"] = 1e300; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"tokens\" must be an integer"},
      {"meta_tokens_negative",
       [](const Files& f) { f.capture([](json& j) { j["tokens"] = -5; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"tokens\" = -5 is out of range"},
      {"meta_layer_index_float",
       [](const Files& f) { f.capture([](json& j) { j["layers"] = json::array({0.5}); }); },
       {"inspect", "--capture", "cap"},
       1,
       "layers[0] must be an integer"},
      {"meta_model_number",
       [](const Files& f) { f.capture([](json& j) { j["model"] = 3; }); },
       {"inspect", "--capture", "cap"},
       1,
       "field \"model\" must be a string"},
      // --- output folders: never overwritten silently
      {"eval_out_not_empty",
       [](const Files& f) {
         f.capture();
         f.folder("out");
         f.text("out/old.txt", "x");
       },
       eval_with({}), 2, "exists and is not empty (pass --force"},
      {"eval_out_is_file",
       [](const Files& f) {
         f.capture();
         f.text("out", "x");
       },
       eval_with({}), 2, "exists and is not a folder"},
      {"eval_out_dot",
       cap,
       {"eval", "--capture", "cap", "--out", ".", "--force"},
       2,
       "must be named"},
      {"synth_out_not_empty",
       [](const Files& f) {
         f.folder("s");
         f.text("s/old.txt", "x");
       },
       {"synth", "--kind", "gaussian", "--out", "s", "--tokens", "64"},
       2,
       "exists and is not empty"},
  };
  return r;
}

class BadInput : public ::testing::TestWithParam<size_t> {
 public:
  static void SetUpTestSuite() {
    fs::remove_all(suite_dir());
    fs::create_directories(suite_dir());
    locks::test::RunOptions ro;
    ro.cwd = suite_dir();
    const locks::test::Proc r = locks::test::run_locks(
        {"synth", "--kind", "local_lowrank", "--out", base_capture().string(), "--tokens", "256",
         "--kv-heads", "1", "--q-heads", "2", "--head-dim", "32", "--steps", "2", "--obs-window",
         "4"},
        ro);
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() { fs::remove_all(suite_dir()); }
};

TEST_P(BadInput, ExitCodeAndMessage) {
  const Row& row = rows()[GetParam()];
  Files f{suite_dir() / row.name};
  fs::remove_all(f.dir);
  fs::create_directories(f.dir);
  if (row.setup) row.setup(f);
  const bool had_out = fs::exists(f.dir / "out");
  locks::test::RunOptions ro;
  ro.cwd = f.dir;
  ro.timeout_s = 60;
  const locks::test::Proc r = locks::test::run_locks(row.args, ro);
  EXPECT_NE(r.code, -2) << "timed out (a hang)";
  EXPECT_EQ(r.code, row.code) << "stderr: " << r.err;
  EXPECT_NE(r.err.find(row.message), std::string::npos)
      << "expected '" << row.message << "' in stderr: " << r.err;
  EXPECT_EQ(r.err.find("9223372036854775807"), std::string::npos) << r.err;
  // A refused run writes nothing: no output folder appears and no temporary one is left.
  for (const auto& e : fs::directory_iterator(f.dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  if (!had_out) EXPECT_FALSE(fs::exists(f.dir / "out")) << "a failed run left an output folder";
  fs::remove_all(f.dir);
}

INSTANTIATE_TEST_SUITE_P(Matrix, BadInput, ::testing::Range(size_t(0), rows().size()),
                         [](const ::testing::TestParamInfo<size_t>& i) {
                           return std::string(rows()[i.param].name);
                         });

}  // namespace
